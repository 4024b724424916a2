"""One conformance suite, run against every backend (hf, vllm) on the tiny model."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from engines.rollout.base import (
    BadRequestError,
    Completion,
    ModelNotFoundError,
    PromptTooLongError,
    RolloutBackend,
    SamplingParams,
    UnknownBackendError,
    WeightUpdateError,
    known_backends,
    make_backend,
)

PROMPTS = [[1, 51, 28], [1, 40, 41, 42, 43, 44, 45, 46], [1]]


def forward_logprobs(
    model_dir: Path,
    prompt: list[int],
    response: tuple[int, ...],
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> torch.Tensor:
    """The sampling distribution's logprob of each response token, from one plain forward
    pass: softmax(logits / T), renormalised within the top-p nucleus (a per-row loop)."""
    model = _ref_model(str(model_dir))
    ids = torch.tensor([prompt + list(response)])  # (1, T)
    with torch.no_grad():
        logits = model(ids).logits.float()[0] / temperature  # (T, V)
    out = []
    for i, tok in enumerate(response):
        probs = torch.softmax(logits[len(prompt) - 1 + i], -1).tolist()
        order = sorted(range(len(probs)), key=lambda v: -probs[v])
        kept, mass = [], 0.0
        for v in order:  # the smallest prefix whose mass reaches top_p
            if mass > top_p:
                break
            kept.append(v)
            mass += probs[v]
        assert tok in kept, "a token outside the nucleus was sampled"
        out.append(math.log(probs[tok] / sum(probs[v] for v in kept)))
    return torch.tensor(out)


_REF: dict = {}


def _ref_model(path: str):
    from transformers import AutoModelForCausalLM

    if path not in _REF:
        _REF[path] = AutoModelForCausalLM.from_pretrained(path).eval()
    return _REF[path]


def test_registry_lists_both_backends() -> None:
    assert {"hf", "vllm"} <= set(known_backends())


def test_unknown_backend_lists_known(tiny_model_dir: Path) -> None:
    with pytest.raises(
        UnknownBackendError, match=r"unknown rollout backend 'sglang'; known: hf, vllm"
    ):
        make_backend("sglang", tiny_model_dir)


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_missing_model_dir_names_path(name: str, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ModelNotFoundError, match=str(missing)):
        make_backend(name, missing)


def test_shapes_n_samples_and_finish_reasons(backend: RolloutBackend) -> None:
    out = backend.generate(PROMPTS, SamplingParams(n=3, max_tokens=12, seed=0))
    assert len(out) == len(PROMPTS)
    for per_prompt in out:
        assert len(per_prompt) == 3
        for c in per_prompt:
            assert isinstance(c, Completion)
            assert 1 <= len(c.response_ids) <= 12
            assert len(c.logprobs) == len(c.response_ids)
            assert all(lp <= 0 for lp in c.logprobs)
            assert c.finish_reason == ("length" if len(c.response_ids) == 12 else "stop")
    assert backend.generate([], SamplingParams()) == []


def test_stop_token_ends_with_stop_and_is_kept(backend: RolloutBackend) -> None:
    every_token = tuple(range(3, 512))  # any non-special token stops generation
    out = backend.generate(
        [[1, 51, 28]], SamplingParams(n=4, max_tokens=20, seed=1, stop_token_ids=every_token)
    )
    for c in out[0]:
        assert c.finish_reason == "stop"
        assert len(c.response_ids) == 1 and c.response_ids[0] in every_token


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 1.0), (0.7, 0.9)])
def test_logprobs_are_the_sampling_distributions(
    backend: RolloutBackend, tiny_model_dir: Path, temperature: float, top_p: float
) -> None:
    """The stored logprob is that of the distribution the token was drawn from: logits / T,
    renormalised in the top-p nucleus (what the trainer's logits / T equals at top_p = 1)."""
    params = SamplingParams(n=2, max_tokens=16, temperature=temperature, top_p=top_p, seed=3)
    out = backend.generate(PROMPTS, params)
    for prompt, comps in zip(PROMPTS, out, strict=True):
        for c in comps:
            ref = forward_logprobs(tiny_model_dir, prompt, c.response_ids, temperature, top_p)
            torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-3, rtol=0)
            if temperature != 1.0:  # and not the temperature-1 logprob
                plain = forward_logprobs(tiny_model_dir, prompt, c.response_ids)
                assert (torch.tensor(c.logprobs) - plain).abs().max() > 1e-2


