"""A board's wear across boots: its counters recorded once a boot, and their trend."""
