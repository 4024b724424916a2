"""EchoRL's clip choice (arXiv 2605.31228): which tokens of a micro-batch get the auxiliary
NLL term. Pure numpy on what the store holds; the loss term itself is in the trainer.

In a group whose rollouts all succeeded, every advantage is 0 and the policy loss has no
gradient: the prompt is "solved" and teaches nothing, though its successes show the policy
how it got through its hardest decision. EchoRL echoes one of them back: the prefix of a
success rollout up to the end of its step of highest entropy (the "EchoClip"), trained by
maximum likelihood with a small weight.

What the paper leaves open, decided here (and documented in docs/rollout-policies.md):

- **Entropy without a forward pass.** A step's entropy is estimated by the mean surprisal
  −log μ(token) of its sampled tokens: on the policy's own samples surprisal averages to the
  entropy, and the behaviour logprobs μ are already in the store.
- **Which success.** One clip per group: the success whose peak step has the highest
  surprisal (the most uncertain decision that still went right); the first such row on a tie.
- **Steps.** A step ends at a token whose text contains the delimiter (the paper splits
  Qwen's newline tokens); a response without one is one step, echoed whole.

Every choice is a function of the stored rows, so a replayed or resumed step trains on
exactly the clips the first attempt did.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def step_ends(is_delimiter: np.ndarray) -> np.ndarray:
    """Exclusive end index of every step of one response: after each delimiter token, and
    at the end of the response. (L,) bool → (S,) int."""
    n = len(is_delimiter)
    ends = np.flatnonzero(is_delimiter) + 1
    if n and (len(ends) == 0 or ends[-1] != n):
        ends = np.append(ends, n)
    return ends.astype(np.int64)


def peak_step(surprisal: np.ndarray, is_delimiter: np.ndarray) -> tuple[int, float]:
    """(clip length, the peak step's mean surprisal) of one response: the prefix that ends
    with its step of highest mean surprisal (the first such step on a tie). (L,), (L,) bool."""
    ends = step_ends(is_delimiter)
    if len(ends) == 0:
        return 0, float("-inf")
    starts = np.concatenate(([0], ends[:-1]))
    means = np.array([surprisal[s:e].mean() for s, e in zip(starts, ends, strict=True)])
    best = int(np.argmax(means))
    return int(ends[best]), float(means[best])


def echo_clips(
    groups: Sequence[str] | np.ndarray,
    rewards: np.ndarray,
    advantages: np.ndarray,
    surprisal: Sequence[np.ndarray],
    is_delimiter: Sequence[np.ndarray],
    success: float,
) -> np.ndarray:
    """Clip length per row (0: no echo term on that row). A group qualifies when every row
    has reward >= `success` and advantage 0 (a group with any signal is the policy loss's);
    its clip goes to one row (see the module docstring). (N,) int."""
    n = len(groups)
    out = np.zeros(n, np.int64)
    members: dict[str, list[int]] = {}
    for i, g in enumerate(groups):
        members.setdefault(str(g), []).append(i)
    for rows in members.values():
        if not all(rewards[i] >= success and advantages[i] == 0 for i in rows):
            continue
        best, best_score, best_len = -1, float("-inf"), 0
        for i in rows:
            length, score = peak_step(np.asarray(surprisal[i]), np.asarray(is_delimiter[i]))
            if length and (best < 0 or score > best_score):
                best, best_score, best_len = i, score, length
        if best >= 0:
            out[best] = best_len
    return out
