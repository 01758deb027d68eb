"""The IMEX domain (multi-node NVLink): its readiness, read with NVIDIA's nvidia-imex-ctl."""
