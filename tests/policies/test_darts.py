"""`darts`: each group launches more responses than its `n` and keeps the first `n` to end,
under a `KeepFirst` watch whose groups are the prompts' (the engines' stopping is tested in
tests/engines/rollout/test_watch.py, the keeping in tests/tasks/test_watch.py)."""

from __future__ import annotations

from meg.policies import DartsRollout
from policies.base import NodeRequests
from policies.darts import Darts, KeepFirst
from workloads.datasets import TaskItem

TASKS = [TaskItem("t0", "1+1", "2"), TaskItem("t1", "2+2", "4")]


def test_darts_launches_over_sample_more_per_group() -> None:
    darts = Darts(DartsRollout(policy="darts"))
    assert [darts.samples(n) for n in (1, 2, 4, 8)] == [2, 3, 6, 12]
    assert Darts(DartsRollout(policy="darts", over_sample=1.0)).samples(3) == 6


def test_darts_watches_every_node_with_its_groups() -> None:
    chosen = Darts(DartsRollout(policy="darts")).watch(NodeRequests(4, TASKS, None, str))
    assert chosen is not None
    watch, launched = chosen
    assert launched == 6 and isinstance(watch, KeepFirst) and watch.keep == 4
    assert list(watch.groups) == [0] * 6 + [1] * 6  # request p·launched + s: prompt p
    for i in range(4):  # four of prompt 0 end: its others stop, prompt 1's run on
        watch.finish(i)
    assert watch.stop(5, [1]) and not watch.stop(6, [1])


def test_keep_first_stops_a_group_once_it_has_enough() -> None:
    w = KeepFirst([0, 0, 0, 1, 1, 1], keep=2)
    w.finish(0)
    assert not w.stop(1, [5])
    w.finish(2)
    assert w.stop(1, [5]) and not w.stop(3, [5])  # group 0 is full, group 1 is not
