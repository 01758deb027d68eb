"""NVLink: ``nvidia-smi nvlink`` read, parsed and judged; the links up at boot."""
