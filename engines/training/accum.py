"""The pending step's bookkeeping: which micro-batches it holds and their counts, the
constant an aggregation mode divides the summed gradients by once the batch is known, and
which rows need a forward pass at all (zero-advantage skipping)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from engines.training.aggregate import aggregate
from engines.training.train_config import StepMismatchError


def normaliser(mode: str, tokens: int, seqs: int) -> float:
    """The constant an aggregation mode divides by, for a batch of `tokens`/`seqs`.

    Every mode is Σ(per-sequence term)/c; aggregating a unit loss with normalisers 1 and with
    the real counts gives c as their ratio, so no mode needs a second table of constants."""
    one = torch.ones(1, 1)
    unit = float(aggregate(one, one, mode, global_tokens=1, global_seqs=1))
    real = float(aggregate(one, one, mode, global_tokens=max(tokens, 1), global_seqs=max(seqs, 1)))
    return unit / real


@contextmanager
def part_rng(seed: int, version: int, part: int, device: str | torch.device) -> Iterator[None]:
    """Micro-batch `part` of the step from `version` draws its random numbers (LoRA dropout
    masks) from a stream of its own, seeded by (seed, version, part), and leaves the
    process's streams as they were.

    So the masks do not depend on the order in which the micro-batches of a step arrive (the
    first two train in either order, `tasks.order.parts_before`), nor on a replay
    after a worker died: the same step gives the same gradients, bit for bit."""
    digest = hashlib.blake2b(f"{seed}/{version}/{part}".encode(), digest_size=8).digest()
    derived = int.from_bytes(digest, "big") >> 1
    dev = torch.device(device)
    cuda = [dev.index or 0] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(derived)
        if cuda:
            torch.cuda.default_generators[cuda[0]].manual_seed(derived)
        yield


def kept_rows(
    advantages: torch.Tensor, enabled: bool, echo_mask: torch.Tensor | None = None
) -> torch.Tensor | None:
    """The rows of a micro-batch whose advantage is not exactly 0 or that carry an EchoRL
    clip (`echo_mask`, whose NLL term has a gradient at any advantage), or None for all.

    Zero-advantage skipping: with a policy loss that is 0 at A = 0 and no KL term, such a
    row's per-token loss is 0 for every parameter value, so its gradient is exactly 0 — in
    every aggregation mode, since each is Σ(per-sequence term)/constant and the constant
    comes from the counts, which still include the skipped rows. Leaving the row out of the
    forward and backward is then the same gradient for less compute (up to the float
    summation order of a smaller batch). The caller decides `enabled` (config, KL, loss)."""
    if not enabled:
        return None
    signal = advantages != 0
    if echo_mask is not None:
        signal = signal | (echo_mask.sum(dim=1) > 0)
    keep = torch.nonzero(signal).flatten()
    return None if len(keep) == len(advantages) else keep


@dataclass(slots=True)
class Accum:
    """Counts, loss and parts of the pending step; JSON-able, so it travels with the state."""

    global_tokens: int | None
    global_seqs: int | None
    step: int | None = None
    loss: float = 0.0
    finite: bool = True
    tokens: int = 0
    seqs: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    parts: dict[int, tuple[int, int]] = field(default_factory=dict)
    skipped_tokens: int = 0  # response tokens of zero-advantage rows left out (counted above)
    skipped_seqs: int = 0
    echo_tokens: int = 0  # response tokens under EchoRL's NLL term (loss.echo)

    def record(self, agent: str, part: int | None, tokens: int, seqs: int) -> None:
        """Count micro-batch `part` as accumulated; twice is a `StepMismatchError` (its rows
        would be counted double). `part` None: a step without exact accounting."""
        if part is None:
            return
        if part in self.parts:
            raise StepMismatchError(
                f"{agent}: micro-batch {part} of step {self.step} is already accumulated; "
                "accumulating it again would count its rows twice"
            )
        self.parts[part] = (tokens, seqs)

    def add(self, agent: str, other: Accum) -> None:
        """Take in a step holding only other micro-batches (a part back-propagated elsewhere,
        `tasks.grad_parts`): its parts are recorded (one already held raises), its sums
        added."""
        for part, (tokens, seqs) in sorted(other.parts.items()):
            self.record(agent, part, tokens, seqs)
        self.loss += other.loss
        self.finite &= other.finite
        self.tokens += other.tokens
        self.seqs += other.seqs
        self.skipped_tokens += other.skipped_tokens
        self.skipped_seqs += other.skipped_seqs
        self.echo_tokens += other.echo_tokens
        for k, v in other.metrics.items():
            self.metrics[k] = self.metrics.get(k, 0.0) + v

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["parts"] = [[j, t, s] for j, (t, s) in sorted(self.parts.items())]  # int keys
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Accum:
        parts = {int(j): (int(t), int(s)) for j, t, s in data.get("parts", [])}
        return cls(**{**data, "parts": parts})


def check_parts(agent: str, acc: Accum, expect: dict[int, tuple[int, int]]) -> None:
    """Refuse a step whose accumulated micro-batches are not exactly `expect` (micro-batch →
    (tokens, seqs)): a trainer rebuilt after a worker died must not step on a partial batch."""
    if acc.parts == expect:
        return
    missing = sorted(set(expect) - set(acc.parts))
    extra = sorted(set(acc.parts) - set(expect))
    raise StepMismatchError(
        f"{agent}: step {acc.step} holds micro-batches {sorted(acc.parts)} "
        f"(missing {missing}, unexpected {extra}, counts "
        f"{[(j, acc.parts.get(j), expect.get(j)) for j in sorted(expect)]}); "
        "refusing to step on a batch that is not the step's"
    )


def finish_normalisation(
    agent: str, acc: Accum, mode: str, params: Iterable[torch.nn.Parameter]
) -> None:
    """Divide a streamed step's summed gradients (and loss) by its batch's normaliser, now
    that the batch is known; a step declared up front must hold exactly what it declared."""
    if acc.global_tokens is None:
        scale = normaliser(mode, acc.tokens, acc.seqs)
        for p in params:
            if p.grad is not None:
                p.grad.div_(scale)
        acc.loss /= scale
    elif (acc.tokens, acc.seqs) != (acc.global_tokens, acc.global_seqs):
        raise ValueError(
            f"{agent}: micro-batches held {acc.tokens} tokens / {acc.seqs} seqs but "
            f"begin_step declared {acc.global_tokens} / {acc.global_seqs}; the loss "
            "normaliser would be wrong — pass the counts of the whole global batch"
        )
