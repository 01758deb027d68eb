"""The ``gpuagent`` commands: the CLI and what each command reads and prints."""
