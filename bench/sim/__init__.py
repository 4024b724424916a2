"""The cluster simulator: the pipeline's own task graph on simulated workers.

`flows.orchestrator.pipeline.Pipeline` drives a discrete-event executor (`executor.SimExecutor`)
whose task bodies are a cost model (`costs`, constants in `calibration`); `replay.simulate` runs
one arm, `validate` checks it against `bench/e2e.py`'s measured arms, `scenarios` and `paper`
build the paper's setting, `plots` draws the scaling curves, `cli` is `python -m bench.sim`. See
docs/simulator.md.
"""
