"""The sparse-KV mechanism (`engines.rollout.sparse_kv`): which entries a cut keeps (sinks,
window, the most-attended of the rest, per KV head), that the cache holds them and nothing
else, and that the logprobs stored are the sparse sampler's own: equal to a dense
recompute while the budget is never reached, and, when it bites, equal to the model's under
exactly the attention the budget leaves (a masked dense forward), not to the dense ones."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bench.common import teacher_forced_logprobs
from engines.rollout.base import (
    BadRequestError,
    Completion,
    SamplingParams,
    SparseKV,
    make_backend,
)
from engines.rollout.hf_backend import HFBackend
from engines.rollout.sparse_kv import compress, grouped, keep_indices, observe

PROMPTS = [[1, 5, 6, 7, 8, 9, 10, 11, 12, 13], [1, 20, 21, 22], [1, 30, 31, 32, 33, 34]]
# one cache entry of the tiny model: keys and values × 2 layers × 2 KV heads × 64 × fp32
ENTRY = 2 * 2 * 2 * 64 * 4


def test_a_cut_keeps_the_sinks_the_window_and_the_most_attended() -> None:
    kv = SparseKV(budget=7, sinks=2, window=3, every=1)
    # 10 entries: sinks 0-1, window 7-9; of the middle 2-6, the two best: 3 (0.9), 5 (0.8)
    scores = torch.tensor([[[0.0, 0.0, 0.1, 0.9, 0.3, 0.8, 0.2, 0.0, 0.0, 0.0]]])
    assert keep_indices(scores, kv).tolist() == [[[0, 1, 3, 5, 7, 8, 9]]]
    # a tie keeps the earlier entry; each head chooses on its own
    two = torch.tensor([[[0.0, 0, 0.5, 0.5, 0.5, 0, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0, 2, 0, 0, 0]]])
    assert keep_indices(two, kv).tolist() == [[[0, 1, 2, 3, 7, 8, 9], [0, 1, 4, 6, 7, 8, 9]]]


def test_the_recent_queries_score_the_entries_per_kv_head() -> None:
    attn = torch.arange(16.0).view(1, 4, 1, 4)  # 4 query heads over 4 entries, one query
    g = grouped(attn, 2)  # heads (0, 1) and (2, 3) share a KV head
    assert g.tolist() == [[[[4.0, 6, 8, 10]], [[20.0, 22, 24, 26]]]]
    obs = observe(None, g, window=2)
    obs = observe(obs, torch.ones(1, 2, 1, 5), window=2)  # a new entry: the old row saw 0
    assert obs[0, 0].tolist() == [[4.0, 6, 8, 10, 0], [1, 1, 1, 1, 1]]
    obs = observe(obs, torch.full((1, 2, 1, 5), 2.0), window=2)  # the first row leaves
    assert obs[0, 0].tolist() == [[1.0, 1, 1, 1, 1], [2, 2, 2, 2, 2]]


def test_a_cut_holds_exactly_the_kept_entries() -> None:
    kv = SparseKV(budget=4, sinks=1, window=1, every=1)
    keys = torch.arange(6.0).view(1, 1, 6, 1).expand(1, 2, 6, 3).clone()  # entry i = i
    layer = SimpleNamespace(keys=keys, values=-keys)
    obs = torch.tensor([[[[0, 5, 1, 4, 3, 0.0]], [[0, 1, 2, 3, 9, 0.0]]]])  # (1, 2, 1, 6)
    kept = compress(layer, obs, kv)
    assert layer.keys[0, :, :, 0].tolist() == [[0, 1, 3, 5], [0, 3, 4, 5]]
    assert torch.equal(layer.values, -layer.keys)
    assert kept[0, :, 0].tolist() == [[0, 5, 4, 0], [0, 3, 9, 0]]


def test_sinks_and_window_must_fit_the_budget() -> None:
    with pytest.raises(BadRequestError, match="exceed the budget"):
        SparseKV(budget=6, sinks=4, window=4)


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HFBackend:
    backend = make_backend("hf", tiny_model_dir)
    assert isinstance(backend, HFBackend)
    return backend


def sampled(hf: HFBackend, kv: SparseKV, seed: int = 3) -> list[tuple[list[int], Completion]]:
    outs = hf.generate(PROMPTS, SamplingParams(n=2, max_tokens=20, seed=seed, sparse_kv=kv))
    return [(p, c) for p, group in zip(PROMPTS, outs, strict=True) for c in group]


def gap(hf: HFBackend, rows: list[tuple[list[int], Completion]]) -> float:
    worst = 0.0
    for prompt, c in rows:
        want = teacher_forced_logprobs(hf.model, prompt, list(c.response_ids))
        worst = max(worst, float((torch.tensor(c.logprobs) - want).abs().max()))
    return worst


def test_a_budget_never_reached_is_the_dense_decode(hf: HFBackend) -> None:
    rows = sampled(hf, SparseKV(budget=4096, sinks=2, window=4, every=4))
    assert gap(hf, rows) < 1e-5
    for i, prompt in enumerate(PROMPTS):  # a batch per prompt length: its longest row's cache
        longest = max(len(c.response_ids) for _, c in rows[2 * i : 2 * i + 2])
        assert hf.kv_bytes[2 * i : 2 * i + 2] == [(len(prompt) + longest - 1) * ENTRY] * 2
    assert hf.model.config._attn_implementation == "sdpa"  # eager only during the call


def streaming_logprobs(
    hf: HFBackend, prompt: list[int], response: list[int], kv: SparseKV
) -> torch.Tensor:
    """The model's logprobs of `response` when each decode query sees only the sinks and the
    last `window` positions before it (what `budget = sinks + window`, `every = 1` leaves),
    the prompt pass dense: a masked dense forward, independent of the cache code."""
    ids = torch.tensor([prompt + response])
    n, p = ids.shape[1], len(prompt)
    allowed = torch.tril(torch.ones(n, n, dtype=torch.bool))
    for q in range(p, n):  # query at q: sinks, positions q - window .. q
        allowed[q, kv.sinks : max(kv.sinks, q - kv.window)] = False
    mask = torch.zeros(1, 1, n, n).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        logits = hf.model(input_ids=ids, attention_mask=mask).logits[0, p - 1 : n - 1].float()
    return torch.log_softmax(logits, -1).gather(-1, ids[0, p:, None])[:, 0]


def test_when_the_budget_bites_the_stored_logprobs_are_the_sparse_sampler_s(
    hf: HFBackend,
) -> None:
    kv = SparseKV(budget=6, sinks=2, window=4, every=1)  # no middle: sinks + recent only
    rows = sampled(hf, kv)
    assert gap(hf, rows) > 1e-2  # not the dense policy's ...
    for prompt, c in rows:  # ... but exactly the sparse one's
        want = streaming_logprobs(hf, prompt, list(c.response_ids), kv)
        torch.testing.assert_close(torch.tensor(c.logprobs), want, atol=2e-5, rtol=0)
    # the prompt pass holds the whole prompt, a decode step at most budget + every entries
    held = [max(len(p), kv.budget + kv.every) * ENTRY for p in PROMPTS for _ in range(2)]
    assert hf.kv_bytes == held
    assert [c.response_ids for _, c in rows] == [c.response_ids for _, c in sampled(hf, kv)]
