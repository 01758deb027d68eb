"""vGPU guests: the licence of each GPU, from ``nvidia-smi -q``."""
