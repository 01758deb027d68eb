"""The board in each slot: its serial, read beside the probe, and when it is replaced."""
