"""LoRA serving: one engine per base, an adapter per agent and version.

The reference for every engine is the plain HF model with the same adapter *merged* (peft's
`merge_and_unload`, through the trainer's export): greedy tokens must be identical.
Adapters come from real trainers (peft, one shared base), trained a step so B ≠ 0.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from engines.rollout.base import (
    AdapterError,
    AdapterServing,
    RolloutBackend,
    SamplingParams,
    make_backend,
)
from engines.rollout.hosts import AdapterHost, drop_host, get_host
from engines.training.batch import build_microbatch
from engines.training.checkpoint import export_hf
from engines.training.lora import LoraConfig
from engines.training.trainer import AgentTrainer, TrainConfig
from workloads.tiny_model import build_tiny_model

PROMPTS = [[1, 40, 41, 42], [1, 50, 51], [1, 60, 61, 62, 63]]
GREEDY = SamplingParams(n=1, max_tokens=8, top_p=1e-6, seed=0)  # a one-token nucleus
LORA = LoraConfig(r=8, alpha=32.0, target_modules=("q_proj", "k_proj", "v_proj", "o_proj"))
_KEEP: list[RolloutBackend] = []  # vLLM engines of one process must outlive each other


def _trained(model: Path, seed: int, steps: int = 2) -> AgentTrainer:
    """A LoRA trainer whose adapter moved away from the base (big lr, fixed advantages)."""
    tr = AgentTrainer(f"agent{seed}", str(model), TrainConfig(lr=5e-2, seed=seed, lora=LORA))
    for k in range(steps):
        mb = build_microbatch(
            [[1, 40 + seed, 41]] * 4,
            [[70 + seed + k, 71, 72], [80, 81 + seed], [90, 91, 92, 93], [100 + seed]],
            [[-5.0] * 3, [-5.0] * 2, [-5.0] * 4, [-5.0]],
            [1.0, -1.0, 1.0, -1.0],
            pad_id=0,
        )
        tr.begin_step(mb.num_tokens, mb.num_seqs)
        tr.accumulate(mb)
        assert not tr.step().skipped
    return tr


def _tokens(backend: RolloutBackend, adapter: str | None = None) -> list[tuple[int, ...]]:
    out = backend.generate(PROMPTS, GREEDY, adapter=adapter)
    return [c[0].response_ids for c in out]


@pytest.fixture(scope="module")
def adapters(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two trained adapters on the tiny model, their merged HF exports, their weights."""
    out: dict[str, Any] = {}
    tmp = tmp_path_factory.mktemp("merged")
    for seed in (1, 2):
        tr = _trained(tiny_model_dir, seed)
        merged = export_hf(tr, tmp / f"a{seed}", how="merged")
        out[f"a{seed}"] = (tr.weights(), tr.describe()["lora"], merged)
        tr.close()
    return out


def _merged_tokens(merged: Path) -> list[tuple[int, ...]]:
    engine = make_backend("hf", merged)  # the plain reference: full weights, no adapters
    return _tokens(engine)


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_engine_with_adapter_equals_the_merged_model(
    name: str, tiny_model_dir: Path, adapters: dict[str, Any]
) -> None:
    engine = make_backend(name, tiny_model_dir, adapters=AdapterServing(2, 8))
    _KEEP.append(engine)
    base = _tokens(engine)
    for key in ("a1", "a2"):  # both resident at once on one engine
        tensors, config, _ = adapters[key]
        engine.load_adapter(f"{key}@v1", tensors, config)
    got = {key: _tokens(engine, f"{key}@v1") for key in ("a1", "a2")}
    for key in ("a1", "a2"):
        assert got[key] == _merged_tokens(adapters[key][2]), key
    assert got["a1"] != got["a2"] != base  # the adapters matter and differ
    assert _tokens(engine) == base == _tokens(make_backend("hf", tiny_model_dir))  # base intact
    engine.remove_adapter("a1@v1")
    with pytest.raises(AdapterError, match="not loaded"):
        engine.generate(PROMPTS, GREEDY, adapter="a1@v1")
    assert _tokens(engine, "a2@v1") == got["a2"]  # the other adapter still serves


def test_engine_errors(tiny_model_dir: Path, adapters: dict[str, Any]) -> None:
    plain = make_backend("hf", tiny_model_dir)  # built without adapters=...
    tensors, config, _ = adapters["a1"]
    with pytest.raises(AdapterError, match="without adapters"):
        plain.load_adapter("x", tensors, config)
    with pytest.raises(AdapterError, match="not loaded"):
        plain.generate(PROMPTS, GREEDY, adapter="x")
    engine = make_backend("hf", tiny_model_dir, adapters=AdapterServing(1, 8))
    engine.load_adapter("x", tensors, config)
    with pytest.raises(AdapterError, match="already loaded"):
        engine.load_adapter("x", tensors, config)
    with pytest.raises(AdapterError, match="fixed base"):
        engine.update_weights({}, 1)
    with pytest.raises(ValueError, match="max_adapters"):
        AdapterServing(0, 8)


def test_vllm_rejects_lora_on_an_architecture_it_cannot_serve(
    tmp_path: Path, adapters: dict[str, Any]
) -> None:
    gpt2 = build_tiny_model(tmp_path / "gpt2", family="gpt2")
    with pytest.raises(AdapterError, match="backend: hf"):
        make_backend("vllm", gpt2, adapters=AdapterServing(2, 8))


