"""Agentic episodes end to end: a bounded loop (solve → calculator tool → check, up to 3
rounds) on a real cluster, in every mode, a SIGKILL mid-loop resumed, and the token ids a
trainer reads equal the ones sampled over three turns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from flows.cluster.start import ClusterConfig
from flows.train import TrainParams, train
from storage.audit import audit_consistency
from storage.schema import SKIPPED, TOOL, TOOL_STOP, SampleBatch
from storage.store import MEGStore
from tests.flows.conftest import kill_cli_train_when, run_store
from workloads.datasets import TaskItem
from workloads.rewards import EpisodeView, SampleView
from workloads.tools import calculator

pytestmark = pytest.mark.slow

ROUNDS = 3
ALWAYS, NEVER = "", "(?!)"  # regexes that match every text, and none


def loop_meg(tmp: Path, model: str, stop: str, **run: Any) -> Path:
    """solve (n=2) → calc (tool) → check; round r > 1 re-solves with the calculator's
    answer, unless round r-1's check matched the regex `stop`."""
    data = {
        "name": "calc-loop",
        "agents": {
            "solver": {"model": model, "backend": "hf", "sampling": {"max_tokens": 4}},
            "checker": {
                "model": model,
                "backend": "hf",
                "sampling": {"max_tokens": 2},
                "loss": {"credit": "crbc"},
            },
        },
        "loops": {
            "retry": {
                "rounds": ROUNDS,
                "body": {
                    "solve": {"agent": "solver", "template": "Q: {question}=\nA:", "n": 2},
                    "calc": {"tool": {"fn": "calculator"}, "inputs": {"solve": "per_sample"}},
                    "check": {
                        "agent": "checker",
                        "template": "Q: {question}=\nA:{solve}{calc}\nOK?",
                        "inputs": {"calc": "per_sample", "solve": "first"},
                    },
                },
                "again": {
                    "solve": {
                        "template": "Q: {question}=\nA:{solve}{calc}\nA:",
                        "n": 1,
                        "inputs": {"check": "per_sample", "solve": "first", "calc": "first"},
                    }
                },
                "until": [{"node": "check", "fn": "matches", "params": {"pattern": stop}}],
            }
        },
        "rewards": {
            "solve": {"fn": "exact_answer"},
            "check": {"fn": "verdict", "params": {"target": "solve"}},
        },
        "dataset": {
            "generator": "arithmetic",
            "params": {"max_operand": 9},
            "train_size": 64,
            "eval_size": 8,
        },
        "run": {"steps": 2, "episodes_per_step": 2, "micro_batches": 1, **run},
    }
    path = tmp / "calc_loop.yaml"
    tmp.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def run(cfg: Path, tmp: Path, cluster: str) -> tuple[dict[str, Any], MEGStore]:
    out = train(
        TrainParams(
            config=str(cfg),
            run_dir=str(tmp / "run"),
            cluster=ClusterConfig(scheduler=cluster),
            export_final=False,
        )
    )
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert out["steps"] == 2 and audit.violations == 0 and audit.accounting_errors == 0
    return out, store


def by_id(batch: SampleBatch) -> dict[str, int]:
    return {str(s): i for i, s in enumerate(batch.sample_id)}


def decoded(model: str) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    return tok, lambda ids: tok.decode(list(ids), skip_special_tokens=True)


