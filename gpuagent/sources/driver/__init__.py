"""The NVIDIA driver: the module's state, its records, probe hangs."""