def test_seed_reproduces_samples_and_samples_differ(backend: RolloutBackend) -> None:
    p = SamplingParams(n=4, max_tokens=10, seed=7)
    a = backend.generate(PROMPTS, p)
    assert backend.generate(PROMPTS, p) == a
    assert backend.generate(PROMPTS, SamplingParams(n=4, max_tokens=10, seed=8)) != a
    assert len({c.response_ids for c in a[0]}) > 1  # the n samples of one prompt differ
    # two equal prompts in one batch draw different samples
    twin = backend.generate([PROMPTS[0], PROMPTS[0]], SamplingParams(max_tokens=10, seed=7))
    assert twin[0][0].response_ids != twin[1][0].response_ids


def test_prompt_longer_than_context_is_a_clear_error(backend: RolloutBackend) -> None:
    ctx = backend.max_context()
    assert ctx == 512
    with pytest.raises(PromptTooLongError, match=rf"prompt 1 has {ctx} tokens.*context is {ctx}"):
        backend.generate([[1], [1] * ctx], SamplingParams())


def test_budget_is_capped_by_context(backend: RolloutBackend) -> None:
    ctx = backend.max_context()
    out = backend.generate(
        [[1] * (ctx - 5)], SamplingParams(max_tokens=64, seed=0, stop_token_ids=())
    )
    c = out[0][0]
    assert len(c.response_ids) <= 5
    assert c.finish_reason == ("length" if len(c.response_ids) == 5 else "stop")