@pytest.mark.parametrize("mode", ["sync", "flex", "async"])
def test_a_loop_runs_a_round_only_where_the_check_did_not_stop_it(
    mode: str, tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """Whatever the untrained model says: round r > 1 ran exactly where round r-1's check
    did not match, everything under a skipped invocation is skipped, the calculator's rows
    are its answer to the solve it read, and skipped rows are neither scored nor trained."""
    cfg = loop_meg(tmp_path, tiny_model, "[a-m]", mode=mode)
    _, store = run(cfg, tmp_path, cluster)
    _, text = decoded(tiny_model)
    solver, checker = store.table("solver").read(), store.table("checker").read()
    rows = SampleBatch.concat([solver, checker])
    at = by_id(rows)
    # the structure: 2 steps × 2 episodes × 2 threads per node, whatever was skipped
    for r in range(1, ROUNDS + 1):
        for node in (f"solve@{r}", f"calc@{r}", f"check@{r}"):
            assert int((rows.node == node).sum()) == 2 * 2 * 2
    taken = {n: 0 for n in ("ran", "skipped")}
    for i in np.flatnonzero(np.char.startswith(rows.node.astype(str), "solve@")):
        r = int(str(rows.node[i]).split("@")[1])
        if r == 1:
            assert rows.finish_reason[i] != SKIPPED
            continue
        check = next(p for p in str(rows.parent_ids[i]).split(",") if "/check@" in p)
        j = at[check]
        stop = rows.finish_reason[j] == SKIPPED or any(
            c in "abcdefghijklm" for c in text(rows.response(j))
        )
        assert (rows.finish_reason[i] == SKIPPED) == stop, rows.sample_id[i]
        taken["skipped" if stop else "ran"] += 1
    task = TaskItem("t", "3+4", "7")
    for i in np.flatnonzero(np.char.startswith(rows.node.astype(str), "calc@")):
        solve = at[str(rows.parent_ids[i])]
        if rows.finish_reason[solve] == SKIPPED:
            assert rows.finish_reason[i] == SKIPPED
            continue
        view = SampleView("s", "solve", text(rows.response(solve)), ())
        want = calculator(view, EpisodeView({}), task)
        assert text(rows.response(i)) == want.text
        assert rows.finish_reason[i] in (TOOL, TOOL_STOP)
    gone = rows.finish_reason == SKIPPED
    assert np.isnan(rows.reward[gone]).all() and (rows.advantage[gone] == 0).all()
    assert set(rows.score_status[gone].tolist()) <= {SKIPPED}
    assert (
        not rows.trained[gone].any()
        and not rows.trained[np.isin(rows.finish_reason, [TOOL, TOOL_STOP])].any()
    )
    assert sum(taken.values()) == 2 * 2 * 2 * (ROUNDS - 1)


def test_a_check_that_always_stops_skips_every_later_round(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    _, store = run(loop_meg(tmp_path, tiny_model, ALWAYS), tmp_path, cluster)
    solver = store.table("solver").read()
    later = ~np.isin(solver.node, ["solve@1", "calc@1"])
    assert (solver.finish_reason[later] == SKIPPED).all()
    assert not (solver.finish_reason[~later] == SKIPPED).any()
    # the solver still trained on its first turns: rows consumed, and only those
    log = store.table("solver").consumption_log()
    assert sorted(log) == [0, 1]
    assert sum(r["extra"]["rows"] for r in log.values()) == 2 * 2 * 2


def test_three_turns_train_on_the_token_ids_they_sampled(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """No round trip through text: each turn's prompt holds the previous turn's response
    and the tool's observation as the exact ids stored, the trainer's rows are the sampled
    ids, and the tokenizer is one where decode → encode changes ids (it merges pieces)."""
    from flows.runs.record import load_run
    from tasks.accounting import read_scored

    out, store = run(loop_meg(tmp_path, tiny_model, NEVER), tmp_path, cluster)
    tok, text = decoded(tiny_model)
    solver = store.table("solver").read()
    at = by_id(solver)
    assert not (solver.finish_reason == SKIPPED).any()

    def contains(prompt: np.ndarray, ids: np.ndarray) -> bool:
        ids = ids[:-1] if len(ids) and ids[-1] == tok.eos_token_id else ids
        return any(
            np.array_equal(prompt[k : k + len(ids)], ids) for k in range(len(prompt) - len(ids) + 1)
        )

    for r in (2, 3):
        for i in np.flatnonzero(solver.node == f"solve@{r}"):
            parents = str(solver.parent_ids[i]).split(",")
            prev = next(p for p in parents if f"/solve@{r - 1}/" in p)
            calc = next(p for p in parents if f"/calc@{r - 1}/" in p)
            prompt = solver.prompt(i)
            assert contains(prompt, solver.response(at[prev])), solver.sample_id[i]
            assert contains(prompt, solver.response(at[calc])), solver.sample_id[i]
    sampled = [solver.response(i).tolist() for i in np.flatnonzero(solver.trained)]
    changed = [r for r in sampled if tok.encode(text(r), add_special_tokens=False) != r]
    assert changed, "every sampled response survived decode → encode: the test proves nothing"
    ctx = load_run(tmp_path / "run").ctx
    for step in (0, 1):
        trained, _ = read_scored(ctx, "solver", step, 0)
        for i in range(len(trained)):
            j = at[str(trained.sample_id[i])]
            assert np.array_equal(trained.response(i), solver.response(j))
            assert np.array_equal(trained.prompt(i), solver.prompt(j))
        # three turns of each thread trained: 2 episodes × 2 threads × 3 rounds
        assert len(trained) == 2 * 2 * ROUNDS
        assert set(trained.finish_reason.tolist()) <= {"stop", "length"}
    assert out["consistency"]["violations"] == 0


def test_sigkill_mid_loop_resumes_with_a_clean_audit(
    tmp_path: Path, tiny_model: str, prefect_server: str, cluster: str
) -> None:
    steps = 6  # the kill lands after step 1's round 2, with steps left whatever the poll
    cfg = loop_meg(tmp_path, tiny_model, NEVER, steps=steps, episodes_per_step=2, mode="flex")
    run_dir = tmp_path / "run"

    def mid_loop() -> bool:  # a state that persists: step 1's round 2 is committed
        store = run_store(run_dir)
        if store is None or "solver" not in store.agents():
            return False
        return bool(store.table("solver").segments(step=1, node="solve@2"))

    kill_cli_train_when(
        mid_loop, cfg, run_dir, prefect_server, tmp_path / "run.log", "step 1's round 2"
    )
    out = train(
        TrainParams(
            resume=str(run_dir), cluster=ClusterConfig(scheduler=cluster), export_final=False
        )
    )
    assert out["resumed_segments"] > 0
    store = MEGStore.open(out["store_url"], out["run_id"], create=False)
    audit = audit_consistency(store)
    assert audit.violations == 0 and audit.accounting_errors == 0
    for agent in ("solver", "checker"):
        assert sorted(store.table(agent).consumption_log()) == list(range(steps))
        ids = store.table(agent).read().sample_id
        assert len(np.unique(ids)) == len(ids)


@pytest.mark.parametrize("stop", [ALWAYS, NEVER])
def test_evaluation_skips_and_reports_the_loops_final_round(
    stop: str, tmp_path: Path, tiny_model: str
) -> None:
    """`flexmarl evaluate` runs a loop as training does: the tool between turns, later
    rounds only where the check did not stop, no reward for a skipped sample, and per
    rollout the reward of the last round it took."""
    from flows.evaluate import EvalParams, evaluate

    cfg = loop_meg(tmp_path, tiny_model, stop)
    out = evaluate(EvalParams(config=str(cfg), base=True, limit=3, sampling="policy"))
    later = [f"{n}@{r}" for n in ("solve", "check") for r in range(2, ROUNDS + 1)]
    if stop == ALWAYS:
        assert all(out["skipped"][n] == 3 for n in later) and out["skipped"]["solve@1"] == 0
        assert all(out["samples"][n] == 0 for n in later)
    else:
        assert not any(out["skipped"].values())
        assert all(out["samples"][n] == 3 for n in later)
    assert "calc@1" not in out["node_reward"]  # the environment has no reward of its own
    final = out["loops"]["retry.solve"]
    assert final["rollouts"] == 3
    last = "solve@1" if stop == ALWAYS else f"solve@{ROUNDS}"
    assert final["final_reward"] == out["node_reward"][last]
    assert final["first_failed"] == round(3 * (1 - out["node_reward"]["solve@1"]))  # 0 or 1
    if stop == ALWAYS:  # one round: nothing was repaired
        assert final["repaired"] == 0.0


def test_a_tool_that_fails_skips_what_follows_and_the_run_goes_on(
    tmp_path: Path, tiny_model: str, cluster: str
) -> None:
    """A tool call that raises costs its invocation: the tool row is stored `skipped` with
    the reason in its score status, the turns after it do not run, and the run trains on
    the turns that did."""
    cfg = loop_meg(tmp_path, tiny_model, NEVER)
    (tmp_path / "broken_tools.py").write_text(
        "from workloads.tools import register_tool\n\n\n"
        "@register_tool('broken')\n"
        "def broken(sample, episode, task, **_):\n"
        "    raise RuntimeError('the environment is down')\n"
    )
    data = yaml.safe_load(cfg.read_text())
    data["plugins"] = ["broken_tools.py"]
    data["loops"]["retry"]["body"]["calc"]["tool"]["fn"] = "broken"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    _, store = run(cfg, tmp_path, cluster)
    solver = store.table("solver").read()
    calc = solver.node == "calc@1"
    assert (solver.finish_reason[calc] == SKIPPED).all()
    assert all("the environment is down" in s for s in solver.score_status[calc].tolist())
    assert (solver.finish_reason[solver.node != "solve@1"] == SKIPPED).all()
    assert (store.table("checker").read().finish_reason == SKIPPED).all()
    log = store.table("solver").consumption_log()
    assert sum(r["extra"]["rows"] for r in log.values()) == 2 * 2 * 2  # solve@1 only
