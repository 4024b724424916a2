"""Prefect flows (train, evaluate) and what drives them: runs, orchestrator, cluster, cli."""
