"""Supervised warm start of a tiny model on a workload's task format.

RL needs a policy that sometimes earns reward, as real users start from an instruct model.
From a MEG we synthesise *reference episodes*: for each node, in topological order, the
completion that its reward function would score as right (the answer for answer-graded nodes,
the right verdict for verifiers), with a fraction of answers corrupted so verifiers see both
verdicts. Prompts are rendered with the node's real template, so the model learns exactly the
format the rollout will use. A short run leaves it partly right — the point of RL is the rest.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from meg import MEGSpec, topological_order
from meg.template import render, render_ids
from workloads.datasets import TaskItem, load_dataset
from workloads.rewards import is_correct

# reward fn -> completion it scores as right: (task, parent texts by node, corrupt?) -> text
Reference = Callable[[TaskItem, dict[str, str], random.Random], str]


def _answer(task: TaskItem, parents: dict[str, str], rng: random.Random) -> str:
    return f" {task.answer}"


def _shown(completion: str, task: TaskItem, rng: random.Random) -> str:
    """What children see of a node: half the answers corrupted, so verifiers meet both
    verdicts. The node itself is always taught the right completion."""
    if is_correct(completion, task) and rng.random() < 0.5:
        return f" {int(task.answer) + rng.choice([-2, -1, 1, 2])}"
    return completion


def _verdict(task: TaskItem, parents: dict[str, str], rng: random.Random) -> str:
    judged = next(iter(parents.values()), "")
    return " yes" if is_correct(judged, task) else " no"


REFERENCES: dict[str, Reference] = {
    "exact_answer": _answer,
    "team_final": _answer,
    "length_penalty": _answer,
    "verdict": _verdict,
}

# Optimizer steps per built-in workload: enough for the format, not for the arithmetic.
PRESET_STEPS = {"math-chain": 100, "debate": 100, "fanout": 100}


@dataclass(frozen=True, slots=True)
class Example:
    """One node of a reference episode: its template, what its parents said, the target."""

    template: str
    question: str
    parents: dict[str, str]
    completion: str

    @property
    def prompt(self) -> str:
        return render(self.template, {"question": self.question, **self.parents})


def reference_pairs(spec: MEGSpec, task: TaskItem, rng: random.Random) -> list[Example]:
    """One example per node of one synthetic reference episode, in topological order."""
    texts: dict[str, str] = {}
    pairs = []
    for name in topological_order(spec):
        node = spec.nodes[name]
        fn = spec.rewards[name].fn if name in spec.rewards else "exact_answer"
        if fn not in REFERENCES:
            raise KeyError(
                f"warm start: no reference completion for reward {fn!r}; "
                f"known: {', '.join(sorted(REFERENCES))}"
            )
        parents = {p: texts[p] for p in node.inputs}
        completion = REFERENCES[fn](task, parents, rng)
        pairs.append(Example(node.template, task.question, parents, completion))
        texts[name] = _shown(completion, task, rng)
    return pairs


@dataclass(frozen=True, slots=True)
class WarmStartReport:
    steps: int
    examples: int
    loss_first: float
    loss_last: float
    token_accuracy: float

    def summary(self) -> str:
        return (
            f"warm start: {self.steps} steps on {self.examples} examples, loss "
            f"{self.loss_first:.3f} -> {self.loss_last:.3f}, completion-token accuracy "
            f"{self.token_accuracy:.2f}"
        )


def _encode(tok: Any, pairs: list[Example]) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompt ids exactly as the rollout builds them (`render_ids`: template pieces encoded
    separately, parent answers spliced as ids), so the warm start teaches the very token
    sequences RL will sample from; completion ids + EOS."""

    def encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])

    newline = encode("\n")
    rows, masks = [], []
    for ex in pairs:
        shown = {name: [encode(text)] for name, text in ex.parents.items()}
        p = render_ids(
            ex.template, ex.question, shown, encode, eos_id=tok.eos_token_id, newline_ids=newline
        )
        c = [*encode(ex.completion), tok.eos_token_id]
        rows.append(p + c)
        masks.append([0] * len(p) + [1] * len(c))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width))
    for i, (r, m) in enumerate(zip(rows, masks, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float)
    return ids, mask


def warm_start(
    model_dir: str | Path,
    spec: MEGSpec,
    *,
    steps: int | None = None,
    batch: int = 64,
    lr: float = 1e-3,
    seed: int = 0,
) -> WarmStartReport:
    """Fine-tune `model_dir` in place on reference episodes of `spec`'s training split."""
    torch.manual_seed(seed)
    rng = random.Random(seed)
    steps = steps if steps is not None else PRESET_STEPS.get(spec.name, 60)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    tasks = load_dataset(spec.dataset).train
    losses: list[float] = []
    model.train()
    for _ in range(steps):
        pairs = [
            p
            for t in rng.sample(tasks, min(batch, len(tasks)))
            for p in reference_pairs(spec, t, rng)
        ]
        ids, mask = _encode(tok, pairs)
        logits = model(input_ids=ids, attention_mask=(ids != tok.pad_token_id) | (mask > 0)).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1)  # (B, T-1, V)
        nll = -logp.gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
        loss = (nll * mask[:, 1:]).sum() / mask[:, 1:].sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    with torch.no_grad():
        pairs = [
            p
            for t in rng.sample(tasks, min(256, len(tasks)))
            for p in reference_pairs(spec, t, rng)
        ]
        ids, mask = _encode(tok, pairs)
        pred = model(input_ids=ids).logits[:, :-1].argmax(-1)
        hit = ((pred == ids[:, 1:]).float() * mask[:, 1:]).sum() / mask[:, 1:].sum()
    model.save_pretrained(model_dir)
    return WarmStartReport(
        steps,
        steps * batch,
        losses[0] if losses else float("nan"),
        losses[-1] if losses else float("nan"),
        float(hit),
    )
