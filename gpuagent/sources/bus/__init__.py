"""The PCI bus: the scan, addresses, the GPUs this host had, and the bus's rules."""
