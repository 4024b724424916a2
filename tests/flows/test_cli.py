"""The `flexmarl` CLI: exit code 0 on success, 2 with one paragraph on a user error."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.cli.main import main


@pytest.mark.parametrize(
    "workload", ["math-chain", "debate", "fanout", "critic-debate", "word-problems", "longtail"]
)
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
    for flag, value in (("--window", "65"), ("--seed", "-1"), ("--episodes-per-step", "1000001")):
        assert main(["train", str(cfg), flag, value, "--run-dir", str(tmp_path / "r")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"flexmarl: error: {flag}: ") and "Traceback" not in err, err


def test_a_step_too_big_for_the_override_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tmp_path / "m.yaml"  # 1,000 samples an episode: 1,000 episodes is the limit
    cfg.write_text(
        "name: m\nagents: {a: {model: hf://o/m}}\n"
        "nodes: {n: {agent: a, template: 'Q: {question}', n: 1000}}\n"
    )
    args = ["train", str(cfg), "--run-dir", str(tmp_path / "r"), "--episodes-per-step"]
    assert main([*args, "1001"]) == 2
    err = capsys.readouterr().err
    assert "--episodes-per-step: one step would generate 1,001,000 samples" in err, err


def test_prompts_that_can_outgrow_the_context_are_refused_before_the_run(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from workloads import BUILTIN

    data = yaml.safe_load(BUILTIN["math-chain"].read_text())
    for agent in data["agents"].values():
        agent["model"] = tiny_model  # a 512-token context
    data["agents"]["solver"]["sampling"]["max_tokens"] = 10**12  # clamped to 511 by the engine
    cfg = tmp_path / "m.yaml"
    cfg.write_text(yaml.safe_dump(data))
    assert main(["meg", "validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "field `nodes.verify.inputs`" in err and "solve: 1 × 511" in err, err
    assert "a 512-token context" in err
    data["agents"]["solver"]["sampling"]["max_tokens"] = 400  # 16 + 400 < 512: fits
    cfg.write_text(yaml.safe_dump(data))
    assert main(["meg", "validate", str(cfg)]) == 0
    broken = tmp_path / "broken"  # a model whose config.json is not JSON: named, no traceback
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    data["agents"]["verifier"]["model"] = str(broken)
    cfg.write_text(yaml.safe_dump(data))
    assert main(["meg", "validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "field `agents.verifier.model`" in err and "Traceback" not in err, err


def _lora_fanout(tmp_path: Path, model: str, backend: str | None = None, **lora_of: object) -> Path:
    import yaml

    from workloads import BUILTIN

    data = yaml.safe_load(BUILTIN["fanout"].read_text())
    for name, agent in data["agents"].items():
        agent["model"] = model
        if backend is not None:
            agent["backend"] = backend
        if name in lora_of:
            agent["lora"] = lora_of[name]
    cfg = tmp_path / "fanout.yaml"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))  # the spec order: unit names
    return cfg


def test_meg_show_reports_the_weights_each_worker_holds(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    lora = {"r": 8, "target_modules": ["q_proj", "v_proj"]}
    cfg = _lora_fanout(tmp_path, tiny_model, planner=lora, short=lora, medium=lora, long=lora)
    assert main(["meg", "show", str(cfg)]) == 0
    rows = {
        line.split("│")[1].strip(): [c.strip() for c in line.split("│")[2:-1]]
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("│ rollout-0") or line.startswith("│ train-0")
    }
    # what the report must say, counted here independently: W the model, a one adapter
    w = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model).parameters())
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model),
        LoraConfig(r=8, target_modules=["q_proj", "v_proj"]),
    )
    a = model.get_nb_trainable_parameters()[0]
    want = {  # 4 adapters on one base + the aggregator's own copy; training holds 4×
        "rollout-0": (5 * w, w + 4 * a + w),
        "train-0": (4 * 5 * w, w + 4 * 4 * a + 4 * w),
    }
    for worker, (unshared, shared) in want.items():
        units, without, with_, ratio = rows[worker][:4]
        assert units == "planner+short+medium+long, aggregator"
        assert (without, with_) == (f"{unshared / 1e6:,.2f}M", f"{shared / 1e6:,.2f}M")
        assert float(ratio) == pytest.approx(shared / unshared, abs=1e-3)


def test_the_weights_report_counts_bf16_training_in_float32_masters(
    tmp_path: Path, tiny_model: str
) -> None:
    """A bf16 agent's engine holds bf16 weights; its trainer holds float32 masters, grads and
    AdamW moments (16 bytes a parameter); a bf16 LoRA base stays bf16 beside float32
    adapters."""
    import yaml
    from transformers import AutoModelForCausalLM

    from flows.report.memory import held
    from meg.load import load_meg

    cfg = _lora_fanout(tmp_path, tiny_model, planner={"r": 8, "target_modules": ["q_proj"]})
    data = yaml.safe_load(cfg.read_text())
    for agent in data["agents"].values():
        agent["dtype"] = "bfloat16"
    cfg.write_text(yaml.safe_dump(data, sort_keys=False))
    w = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(tiny_model).parameters())
    rollout, train = held(load_meg(cfg))
    full = [u for u in train[0].units if "+" not in u and u != "planner"]
    assert full and rollout[0].nbytes >= 2 * w * len(rollout[0].units)
    lora_base = w * 2  # the planner's frozen base, bf16
    adapters = train[0].shared - w - 4 * w * len(full)  # 4x the adapter's parameters
    assert train[0].nbytes == 16 * w * len(full) + lora_base + 4 * adapters


def test_lora_mistakes_are_found_before_anything_starts(
    tmp_path: Path, tiny_model: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from workloads.tiny_model import build_tiny_model

    cfg = _lora_fanout(tmp_path, tiny_model, planner={"target_modules": ["c_attn"]})
    assert main(["meg", "validate", str(cfg)]) == 2
    err = capsys.readouterr().err
    assert "agents.planner.lora.target_modules" in err and "c_attn" in err
    assert "Traceback" not in err
    gpt2 = build_tiny_model(tmp_path / "gpt2", family="gpt2")
    cfg = _lora_fanout(tmp_path, str(gpt2), backend="vllm", planner=True)
    assert main(["train", str(cfg), "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "agents.planner.backend" in err and "backend: hf" in err
    assert not (tmp_path / "r").exists()
    # left to the run (`backend: auto`), the same agents are put on the engine that serves
    # adapters on GPT-2, and nothing is refused
    from flows.train import TrainParams, check

    cfg = _lora_fanout(tmp_path, str(gpt2), planner=True)
    settled = check(TrainParams(config=str(cfg), run_dir=str(tmp_path / "r")))
    assert {a.backend for a in settled.run.ctx.spec.agents.values()} == {"hf"}
    assert "vLLM serves no LoRA adapters on this architecture" in settled.notes[0]


def test_a_worker_named_after_a_role_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """Its name is also its pinning resource: named `train`, it would pin nothing."""
    assert main(["worker", "tcp://127.0.0.1:9", "--role", "train", "--name", "train"]) == 2
    assert "--name 'train' is a role" in capsys.readouterr().err
