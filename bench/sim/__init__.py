"""The cluster simulator: the pipeline's own task graph on simulated workers.

`flows.orchestrator.pipeline.Pipeline` drives a discrete-event executor (`executor.SimExecutor`)
whose task bodies are a cost model (`costs`: fitted on this machine; `physics`: the paper's
accelerators from bandwidths and FLOPs, per system `Schedule`; constants in `calibration`);
`replay.simulate` runs one arm, `validate` checks it against `bench/e2e.py`'s measured arms,
`paper_setting` and `paper_table` predict the paper's published numbers at its work,
`scenarios` and `paper` run the scaling study, `plots` draws its curves, `cli` is
`python -m bench.sim`. See docs/simulator.md.
"""
