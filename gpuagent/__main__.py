"""``python3 -m gpuagent``."""

from gpuagent.commands.cli import main

main()
