"""Speculative rollout (SRT): the draft index, the exactness of the verify rule (the emitted
tokens are distributed as the policy's, whatever the drafts), and the hf backend's batched
loop (every stored logprob is the model's own under teacher forcing; drafts save passes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from bench.common import teacher_forced_logprobs
from engines.rollout.base import BadRequestError, Cut, SamplingParams, Speculation, make_backend
from engines.rollout.hf_backend import HFBackend
from engines.rollout.speculative import DraftHistory, SuffixIndex, verify


def test_a_draft_continues_the_latest_earlier_match_of_the_longest_suffix() -> None:
    idx = SuffixIndex(match=3)
    a = idx.add_seq([1, 2, 3, 4, 5])
    b = idx.add_seq([9, 2, 3, 7, 8])
    row = idx.add_seq([2, 3])
    assert idx.draft(row, 2) == [7, 8]  # "2 3" occurs in both: the latest (b) wins
    idx.extend(row, [4])
    assert idx.draft(row, 5) == [5]  # "2 3 4" only in a; what follows is all a has
    assert idx.draft(idx.add_seq([42]), 3) == []  # never seen
    assert idx.draft(a, 0) == [] and idx.draft(b, 3) == []  # nothing after b's own suffix
    solo = SuffixIndex(match=2)
    loop = solo.add_seq([5, 6, 5, 6, 5])
    assert solo.draft(loop, 3) == [6, 5]  # a row drafts from its own repeats too


def test_the_history_keeps_the_last_completions_of_the_latest_prompts() -> None:
    h = DraftHistory(prompts=2)
    spec = Speculation(draft=3, match=2, history=2)
    for c in ([1, 2], [3, 4], [5, 6]):
        h.remember([7, 8, 9], c, spec.history)
    idx = h.index([7, 8, 9], spec)
    assert idx.seqs == [[8, 9, 3, 4], [8, 9, 5, 6]]  # the prompt's tail, then a completion
    h.remember([1], [1], 2)
    h.remember([2], [2], 2)  # a third prompt: the least recently used one is forgotten
    assert h.index([7, 8, 9], spec).seqs == [] and h.index([2], spec).seqs == [[2, 2]]
    h.remember([3], [4], keep=0)  # history 0: siblings only, nothing kept
    assert h.index([3], spec).seqs == []


def emitted(accepted: torch.Tensor, token: torch.Tensor, drafts: torch.Tensor) -> torch.Tensor:
    """(R, K+1): each row's drafts up to `accepted`, then `token`, then -1."""
    r, k = drafts.shape
    out = torch.full((r, k + 1), -1, dtype=torch.long)
    for i in range(r):
        a = int(accepted[i])
        out[i, :a] = drafts[i, :a]
        out[i, a] = token[i]
    return out


@pytest.mark.parametrize("draft", [(0, 3), (2, 2), (4, 0)])
def test_verify_emits_exactly_the_policys_distribution(draft: tuple[int, int]) -> None:
    """200,000 rows, the same two positions' distributions p0, p1 and drafts (d1, d2): the
    first emitted token is distributed as p0, and the second, given the first was d1, as p1
    — each frequency within 5 binomial standard deviations of the exact probability, for a
    likely draft, an unlikely one and a draft of probability 0."""
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05], [0.05, 0.05, 0.6, 0.2, 0.1], [0.2] * 5])
    p[0, 4] = 0.0 if draft[0] == 4 else p[0, 4]  # a draft the policy never samples
    p = p / p.sum(-1, keepdim=True)
    rows = 200_000
    logp = p.log()[None].expand(rows, 3, 5)
    drafts = torch.tensor(draft)[None].expand(rows, 2)
    accepted, token = verify(logp, drafts, torch.full((rows,), 2), gen)
    out = emitted(accepted, token, drafts)
    checks = [(0, None)] + ([(1, draft[0])] if p[0, draft[0]] > 0 else [])  # d1 ever first?
    for pos, given in checks:
        sel = out[:, pos] if given is None else out[out[:, 0] == given, 1]
        freq = torch.bincount(sel, minlength=5).double() / len(sel)
        sd = (p[pos] * (1 - p[pos]) / len(sel)).sqrt()
        assert ((freq - p[pos]).abs() <= 5 * sd + 1e-9).all(), (pos, freq, p[pos])


def test_verify_takes_no_draft_beyond_a_rows_length_and_accepts_a_sure_one() -> None:
    p = torch.zeros(2, 3, 4)
    p[:, :, 1] = 1.0  # every position certainly samples token 1
    logp = p.clamp(min=1e-30).log()
    drafts = torch.tensor([[1, 1], [1, 1]])
    accepted, token = verify(logp, drafts, torch.tensor([2, 1]), torch.Generator().manual_seed(0))
    assert accepted.tolist() == [2, 1] and token.tolist() == [1, 1]


@pytest.fixture(scope="module")
def hf(tiny_model_dir: Path) -> HFBackend:
    backend = make_backend("hf", tiny_model_dir)
    assert isinstance(backend, HFBackend)
    return backend


PROMPTS = [[5, 17, 33, 2, 90], [7, 7], [100, 3, 4, 8, 9, 12, 14]]


def teacher_forced(
    hf: HFBackend, prompt: list[int], resp: tuple[int, ...], t: float
) -> list[float]:
    return teacher_forced_logprobs(hf.model, prompt, list(resp), t).tolist()


@pytest.mark.parametrize("temperature", [1.0, 0.001])
def test_every_logprob_is_the_models_own_and_drafts_save_passes(
    hf: HFBackend, temperature: float
) -> None:
    """Ragged prompts, 4 samples each, twice (the second call drafts from the first's
    completions too): every stored logprob equals the model's under teacher forcing of
    prompt + response (so holes and positions hide nothing and shift nothing). At a low
    temperature (the tiny random model's logits are nearly flat) the rollouts of a prompt
    write alike, so the second call's drafts are mostly accepted and the loop makes at most
    half as many forward passes as its longest response has tokens."""
    hf.reset()
    spec = Speculation(draft=4, match=3, history=8)
    params = SamplingParams(n=4, temperature=temperature, max_tokens=24, seed=3, speculate=spec)
    for call in range(2):
        out = hf.generate(PROMPTS, params)
        tokens = 0
        for prompt, group in zip(PROMPTS, out, strict=True):
            for c in group:
                assert 1 <= len(c.response_ids) <= 24 and c.finish_reason in ("stop", "length")
                want = teacher_forced(hf, prompt, c.response_ids, temperature)
                gap = max(abs(a - b) for a, b in zip(c.logprobs, want, strict=True))
                assert gap < (1e-4 if temperature == 1.0 else 5e-3)  # float noise × 1/T
                tokens += len(c.response_ids)
        longest = max(len(c.response_ids) for g in out for c in g)
        assert hf.passes <= longest  # never more passes than plain decoding's
        if temperature < 0.5 and call == 1:
            assert hf.passes * 2 <= longest, (hf.passes, longest)


def test_speculation_stops_no_request_and_is_refused_beside_a_cut(hf: HFBackend) -> None:
    params = SamplingParams(speculate=Speculation())
    with pytest.raises(BadRequestError, match="no cut or watch"):
        hf.generate([[1, 2]], params, cut=Cut(groups=(0,), quota=1))
    with pytest.raises(BadRequestError, match="draft, match >= 1"):
        Speculation(draft=0)
