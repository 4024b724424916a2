"""Synthetic, realistic sample batches for tests and benchmarks (no model needed)."""

from __future__ import annotations

import numpy as np

from storage.schema import SampleBatch, SegmentKey


def synthetic_batch(
    key: SegmentKey,
    *,
    groups: int = 2,
    group_size: int = 4,
    prompt_len: int = 16,
    response_len: int = 32,
    version: int | None = None,
    vocab: int = 32_000,
    seed: int = 0,
    ragged: bool = True,
) -> SampleBatch:
    """``groups × group_size`` rows for ``key``; lengths vary per row when ``ragged``.

    Episodes are ``k{step}/e{micro_batch}-{g}``; each group is one node invocation.
    """
    rng = np.random.default_rng(seed)
    n = groups * group_size
    p_len = (
        rng.integers(max(1, prompt_len // 2), prompt_len + 1, n)
        if ragged
        else np.full(n, prompt_len)
    )
    r_len = (
        rng.integers(max(1, response_len // 2), response_len + 1, n)
        if ragged
        else np.full(n, response_len)
    )
    episode = [f"k{key.step}/e{key.micro_batch}-{i // group_size}" for i in range(n)]
    group = [f"{e}/{key.node}/0" for e in episode]
    now = 1.7e9 + key.step
    return SampleBatch(
        sample_id=np.array([f"{g}/{i % group_size}" for i, g in enumerate(group)]),
        group_id=np.array(group),
        parent_ids=np.array([""] * n),
        node=np.array([key.node] * n),
        episode=np.array(episode),
        step=np.full(n, key.step),
        policy_version=np.full(n, key.step if version is None else version),
        prompt_ids=rng.integers(0, vocab, int(p_len.sum())),
        prompt_offsets=np.concatenate([[0], np.cumsum(p_len)]),
        response_ids=rng.integers(0, vocab, int(r_len.sum())),
        response_offsets=np.concatenate([[0], np.cumsum(r_len)]),
        logprobs=-rng.exponential(1.0, int(r_len.sum())),
        token_versions=np.repeat(np.full(n, key.step if version is None else version), r_len),
        reward=np.full(n, np.nan),
        advantage=np.full(n, np.nan),
        finish_reason=np.where(r_len == response_len, "length", "stop"),
        gen_start=np.full(n, now),
        gen_end=np.full(n, now + 0.5),
    )
