"""gpuagent: a systemd-native host agent for machines with NVIDIA GPUs."""

__version__ = "0.1.0"
