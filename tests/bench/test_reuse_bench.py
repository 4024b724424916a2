"""`bench.reuse`'s growth arithmetic (the cluster test itself, 10 runs, is
tests/flows/test_cluster_reuse.py)."""

from __future__ import annotations

import pytest

from bench.reuse import growth


def test_one_config_grows_from_run_three_to_the_last() -> None:
    rss = [{"w": v} for v in (50, 90, 100, 101, 110)]
    assert growth(rss) == {"w": pytest.approx(0.10)}


def test_configs_in_turn_are_compared_each_with_its_own_runs() -> None:
    # a worker holding config b's engines is twice the size: no growth in either config
    flat = [{"w": 100 if i % 2 == 0 else 200} for i in range(8)]
    assert growth(flat, configs=2) == {"w": 0.0}
    assert growth(flat) == {"w": 1.0}  # run 3 (a) against run 8 (b): the configs, not growth
    # config a grows 5% from its run 3 to its run 7; b from its run 4 to its run 8 by 2%
    rss = [{"w": v} for v in (100, 200, 100, 200, 102, 202, 105, 204)]
    assert growth(rss, configs=2) == {"w": pytest.approx(0.05)}


def test_a_process_seen_in_only_one_sample_is_left_out() -> None:
    rss = [{"w": 10, "d": 5}, {"w": 10}, {"w": 10, "d": 6}, {"w": 11, "d": 6}]
    assert set(growth(rss)) == {"w", "d"}
    assert growth([{"w": 10}, {"w": 10}, {"w": 10}, {"w": 11, "d": 6}]) == {"w": 0.1}
