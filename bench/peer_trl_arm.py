"""The TRL side of `bench.peer_trl`: one `GRPOTrainer` run, in a process of its own.

    python -m bench.peer_trl_arm JOB.json OUT.json

`bench.peer_trl` writes JOB.json (the shared job, the model, the prompts of every step, the
generation backend) and reads OUT.json (per-step wall times, rewards, completion lengths).
This is the only module of the project that imports TRL (the `bench` extra); it runs in its
own process so that TRL gets the machine's cores for torch (`bench.peer_trl.run_trl` sets
both thread variables: our clusters' nannies left `MKL_NUM_THREADS=1` in the driver's
environment) and a clean memory reading.

The reward is the project's own registered reward function (`workloads.rewards`), called
with the same `SampleView`/`TaskItem` values our scoring task builds.
"""

from __future__ import annotations

import itertools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def project_reward(name: str, node: str) -> Any:
    """TRL's reward-function signature around the project's reward `name` (same code,
    same inputs: the decoded completion and the task; no episode context is read)."""
    from workloads.datasets import TaskItem
    from workloads.rewards import EpisodeView, SampleView, get_reward

    fn = get_reward(name)

    def reward(
        prompts: list[str], completions: list[str], id: list[str], question: list[str],
        answer: list[str], **_: Any,
    ) -> list[float]:  # fmt: skip
        out = []
        for i, text in enumerate(completions):
            sample = SampleView(f"trl-{i}", node, text, ())
            out.append(float(fn(sample, EpisodeView({}), TaskItem(id[i], question[i], answer[i]))))
        return out

    reward.__name__ = name  # TRL logs each reward function under its name
    return reward


def grpo_config(job: dict[str, Any], out_dir: str, use_vllm: bool) -> Any:
    """TRL's knobs set to ours where a knob exists (bench.peer_trl's docstring lists them)."""
    from trl import GRPOConfig

    per_step = job["prompts"] * job["group"]
    extra: dict[str, Any] = {}
    if use_vllm:  # ours corrects the sampler gap per token, truncated at is_cap = 2
        extra = {
            "use_vllm": True,
            "vllm_mode": "colocate",
            "vllm_importance_sampling_mode": "token_truncate",
            "vllm_importance_sampling_clip_max": job["is_cap"],
            "vllm_enable_sleep_mode": False,
        }
    return GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,  # GRPOConfig's default is on; ours has none
        max_steps=job["steps"],
        learning_rate=job["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        adam_epsilon=1e-8,
        max_grad_norm=job["grad_clip"],
        optim="adamw_torch",
        per_device_train_batch_size=per_step // job["micro_batches"],
        gradient_accumulation_steps=job["micro_batches"],
        num_generations=job["group"],
        max_completion_length=job["max_tokens"],
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        beta=0.0,
        num_iterations=1,
        epsilon=job["clip_eps"],
        loss_type="dapo",  # token-level mean over the whole step = our token-mean
        scale_rewards="group",
        shuffle_dataset=False,  # the prompts in our order
        seed=job["seed"],
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **extra,
    )


class _StepClock:
    """A `TrainerCallback` that notes when each optimizer step ends."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.ends: list[float] = []

    def callback(self) -> Any:
        from transformers import TrainerCallback

        clock = self

        class Clock(TrainerCallback):
            def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock.t0 = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
                clock.ends.append(time.perf_counter())

        return Clock()

    def walls(self) -> list[float]:
        marks = [self.t0, *self.ends]
        return [round(b - a, 3) for a, b in itertools.pairwise(marks)]


def run(job: dict[str, Any]) -> dict[str, Any]:
    """One TRL run of `job`; step_s is the median step wall over steps ≥ 1, as ours."""
    import tempfile

    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    torch.manual_seed(job["seed"])
    tok = AutoTokenizer.from_pretrained(job["model"])
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    data = Dataset.from_list(job["rows"])
    clock = _StepClock()
    with tempfile.TemporaryDirectory() as out_dir:
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=project_reward(job["reward"], job["node"]),
            args=grpo_config(job, out_dir, job["backend"] == "vllm-colocate"),
            train_dataset=data,
            processing_class=tok,
            callbacks=[clock.callback()],
        )
        trainer.train()
        logs = [h for h in trainer.state.log_history if "reward" in h]
    walls = clock.walls()
    return {
        "steps": len(walls),
        "step_walls": walls,
        "step_s": round(statistics.median(walls[1:] or walls), 3),
        "reward_curve": [round(float(h["reward"]), 4) for h in logs],
        "completion_tokens": [round(float(h["completions/mean_length"]), 2) for h in logs],
        "threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> None:
    job_path, out_path = argv if argv is not None else sys.argv[1:]
    Path(out_path).write_text(json.dumps(run(json.loads(Path(job_path).read_text()))))


if __name__ == "__main__":
    main()
