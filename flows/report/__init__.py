"""What a run reports: summary metrics, plots, Prefect artifacts, progress, weights."""
