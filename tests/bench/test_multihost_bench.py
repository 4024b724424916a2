"""The multi-host benchmark's byte counting (the benchmark itself needs root and several
minutes: its numbers are in docs/benchmarks.md; the harness is tested in tests/cluster).

Its headline, `step_time_ratio_multi_vs_single` (0.942x and 0.877x), is wall clock of
namespace hosts sharing one machine's 2 cores, and the benchmark does not run here: no
direction is asserted. `same_rewards`, the part that is not a timing, is what the fanout
and math-chain runs of tests/cluster check step for step."""

from __future__ import annotations

from bench.multihost import ARMS, net_dev

NET_DEV = """Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    1200      10    0    0    0     0          0         0     1200      10    0    0    0     0       0          0
fxv12340p: 987654    321    0    0    0     0          0         0   123456     210    0    0    0     0       0          0
"""


def test_net_dev_reads_received_and_sent_bytes() -> None:
    assert net_dev(NET_DEV) == {"lo": (1200, 1200), "fxv12340p": (987654, 123456)}


def test_the_arms_split_the_roles_both_ways() -> None:
    roles = {arm: sorted(r for _, r in workers) for arm, workers in ARMS.items()}
    assert roles == {
        "multi_1r2t": ["rollout", "train", "train"],
        "multi_2r1t": ["rollout", "rollout", "train"],
    }
