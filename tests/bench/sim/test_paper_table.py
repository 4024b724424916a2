"""The paper's setting and table: workloads at the paper's work, every published number a
row, fitted rows kept out of the error, the error a geometric mean of the unfitted ratios."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from bench.sim.cli import main
from bench.sim.paper_setting import (
    BASE,
    GROUP,
    MAX_RESPONSE,
    QUERIES,
    SYSTEMS,
    capped_mean,
    category_assistant,
    median_for,
    merchant_assistant,
    routed_groups,
)
from bench.sim.paper_table import LABELS, PAPER_STEP_S, RATIOS, geo_error
from bench.sim.scenarios import BIG, SMALL


def test_routed_groups_add_up_to_the_query_group_and_follow_the_shares() -> None:
    assert routed_groups(BASE.shares) == [9, 4, 3]
    assert sum(routed_groups((0.5, 0.5))) == GROUP
    assert routed_groups((1 / 3, 1 / 3, 1 / 3)) == [6, 5, 5]


def test_the_median_gives_the_tokens_per_step_it_was_set_from() -> None:
    responses = QUERIES * 2 * GROUP
    med = median_for(BASE.tokens_per_step, responses)
    assert capped_mean(med, BASE.sigma, MAX_RESPONSE) * responses == pytest.approx(
        BASE.tokens_per_step, rel=1e-6
    )
    draws = np.minimum(
        np.random.default_rng(0).lognormal(math.log(med), BASE.sigma, 400_000), MAX_RESPONSE
    )
    assert draws.mean() == pytest.approx(capped_mean(med, BASE.sigma, MAX_RESPONSE), rel=0.01)


def test_the_paper_workloads_validate_with_their_models() -> None:
    ma, ca = merchant_assistant(), category_assistant()
    assert {a.model for a in ma.spec.agents.values()} == {SMALL} and len(ma.spec.agents) == 4
    assert ca.spec.agents["master"].model == BIG and len(ca.spec.agents) == 3
    assert ma.episodes == QUERIES and ma.micro_batches == QUERIES
    assert ma.spec.nodes["master"].n == GROUP
    assert ma.spec.nodes["analysis"].inputs == {"master": "best"}


def test_geo_error_is_the_geometric_mean_of_the_ratio_errors() -> None:
    assert geo_error([(2.0, 1.0), (1.0, 2.0)]) == pytest.approx(1.0)
    assert geo_error([(1.1, 1.0)]) == pytest.approx(0.1)
    assert geo_error([(1.0, 1.0)] * 3) == 0


def test_every_paper_system_has_an_arm() -> None:
    for paper in PAPER_STEP_S.values():
        for name in paper:
            assert name in SYSTEMS or any(s.startswith(name) for s in SYSTEMS)
    for num, den in RATIOS.values():
        assert num in SYSTEMS and den in SYSTEMS


def test_paper_flag_writes_the_table_and_the_error(tmp_path: Path) -> None:
    out = tmp_path / "paper.json"
    main(["--paper", "--small", "--json", str(out)])
    res = json.loads(out.read_text())
    rows = {r["item"]: r for r in res["paper_table"]}
    for wl, paper in PAPER_STEP_S.items():
        assert rows[f"{wl} step s, flexmarl"]["paper"] == paper["flexmarl"]
        assert rows[f"{wl} step s, marti"]["paper"] == paper["marti"]
        for key in RATIOS:
            assert not rows[f"{wl} FlexMARL {LABELS[key]}"]["fitted"]
            assert rows[f"{wl} FlexMARL {LABELS[key]}"]["predicted"] == res["ratios"][wl][key]
    assert all(r["fitted"] for k, r in rows.items() if "tok/s" in k)
    assert rows["32B training-state swap s (out + in)"]["paper"] == 11.0
    # the error is recomputed from the counted rows: the fitted ones do not enter it
    counted = [(r["predicted"], r["paper"]) for r in res["paper_table"] if r["note"] == "counted"]
    assert len(counted) == res["paper_ratio_checks"] == 6
    assert res["paper_ratio_error"] == pytest.approx(geo_error(counted), abs=2e-3)
    for wl in PAPER_STEP_S:
        assert rows[f"{wl} step s, flexmarl"]["predicted"] > 0
        lo, hi = res["masrl_range"][wl]
        assert 1 <= lo <= hi
