"""Who is on the GPUs: compute processes, their names and systemd units."""
