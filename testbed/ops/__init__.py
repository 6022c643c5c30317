"""Lab operations on a run's folder after it: check, heal, replay."""
