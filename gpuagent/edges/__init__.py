"""Shared I/O at the agent's edges: running children, files it trusts, the boot id."""
