"""The PCIe path of each GPU: the kernel's AER counters and records, up to the root port."""
