"""NVIDIA's systemd units (persistenced, fabric manager, IMEX) and the persistence mode."""
