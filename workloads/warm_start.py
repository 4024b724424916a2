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
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from meg import MEGSpec, topological_order
from meg.expand import driver_of
from meg.registry import Registry
from meg.spec import ChatSpec
from meg.template import chat_frame, prompt_ids, render
from workloads.code_repair import reference_verdict
from workloads.code_tasks import reference_assertions, reference_code, shown_code
from workloads.datasets import TaskItem, load_dataset
from workloads.math_rewards import math_correct, math_reference
from workloads.rewards import is_correct
from workloads.tools import tool_reference

# reward fn -> completion it scores as right: (task, parent texts by node, rng) -> text
Reference = Callable[[TaskItem, dict[str, str], random.Random], str]
# what children see of a node's completion: (completion, task, rng) -> text
Shown = Callable[[str, TaskItem, random.Random], str]


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


_CALC = re.compile(r"<<[^>]*>>")  # GSM8K's calculator annotations: `= <<4*2=8>>8`
MAX_WORKED_CHARS = 48  # a longer worked solution (real GSM8K) is taught as the number alone


def math_completion(task: TaskItem) -> str:
    """The completion a `math_answer` node is taught: the task's worked solution on one line
    (`" 5 + 3 = 8"`, two steps `" 5 + 3 = 8, 8 - 2 = 6"`) when it is short, as the
    generator's are, else just the reference number (`" 72"`): what a tiny model can learn,
    and what math-verify parses back to the reference either way."""
    worked, sep, _ = task.answer.rpartition("####")
    lines = [ln.strip() for ln in _CALC.sub("", worked).splitlines() if ln.strip()]
    text = ", ".join(lines)
    if sep and text and len(text) <= MAX_WORKED_CHARS and math_correct(text, task):
        return f" {text}"
    return f" {math_reference(task.answer)}"


def _math_answer(task: TaskItem, parents: dict[str, str], rng: random.Random) -> str:
    return math_completion(task)


_LAST_NUMBER = re.compile(r"-?\d+(?!.*\d)", re.S)


def _math_shown(completion: str, task: TaskItem, rng: random.Random) -> str:
    """`_shown` for math answers: half the right completions shown with their final number
    off by 1 or 2 (`" 5 + 3 = 9"`), so the verifier and the reviser meet both verdicts."""
    m = _LAST_NUMBER.search(completion)
    if m is None or not math_correct(completion, task) or rng.random() >= 0.5:
        return completion
    value = int(m.group(0))
    wrong = value + rng.choice([-2, -1, 1, 2] if value >= 2 else [1, 2])
    return f"{completion[: m.start()]}{wrong}{completion[m.end() :]}"


def _math_verdict(task: TaskItem, parents: dict[str, str], rng: random.Random) -> str:
    judged = next(iter(parents.values()), "")
    return " yes" if math_correct(judged, task) else " no"


# Reward function -> the reference completion it scores as right. An entry's `shown`
# metadata is what the node's children see of it (default `_shown`).
REFERENCES: Registry[Reference] = Registry("warm-start reference")
REFERENCES.add("exact_answer", _answer)
REFERENCES.add("team_final", _answer)
REFERENCES.add("length_penalty", _answer)
REFERENCES.add("verdict", _verdict)
REFERENCES.add("math_answer", _math_answer, shown=_math_shown)
REFERENCES.add("math_verdict", _math_verdict)
REFERENCES.add("code_tests", reference_code, shown=shown_code)
REFERENCES.add("tests_passed", reference_code, shown=shown_code)  # code-repair's coder
REFERENCES.add("code_assertions", reference_assertions)
REFERENCES.add("repair_verdict", reference_verdict)

# Optimizer steps per built-in workload: enough for the format, not for the arithmetic.
PRESET_STEPS = {
    "math-chain": 100,
    "debate": 100,
    "fanout": 100,
    "word-problems": 180,
    "longtail": 200,
    "code": 200,
    "code-repair": 200,
}


@dataclass(frozen=True, slots=True)
class Example:
    """One node of a reference episode: its template, what its parents said, the target."""

    template: str
    question: str
    parents: dict[str, str]
    completion: str
    chat: ChatSpec | None = None  # the node's `chat:` (its prompt framed by the chat template)

    @property
    def prompt(self) -> str:
        return render(self.template, {"question": self.question, **self.parents})


def reference_pairs(spec: MEGSpec, task: TaskItem, rng: random.Random) -> list[Example]:
    """One example per LLM node of one synthetic reference episode, in topological order.

    A tool node is never trained: it gives no example, only the text its children read,
    the tool's reference observation (`workloads.tools`: `register_tool(..., reference=)`)
    of its driver input's text (its first input's where none drives). Every node is
    rendered, even one a `when:` or a loop's later round would skip: a code-repair episode
    teaches each round (the coder's shown code is wrong half the time, so later rounds see
    failing tests and the reviewer meets both verdicts)."""
    texts: dict[str, str] = {}
    pairs = []
    for name in topological_order(spec):
        node = spec.nodes[name]
        if node.tool is not None:
            source = driver_of(node) or next(iter(node.inputs))
            observe = tool_reference(node.tool.fn)
            texts[name] = observe(texts[source], task, **node.tool.params)
            continue
        fn = spec.rewards[name].fn if name in spec.rewards else "exact_answer"
        if fn not in REFERENCES:
            raise KeyError(
                f"warm start: no reference completion for reward {fn!r}; "
                f"known: {', '.join(sorted(REFERENCES))}"
            )
        parents = {p: texts[p] for p in node.inputs}
        completion = REFERENCES.get(fn)(task, parents, rng)
        pairs.append(Example(node.template, task.question, parents, completion, node.chat))
        shown: Shown = REFERENCES.meta(fn).get("shown", _shown)
        texts[name] = shown(completion, task, rng)
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
    """Prompt ids exactly as the rollout builds them (`prompt_ids`: template pieces encoded
    separately, parent answers spliced as ids, a `chat:` node inside its chat frame), so the
    warm start teaches the very token sequences RL will sample from; completion ids + EOS."""

    def encode(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"]) if text else []

    frames: dict[str | None, tuple[list[int], list[int]]] = {}

    def frame(chat: ChatSpec | None) -> tuple[list[int], list[int]] | None:
        if chat is None:
            return None
        if chat.system not in frames:
            before, after = chat_frame(tok, chat.system)
            frames[chat.system] = (encode(before), encode(after))
        return frames[chat.system]

    newline = encode("\n")
    rows, masks = [], []
    for ex in pairs:
        shown = {name: [encode(text)] for name, text in ex.parents.items()}
        p = prompt_ids(
            ex.template,
            frame(ex.chat),
            ex.question,
            shown,
            encode,
            eos_id=tok.eos_token_id,
            newline_ids=newline,
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
