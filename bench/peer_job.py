"""The job of the TRL peer benchmark (`bench.peer_trl`): one GRPO job, knob for knob, as
our MEG config and as TRL's dataset rows."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from meg.spec import DatasetSpec
from meg.template import render
from workloads.datasets import batch_for_step, load_dataset

NODE, AGENT, REWARD = "solve", "policy", "exact_answer"
MICRO_BATCHES = 2  # both sides: TRL's gradient-accumulation steps
TEMPLATE = "Q: {question}=\nA:"
DATASET = DatasetSpec(generator="arithmetic", params={"max_operand": 9}, train_size=2000)


@dataclass(frozen=True, slots=True)
class Job:
    """The GRPO job both frameworks run, knob for knob."""

    prompts: int
    group: int
    max_tokens: int
    steps: int
    lr: float = 5e-4
    grad_clip: float = 1.0
    clip_eps: float = 0.2
    is_cap: float = 2.0
    micro_batches: int = MICRO_BATCHES
    seed: int = 0

    @property
    def label(self) -> str:
        return f"{self.prompts}x{self.group}x{self.max_tokens}"


def parse_sizes(text: str, steps: int) -> list[Job]:
    """`8x4x32,64x4x128` → jobs (prompts × group × max tokens), each `steps` long."""
    jobs = []
    for part in text.split(","):
        p, g, t = (int(x) for x in part.lower().split("x"))
        jobs.append(Job(p, g, t, steps))
    return jobs


def meg_config(job: Job, model: str, out: Path, backend: str = "vllm") -> Path:
    """The one-node MEG of `job` with its agent on rollout `backend`, written next to the
    runs (`auto`: no `backend` written, the run chooses, as for a user who names none)."""
    data = {
        "name": f"peer-{job.label}",
        "description": "single-agent GRPO, the TRL peer benchmark's job",
        "agents": {
            AGENT: {
                "model": model,
                **({} if backend == "auto" else {"backend": backend}),
                "sampling": {"temperature": 1.0, "top_p": 1.0, "max_tokens": job.max_tokens},
                "optim": {"lr": job.lr, "grad_clip": job.grad_clip},
                "loss": {
                    "advantage": "grpo",
                    "policy_loss": "grpo",
                    "aggregation": "token-mean",
                    "clip_eps": job.clip_eps,
                    "kl_coef": 0.0,
                    "is_cap": job.is_cap,
                },
            }
        },
        "nodes": {NODE: {"agent": AGENT, "template": TEMPLATE, "n": job.group}},
        "rewards": {NODE: {"fn": REWARD}},
        "team_nodes": [NODE],
        "dataset": DATASET.model_dump(exclude_defaults=True),
        "run": {
            "steps": job.steps,
            "episodes_per_step": job.prompts,
            "micro_batches": job.micro_batches,
            "mode": "flex",
            "seed": job.seed,
        },
    }
    path = out / f"peer-{job.label}-{backend}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def trl_rows(job: Job) -> list[dict[str, str]]:
    """The prompts our run rolls out, step after step, as TRL dataset rows (unshuffled)."""
    splits = load_dataset(DATASET)
    return [
        {"prompt": render(TEMPLATE, {"question": t.question}), **asdict(t)}
        for k in range(job.steps)
        for t in batch_for_step(splits, k, job.prompts, job.seed)
    ]
