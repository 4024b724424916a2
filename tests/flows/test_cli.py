"""The `flexmarl` CLI: exit code 0 on success, 2 with one paragraph on a user error."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli import main


@pytest.mark.parametrize("workload", ["math-chain", "debate", "fanout"])
def test_meg_show_and_validate_every_builtin(
    workload: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["meg", "show", workload, "--skip-model-check"]) == 0
    out = capsys.readouterr().out
    assert "topological order" in out and "critical path" in out
    assert main(["meg", "show", workload, "--mermaid", "--skip-model-check"]) == 0
    assert capsys.readouterr().out.startswith("flowchart TD")
    assert main(["meg", "validate", workload, "--skip-model-check"]) == 0
    assert "valid MEG" in capsys.readouterr().out


def test_user_errors_exit_2_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "name: x\nagents: {a: {model: hf://o/m}}\nnodes: {n: {agent: zed, template: hi}}\n"
    )
    assert main(["meg", "validate", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "unknown agent 'zed'" in err and "Traceback" not in err and str(bad) in err
    assert main(["meg", "show", str(tmp_path / "missing.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
    # a missing model directory is caught before anything starts
    cfg = tmp_path / "m.yaml"
    cfg.write_text(
        f"name: m\nagents: {{a: {{model: {tmp_path / 'nomodel'}}}}}\n"
        "nodes: {n: {agent: a, template: 'Q: {question}'}}\n"
    )
    assert main(["train", str(cfg), "--run-dir", str(tmp_path / "r")]) == 2
    assert "nomodel" in capsys.readouterr().err and not (tmp_path / "r").exists()
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "not a flexmarl run directory" in capsys.readouterr().err
    assert main(["store", "ls", str(tmp_path / "nothing")]) == 2


def test_train_rejects_bad_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "m.yaml"
    cfg.write_text(
        "name: m\nagents: {a: {model: hf://o/m}}\nnodes: {n: {agent: a, template: 'Q: {question}'}}\n"
        "run: {episodes_per_step: 1, micro_batches: 2}\n"
    )
    assert main(["train", str(cfg), "--run-dir", str(tmp_path / "r")]) == 2
    assert "every micro-batch needs one whole episode" in capsys.readouterr().err
    # out-of-range options name the option, without a traceback
    for flag in ("--keep-checkpoints", "--train-slots", "--checkpoint-every"):
        assert main(["train", str(cfg), flag, "0", "--run-dir", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert f"{flag}: Input should be greater than or equal to 1 (got 0)" in err, err
        assert "Traceback" not in err
