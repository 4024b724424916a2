"""The Dask cluster a run uses: start or join it, its workers, the lease, reachability."""
