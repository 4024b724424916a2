"""The Joint Orchestrator: MEG × steps × micro-batches compiled into one task graph."""
