"""``python3 -m gpuagent``."""

from gpuagent.commands.entry import main

main()
