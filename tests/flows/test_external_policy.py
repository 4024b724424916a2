"""External-policy rollouts in real runs (flex and async, a real cluster and Prefect server,
the `hf` backend): the counter's groups take a row from a frozen model (the tiny model before
its warm start on the format: an earlier checkpoint, with the same tokenizer), the checker's
a row from its teammate the counter's newest policy. The store says who sampled each row and counts none as a version of the
learner, the audit is clean, and every step trained the external rows under the shaped
correction the run's settings gave (the MEG names no anchor)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from bench.common import teacher_forced_logprobs
from storage.audit import audit_consistency
from storage.schema import EXTERNAL_VERSION, SampleBatch
from storage.store import MEGStore
from tests.flows.test_policies import policy_config, run

pytestmark = pytest.mark.slow


def gap(model_dir: str, rows: SampleBatch) -> float:
    """The largest gap, over every row, between a stored logprob and the one the model in
    `model_dir` gives that token under teacher forcing."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    assert len(rows) and rows.response_lengths.min() > 0
    return max(
        float(
            np.abs(
                rows.logprob(i)
                - teacher_forced_logprobs(
                    model, rows.prompt(i).tolist(), rows.response(i).tolist()
                ).numpy()
            ).max()
        )
        for i in range(len(rows))
    )


def external(model: str) -> dict:
    return {
        "policy": "external",
        "sources": {"counter": {"model": model, "rows": 1}, "checker": {"agent": "counter"}},
    }


@pytest.mark.parametrize("mode", ["flex", "async"])
def test_external_rows_are_sourced_never_versioned_and_corrected(
    tmp_path: Path, longtail_model: str, tiny_model: str, cluster: str, mode: str
) -> None:
    cfg = policy_config(
        tmp_path, longtail_model, "longtail", backend="hf", rollout=external(tiny_model)
    )
    out = run(cfg, tmp_path / "run", cluster, mode)
    assert out["steps"] == 4 and out["consistency"]["violations"] == 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert (audit.violations, audit.accounting_errors, audit.steps_unverified) == (0, 0, 0)
    sources = json.loads((tmp_path / "run" / "run.json").read_text())["sources"]
    assert sources["agents.counter.loss.old_logprobs"] == "policy"
    assert sources["agents.checker.loss.old_logprobs"] == "policy"

    counter = store.table("counter").read()
    ext = counter.take(counter.external)
    # one row of each group of n = 4, the group's last, from the frozen model
    assert len(ext) * 4 == len(counter) and len(np.unique(ext.group_id)) == len(ext)
    assert set(ext.source) == {f"model:{tiny_model}"}
    assert all(s.endswith("/3") for s in ext.sample_id)
    assert (ext.policy_version == EXTERNAL_VERSION).all()
    assert (ext.token_versions == EXTERNAL_VERSION).all()
    # the stored logprobs are the frozen model's own at every step, not the learner's
    assert gap(tiny_model, ext) < 1e-4 < 1e-3 < gap(longtail_model, ext)
    own = counter.take(~counter.external)
    assert (own.policy_version >= 0).all() and own.policy_version.max() >= 2
    assert gap(longtail_model, own.take(own.policy_version == 0)) < 1e-4

    checker = store.table("checker").read()
    mates = checker.source[checker.external]
    assert len(mates) * 2 == len(checker)  # one of each group of n = 2
    versions = [int(re.fullmatch(r"agent:counter@v(\d+)", s).group(1)) for s in mates]
    assert max(versions) >= 1  # the teammate's policy as it trains, not its first version
    assert audit.external_rows == len(ext) + len(mates) == out["consistency"]["external_rows"]
    for agent in ("counter", "checker"):
        for rec in store.table(agent).consumption_log().values():
            assert EXTERNAL_VERSION not in rec["versions"]
            frac = rec["extra"]["metrics"]["external_frac"]
            assert 0 < frac < 1
