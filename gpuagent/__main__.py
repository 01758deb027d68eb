"""``python3 -m gpuagent``."""

from .cli import main

main()
