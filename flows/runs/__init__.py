"""A run's settings and record: read a MEG, resolve the overrides once, run.json, resume."""