def test_adapter_host_loads_each_version_once_and_retires_the_previous(
    tiny_model_dir: Path, adapters: dict[str, Any]
) -> None:
    host = get_host("run/a1+a2", "hf", str(tiny_model_dir), adapters=AdapterServing(2, 8))
    try:
        assert isinstance(host, AdapterHost)
        calls: list[str] = []

        def loader(key: str) -> Any:
            def load() -> tuple[Any, dict[str, Any]]:
                calls.append(key)
                tensors, config, _ = adapters[key]
                return tensors, {"lora": config}

            return load

        base = host.generate(PROMPTS, GREEDY, "a1")  # version 0: the base itself
        assert host.held("a1") == 0 and not calls
        assert host.load("a1", 1, loader("a1")) and host.held("a1") == 1
        assert not host.load("a1", 1, loader("a1"))  # held: not loaded again
        assert host.load("a2", 1, loader("a2"))
        assert host.load("a1", 2, loader("a2"))  # a1's v2 (a2's weights, to tell them apart)
        assert calls == ["a1", "a2", "a2"]
        assert host.adapters == {"a1": (2, "a1@v2"), "a2": (1, "a2@v1")}
        assert sorted(host.backend._peft.peft_config) == ["a1@v2", "a2@v1"]  # v1 retired
        a1 = [c[0].response_ids for c in host.generate(PROMPTS, GREEDY, "a1")]
        assert a1 == _merged_tokens(adapters["a2"][2])
        assert [c[0].response_ids for c in base] != a1
    finally:
        drop_host("run/a1+a2")


def test_vllm_loads_an_exported_adapter_directory_as_is(
    tiny_model_dir: Path, tmp_path: Path, adapters: dict[str, Any]
) -> None:
    """`final/<agent>/` of a LoRA agent is what vLLM's own `LoRARequest` reads: no
    conversion by us on the way (peft loads it too: tests/engines/training/test_lora.py)."""
    from vllm.lora.request import LoRARequest

    tr = _trained(tiny_model_dir, 3)
    try:
        export = export_hf(tr, tmp_path / "final", how="adapter")
        merged = export_hf(tr, tmp_path / "merged", how="merged")
    finally:
        tr.close()
    engine = make_backend("vllm", tiny_model_dir, adapters=AdapterServing(2, 8))
    _KEEP.append(engine)
    request = LoRARequest("exported", 10_000, str(export))
    sps = engine.request_params(PROMPTS, GREEDY)
    inputs: Any = [{"prompt_token_ids": p} for p in PROMPTS]
    outs = engine.llm.generate(inputs, sps, lora_request=request, use_tqdm=False)
    assert [tuple(o.outputs[0].token_ids) for o in outs] == _merged_tokens(merged)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("family", "backend"),
    [("qwen2", "vllm"), ("qwen3", "vllm"), ("gemma", "vllm"), ("gpt2", "hf")],
)
def test_every_family_serves_adapters_like_the_merged_model(
    family: str, backend: str, tmp_path: Path
) -> None:
    """Tied embeddings, q/k/v biases, q/k norms, Conv1D projections (GPT-2, on hf: vLLM
    has no LoRA for it): the adapter engine samples what the merged HF model samples."""
    model = build_tiny_model(tmp_path / family, family=family, vocab=2048)
    targets = ("c_attn",) if family == "gpt2" else ("q_proj", "v_proj")
    tr = AgentTrainer(
        "a",
        str(model),
        TrainConfig(lr=5e-2, lora=LoraConfig(r=8, alpha=32.0, target_modules=targets)),
    )
    try:
        for k in range(2):
            mb = build_microbatch(
                [[1, 40, 41]] * 2, [[70 + k, 71], [80]], [[-5.0] * 2, [-5.0]], [1.0, -1.0], pad_id=0
            )
            tr.begin_step(mb.num_tokens, mb.num_seqs)
            tr.accumulate(mb)
            assert not tr.step().skipped
        merged = export_hf(tr, tmp_path / "merged", how="merged")
        engine = make_backend(backend, model, adapters=AdapterServing(1, 8))
        _KEEP.append(engine)
        engine.load_adapter("a@v2", tr.weights(), tr.describe()["lora"])
    finally:
        tr.close()
    got = _tokens(engine, "a@v2")
    assert got == _merged_tokens(merged)
    assert got != _tokens(engine)  # and differs from the base: the adapter is applied


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_reset_leaves_no_adapter_behind(
    name: str, tiny_model_dir: Path, adapters: dict[str, Any]
) -> None:
    """An engine handed to the next run (`RolloutBackend.reset`) serves the base alone: the
    earlier run's adapters are gone, and the names can be loaded again."""
    engine = make_backend(name, tiny_model_dir, adapters=AdapterServing(2, 8))
    _KEEP.append(engine)
    base = _tokens(engine)
    tensors, config, _ = adapters["a1"]
    engine.load_adapter("a1@v1", tensors, config)
    adapted = _tokens(engine, "a1@v1")
    assert adapted != base
    engine.reset()
    with pytest.raises(AdapterError, match="not loaded"):
        engine.generate(PROMPTS, GREEDY, adapter="a1@v1")
    assert _tokens(engine) == base
    engine.load_adapter("a1@v1", tensors, config)  # the name is free again
    assert _tokens(engine, "a1@v1") == adapted
