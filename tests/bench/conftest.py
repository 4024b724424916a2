"""The benchmarks' small runs share the suite's Dask cluster and long-tail model
(`cluster`, `longtail_model` in tests/conftest.py): the benchmarks that run every arm on one
default cluster take its address (`--scheduler`)."""