def test_bad_requests(backend: RolloutBackend) -> None:
    with pytest.raises(BadRequestError, match="prompt 0 is empty"):
        backend.generate([[]], SamplingParams())
    with pytest.raises(BadRequestError, match=r"outside \[0, 512\)"):
        backend.generate([[1, 9999]], SamplingParams())
    with pytest.raises(BadRequestError, match="n must be >= 1"):
        SamplingParams(n=0)
    with pytest.raises(BadRequestError, match="temperature must be > 0"):
        SamplingParams(temperature=0)


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_weight_update_changes_outputs_and_bumps_version(
    name: str, tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    b = make_backend(name, tiny_model_dir)
    assert b.version == 0
    params = SamplingParams(n=2, max_tokens=12, seed=11)
    before = b.generate(PROMPTS, params)
    new = load_file(str(tiny_model_dir_b / "model.safetensors"))
    b.update_weights(new, version=1)
    assert b.version == 1
    after = b.generate(PROMPTS, params)
    assert after != before
    # the new logprobs are those of the new weights
    c = after[0][0]
    ref = forward_logprobs(tiny_model_dir_b, PROMPTS[0], c.response_ids)
    torch.testing.assert_close(torch.tensor(c.logprobs), ref, atol=1e-3, rtol=0)

    with pytest.raises(WeightUpdateError, match="version 1 is not newer than the loaded version 1"):
        b.update_weights(new, version=1)
    partial = {k: v for k, v in new.items() if not k.startswith("lm_head")}
    with pytest.raises(WeightUpdateError, match=r"missing \['lm_head.weight'\]"):
        b.update_weights(partial, version=2)
    wrong = dict(new, **{"lm_head.weight": torch.zeros(3, 3)})
    with pytest.raises(WeightUpdateError, match=r"lm_head\.weight.*shape"):
        b.update_weights(wrong, version=2)
    assert b.version == 1


@pytest.mark.parametrize("name", ["hf", "vllm"])
def test_updated_engine_matches_fresh_engine_with_same_weights(
    name: str, tiny_model_dir: Path, tiny_model_dir_b: Path
) -> None:
    """An in-place update leaves no trace: after X→Y→X→Y the engine samples exactly what a
    fresh engine loaded from Y samples (same ids, same logprobs)."""
    x = load_file(str(tiny_model_dir / "model.safetensors"))
    y = load_file(str(tiny_model_dir_b / "model.safetensors"))
    updated = make_backend(name, tiny_model_dir)
    for version, weights in enumerate((y, x, y), start=1):
        updated.update_weights(weights, version)
    fresh = make_backend(name, tiny_model_dir_b)
    params = SamplingParams(n=2, max_tokens=12, temperature=0.8, seed=5)
    got, want = updated.generate(PROMPTS, params), fresh.generate(PROMPTS, params)
    assert [[c.response_ids for c in p] for p in got] == [[c.response_ids for c in p] for p in want]
    for p, q in zip(got, want, strict=True):
        for c, d in zip(p, q, strict=True):
            torch.testing.assert_close(torch.tensor(c.logprobs), torch.tensor(d.logprobs))


def test_vllm_sampled_logprobs_reads_flat_and_dict_forms() -> None:
    from vllm.logprobs import FlatLogprobs, Logprob

    from engines.rollout.vllm_support import sampled_logprobs

    steps = [{7: Logprob(logprob=-0.5, rank=1)}, {9: Logprob(logprob=-2.0, rank=3)}]
    flat = FlatLogprobs()
    for s in steps:
        flat.append(s)
    assert sampled_logprobs(flat, (7, 9)) == (-0.5, -2.0)
    assert sampled_logprobs(steps, (7, 9)) == (-0.5, -2.0)
    assert sampled_logprobs(None, ()) == ()
    with pytest.raises(KeyError):  # a position that does not hold the sampled token
        sampled_logprobs(steps, (7, 8))


def test_vllm_reload_log_filter_drops_only_the_rotary_buffer_warning() -> None:
    import logging

    from engines.rollout.vllm_support import quiet_reload_warnings

    quiet_reload_warnings()
    quiet_reload_warnings()  # idempotent
    log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    assert len(log.filters) == 1

    def record(layer: str) -> logging.LogRecord:
        msg = "%s: Failed to load weights"
        return logging.LogRecord(log.name, logging.WARNING, __file__, 1, msg, (layer,), None)

    assert not log.filter(record("RotaryEmbedding"))
    assert log.filter(record("QKVParallelLinear"))  # a real failed load still shows


def test_vllm_import_log_filter_drops_only_the_cpu_triton_warning() -> None:
    import logging

    from engines.rollout.vllm_support import quiet_import_warnings

    quiet_import_warnings()
    quiet_import_warnings()  # idempotent
    log = logging.getLogger("vllm.triton_utils.importing")
    assert len(log.filters) == 1

    def record(msg: str) -> logging.LogRecord:
        return logging.LogRecord(log.name, logging.WARNING, __file__, 1, msg, None, None)

    cpu = "Triton is installed, but doesn't include CPU backend. Disabling Triton."
    assert not log.filter(record(cpu))
    assert log.filter(record("Triton not installed or not compatible"))  # others still show


@pytest.mark.parametrize("backend", ["vllm"], indirect=True)
def test_a_vllm_engine_loads_without_a_progress_bar(backend: Any) -> None:
    """Its weights load in milliseconds here; the bar was three lines of every run's log per
    engine."""
    assert backend.llm.llm_engine.vllm_config.load_config.use_tqdm_on_load is False


@pytest.mark.parametrize("every", [3, 8])
def test_hf_decoding_with_sparse_syncs_samples_exactly_the_same(
    tiny_model_dir: Path, every: int
) -> None:
    """The hf loop looks at "every row done" once per `sync_every` tokens on a GPU (a host
    sync per token stalled decoding there): rows that finished meanwhile decode tokens that
    are never kept and leave the batch at the next look, so tokens and finish reasons equal
    those of a look per token, ragged prompts, stop tokens and short budgets included. The
    logprobs equal them to float32 rounding: a row's logits can differ in the last bit when
    the rows beside it in the batch differ."""
    backend = make_backend("hf", tiny_model_dir)
    prompts, params = ragged(backend)
    assert backend.sync_every == 1  # a CPU engine looks every token
    per_token = backend.generate(prompts, params)
    backend.sync_every = every
    sparse = backend.generate(prompts, params)
    assert same_samples(sparse, per_token)
    reasons = {c.finish_reason for group in per_token for c in group}
    assert reasons == {"stop", "length"}, reasons  # both ways of finishing are exercised


def ragged(backend: RolloutBackend) -> tuple[list[list[int]], SamplingParams]:
    """Ragged prompts and seeded params under which some rows end on a stop token and others
    run to `max_tokens`, whatever the sampler draws: the stop ids are two tokens that this
    seeded run, without stop ids, samples mid-way in two rows and never in some other row.
    Until a row stops it draws what it drew without stop ids (the stream is the same), so
    those two rows end on a stop and the other row on its budget."""
    prompts = [[5, 6, 7], [9], [3, 4, 5, 6, 7, 8], [10, 11]]
    base = SamplingParams(n=3, max_tokens=12, temperature=1.3, seed=4)
    free = [c.response_ids for group in backend.generate(prompts, base) for c in group]
    for a in free[0][2:9]:
        for b in free[7][2:9]:
            if any(a not in row and b not in row for row in free):
                return prompts, dataclasses.replace(base, stop_token_ids=(a, b))
    raise AssertionError(f"every row samples the candidates: {free}")


def same_samples(a: list[list[Completion]], b: list[list[Completion]]) -> bool:
    """The same tokens and finish reasons, and logprobs within float32 rounding."""
    pairs = [(x, y) for ga, gb in zip(a, b, strict=True) for x, y in zip(ga, gb, strict=True)]
    return all(
        x.response_ids == y.response_ids
        and x.finish_reason == y.finish_reason
        and x.logprobs == pytest.approx(y.logprobs, abs=1e-5)
        for x, y in pairs
    )


def test_hf_finished_rows_leave_the_batch_and_change_no_sample(tiny_model_dir: Path) -> None:
    """A row that finished stops costing a forward pass (its cache row leaves with it): the
    batch shrinks as rows stop, and every row samples what it would have with all rows kept
    (the rows that left still draw from the seeded stream)."""
    backend = make_backend("hf", tiny_model_dir)
    prompts, params = ragged(backend)
    sizes: list[int] = []
    hook = backend.model.register_forward_hook(
        lambda _m, _a, out: sizes.append(int(out.logits.shape[0]))
    )
    try:
        compact = backend.generate(prompts, params)
        shrunk, sizes[:] = list(sizes), []
        backend.compact = False
        kept = backend.generate(prompts, params)
    finally:
        hook.remove()
    assert same_samples(compact, kept)
    # one prompt pass for the 4 prompts; without compaction all 4 × 3 rows decode to the end
    assert sizes[0] == 4 and set(sizes[1:]) == {12}
    lengths = sorted(len(c.response_ids) for g in compact for c in g)
    assert lengths[0] < 12  # some rows stopped early...
    assert shrunk[:2] == [4, 12] and shrunk[-1] < 12  # ...and left the batch
    assert shrunk[1:] == sorted(shrunk[1:], reverse=True)


def test_hf_prefill_computes_the_last_positions_logits_only(tiny_model_dir: Path) -> None:
    """The prompt's pass asks for one position's logits (`logits_to_keep=1`): the whole
    (rows, prompt length, vocabulary) tensor would be gigabytes at a 151,936 vocabulary,
    and only the last position is sampled from. The samples are what the full pass gives
    (its logprobs to float32 rounding: a matrix product of another shape may round one
    logit differently)."""
    backend = make_backend("hf", tiny_model_dir)
    shapes: list[tuple[int, ...]] = []
    hook = backend.model.register_forward_hook(
        lambda _m, _a, out: shapes.append(tuple(out.logits.shape))
    )
    prompts = [[1, 40, 41, 42, 43, 44, 45, 46], [1, 51]]
    params = SamplingParams(n=2, max_tokens=4, seed=3)
    try:
        got = backend.generate(prompts, params)
    finally:
        hook.remove()
    vocab = shapes[0][-1]
    assert shapes[0] == (2, 1, vocab)  # one prompt pass per prompt, not per sample
    assert all(s == (4, 1, vocab) for s in shapes[1:])  # 2 prompts × n = 2 rows decode
    # the same samples as sampling from the full pass's last position
    model, calls = backend.model, backend.model.forward

    def full_logits(*a: object, **kw: object) -> object:
        kw.pop("logits_to_keep", None)
        return calls(*a, **kw)

    model.forward = full_logits  # type: ignore[method-assign]
    try:
        assert same_samples(backend.generate(prompts, params), got)
    finally:
        del model.forward
