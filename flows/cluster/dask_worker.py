"""`dask worker` as `flexmarl worker` starts it: Dask's own command line, run after
`flows.cluster.start.keep_malloc_defaults`, so that the worker processes its nanny spawns keep
glibc's malloc defaults, as a local cluster's do (Dask's `MALLOC_TRIM_THRESHOLD_` made
torch's CPU training about half as fast; docs/peers.md). A threshold set in the environment
still reaches the workers."""

from __future__ import annotations

from distributed.cli.dask_worker import main

from flows.cluster.start import keep_malloc_defaults

if __name__ == "__main__":
    keep_malloc_defaults()
    main()
