"""systemd over the system bus: the connection, units, signals, unit names and state."""
