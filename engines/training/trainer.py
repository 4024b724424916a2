"""The per-agent trainer: micro-batch gradient accumulation, one optimizer step per batch.

Lifecycle of one step k of agent A::

    trainer.begin_step(global_tokens=N_tok, global_seqs=B)   # counts of the whole batch
    for mb in micro_batches:                                 # whole groups, any sizes b_j
        trainer.accumulate(mb)                               # forward + backward, grads add up
    result = trainer.step()                                  # clip, AdamW, version k → k+1

Because `aggregate` divides by the *global* counts, the accumulated gradient equals the
full-batch gradient exactly (see `aggregate.py`); `step` refuses to run if the micro-batches
did not add up to the declared counts, since the normaliser would then be wrong.

Streaming (deferred) normalisation: in the orchestrator, micro-batch j of step k is trained
while micro-batch j+1 is still being generated, so N_tok is unknown when accumulation starts.
`begin_step()` without counts accumulates the *sums* (normalisers 1) and `step()` divides the
gradients by the normaliser of the whole batch once it is known. Every aggregation mode is
Σ(per-sequence term)/constant (see `aggregate.py`), so this is the same gradient exactly.

Pending gradients are part of `state()`: the slot manager may swap an agent out between two
micro-batches of a step (another agent needs the slot) and the accumulation continues intact.

Exact step accounting: a step is a value — the step number and the micro-batches it must
contain. `begin_step(step=k)` opens it, `accumulate(mb, part=j)` records micro-batch j's
token and sequence counts (twice is an error: no micro-batch is counted double), and
`step(expect={j: (tokens, seqs)})` refuses to update unless the accumulated parts are exactly
the expected ones. A trainer rebuilt after a worker died therefore cannot step on a partial
batch: the task layer re-accumulates the missing micro-batches from the store first.

Numerics (docs/models.md): forward passes run in `eval()` mode (dropout off: a dropout mask
would make the trainer's logprobs a different policy from the sampler's, biasing every ratio);
logprobs are `log_softmax(logits / T)` at the agent's sampling temperature, over response
positions only (`token_logprobs`), rows grouped by length (`packing.py`); the PPO anchor is
chosen per agent (`old_logprobs`, see losses.py). Mixed precision: trainable weights, their
gradients and AdamW's moments are float32 masters whatever the agent's `dtype`; a bfloat16
agent computes its forward under `torch.autocast` (config.autocast) and publishes bf16
weights (`weights()`), so an update at lr 1e-6 is kept in the masters instead of rounding
away in a bf16 parameter.
With `kl_coef > 0` the reference logprobs come from the agent's initial policy: a frozen
copy shared by every trainer of the same (model, dtype, device) in the process, or for a
LoRA agent the shared base with the adapters off.

What the trainer trains is a `PolicyWeights` (`weights.py`): a whole model of its own, or a
LoRA adapter on the process's one base for that model (`bases.py`). The trainer never asks
which; it only makes its policy the active one around each forward + backward.

A non-finite loss or gradient skips the step: no optimizer update, gradients dropped,
weights and optimizer state bit-identical, `version` unchanged, the event counted in
`skipped_steps` and logged — never silently applied.

State (`state()` / `load_state()`): a flat `dict[str, Tensor]` + a JSON-able meta dict
(`trainer_state.py` says what is in it), so it goes through the StateStore and safetensors
unchanged. `release()` drops those tensors (the slot manager calls it after the state is
safely in the store); `load_state()` brings them back into the same module objects.
"""

from __future__ import annotations

import logging
import math
from contextlib import nullcontext
from typing import Any

import torch
from torch import Tensor, nn

from engines.training import trainer_state
from engines.training.accum import (
    Accum,
    check_parts,
    finish_normalisation,
    kept_rows,
    normaliser,
    part_rng,
)
from engines.training.aggregate import aggregate
from engines.training.batch import TrainMicroBatch
from engines.training.catalog import zero_at_zero_advantage
from engines.training.objective import sample_diagnostics, token_objective
from engines.training.packing import policy_logprobs
from engines.training.reference import reference_model
from engines.training.train_config import (
    DTYPES,
    StepMismatchError,
    StepResult,
    TrainConfig,
    autocast,
)
from engines.training.weights import PolicyWeights, make_weights

log = logging.getLogger(__name__)

__all__ = [
    "DTYPES",
    "AgentTrainer",
    "StepMismatchError",
    "StepResult",
    "TrainConfig",
    "normaliser",
    "reference_model",
]


class AgentTrainer:
    """Trainer state of one agent: model, AdamW, policy version. Plain torch, no Prefect."""

    def __init__(
        self, agent: str, model_path: str, config: TrainConfig, device: str = "cpu"
    ) -> None:
        self.agent = agent
        self.model_path = model_path
        self.config = config
        torch.manual_seed(config.seed)
        # the agent's own weights: a whole model, or an adapter on a shared base
        self.policy: PolicyWeights = make_weights(model_path, config, device)
        self.optimizer = self._optimizer()
        self.version = 0
        self.skipped_steps = 0
        self._released = False
        self._pending: Accum | None = None

    def _optimizer(self) -> torch.optim.Optimizer:
        """AdamW over the float32 masters; the fused kernel on a GPU (one launch for every
        parameter instead of several per tensor), torch's default elsewhere."""
        cfg = self.config
        fused = True if self.policy.device.type == "cuda" else None
        return torch.optim.AdamW(
            list(self.policy.trainable),
            lr=cfg.lr,
            betas=cfg.betas,
            weight_decay=cfg.weight_decay,
            fused=fused,
        )

    @property
    def device(self) -> torch.device:
        return self.policy.device

    @property
    def model(self) -> nn.Module:
        """The HF causal LM the forward passes run through (under LoRA: the shared base with
        this agent's adapter inside; `policy.active()` makes it the one in use)."""
        return self.policy.module

    @property
    def _names(self) -> dict[nn.Parameter, str]:
        return self.policy.trainable

    # ---- one step -------------------------------------------------------------------------
    def begin_step(
        self,
        global_tokens: int | None = None,
        global_seqs: int | None = None,
        *,
        step: int | None = None,
    ) -> None:
        """Declare the counts of the whole global batch that the next `step` consumes, or
        neither: then they are taken from the micro-batches at `step()` (streaming).
        `step` names the step being accumulated (`pending_step`).

        Any pending, un-stepped accumulation is discarded (a restarted step after a failed
        micro-batch task starts from zero gradients).
        """
        if (global_tokens is None) != (global_seqs is None):
            raise ValueError("begin_step: give both global_tokens and global_seqs, or neither")
        if global_tokens is not None and (global_tokens <= 0 or (global_seqs or 0) <= 0):
            raise ValueError(f"begin_step needs positive counts, got {global_tokens}/{global_seqs}")
        self._require_loaded()
        self.optimizer.zero_grad(set_to_none=True)
        self._pending = Accum(global_tokens, global_seqs, step)

    @property
    def pending(self) -> bool:
        """True between `begin_step()` and `step()`."""
        return self._pending is not None

    @property
    def pending_step(self) -> int | None:
        """The step number of the pending accumulation (None: none, or not declared)."""
        return None if self._pending is None else self._pending.step

    def pending_accum(self) -> Accum | None:
        """The pending step's record (what `trainer_state` saves and restores)."""
        return self._pending

    def set_pending(self, acc: Accum | None) -> None:
        self._pending = acc

    def rebuild_optimizer(self) -> None:
        """A new AdamW over the policy's current parameters (after a move to another base)."""
        self.optimizer = self._optimizer()

    @property
    def accumulated(self) -> dict[int, tuple[int, int]]:
        """Micro-batch → (tokens, seqs) accumulated into the pending step so far."""
        return {} if self._pending is None else dict(self._pending.parts)

    def accumulate_empty(self, part: int) -> None:
        """Record micro-batch `part` as accumulated with no rows (nothing to back-propagate)."""
        acc = self._pending
        if acc is None:
            raise RuntimeError(f"{self.agent}: accumulate_empty() before begin_step()")
        acc.record(self.agent, part, 0, 0)

    def accumulate(self, mb: TrainMicroBatch, part: int | None = None) -> dict[str, float]:
        """Forward + backward of one micro-batch; gradients add onto the pending step.

        `part` is the micro-batch's index within the step, for exact accounting."""
        acc = self._pending
        if acc is None:
            raise RuntimeError(f"{self.agent}: accumulate() before begin_step()")
        if part is not None and part in acc.parts:
            acc.record(self.agent, part, 0, 0)  # raises: already accumulated
        mb = mb.to(self.device)
        cfg = self.config
        full = mb
        keep = kept_rows(mb.advantages, self._skips_zero_advantage, mb.echo_mask)
        if keep is not None:
            mb = mb.rows(keep)
            acc.skipped_tokens += full.num_tokens - mb.num_tokens
            acc.skipped_seqs += full.num_seqs - mb.num_seqs
            if mb.num_seqs == 0:  # nothing left to back-propagate: counts only
                acc.tokens += full.num_tokens
                acc.record(self.agent, part, full.num_tokens, full.num_seqs)
                acc.seqs += full.num_seqs
                return {"loss": 0.0}
        ref = mb.ref_logprobs
        if cfg.kl_coef and ref is None:
            ref = self.reference_logprobs(mb)
        # the whole forward + backward under the agent's policy: the lm_head chunks are
        # recomputed during backward (activation checkpointing), with the same adapter on
        # and the same autocast state (checkpoint restores it); the backward itself runs
        # outside autocast, as torch recommends, into float32 master gradients
        # its own random stream when its index is known: the order of arrival changes nothing
        rng = part_rng(cfg.seed, self.version, part, self.device) if part is not None else None
        with self.policy.active(dropout=True), rng or nullcontext():
            with autocast(self.device, cfg.dtype):
                logp = self._logprobs(self.model, mb)  # (b,T) float32, 0 off the response
            loss_tok, metrics = token_objective(cfg, logp, mb, ref)
            if mb.echo_mask is not None and cfg.echo_coef:
                acc.echo_tokens += int(mb.echo_mask.sum())
            loss = aggregate(
                loss_tok,
                mb.response_mask,
                cfg.aggregation,
                global_tokens=acc.global_tokens or 1,  # streaming: sums now, normalised at step()
                global_seqs=acc.global_seqs or 1,
            )
            loss.backward()
        value = float(loss.detach())
        acc.loss += value
        acc.finite &= math.isfinite(value)
        acc.tokens += full.num_tokens
        acc.record(self.agent, part, full.num_tokens, full.num_seqs)  # after the backward
        acc.seqs += full.num_seqs
        out = {k: float(v) for k, v in metrics.items()} | sample_diagnostics(logp, mb)
        for k, v in out.items():  # token-weighted running mean of the diagnostics
            acc.metrics[k] = acc.metrics.get(k, 0.0) + v * mb.num_tokens
        out["loss"] = value
        return out

    def add_part(self, accum: Accum, grads: dict[str, Any]) -> None:
        """Add micro-batches back-propagated elsewhere at this trainer's version (`accum`: a
        step holding only them; `grads`: their summed gradients by parameter name), as if
        `accumulate` had run them here: the same sums, in the order they arrive."""
        acc = self._pending
        if acc is None:
            raise RuntimeError(f"{self.agent}: add_part() before begin_step()")
        params = {n: p for p, n in self._names.items()}
        unknown = sorted(set(grads) - set(params))
        if unknown:
            raise ValueError(f"{self.agent}: gradients of unknown parameters {unknown[:3]}")
        acc.add(self.agent, accum)  # first: a part already held raises before any gradient
        for name, array in grads.items():
            p = params[name]
            g = torch.as_tensor(array).to(p.device)
            if p.grad is None:
                p.grad = g
            else:
                p.grad.add_(g)

    @property
    def _skips_zero_advantage(self) -> bool:
        """Zero-advantage skipping is on and exact for this agent (`accum.kept_rows`)."""
        cfg = self.config
        return (
            cfg.skip_zero_advantage and not cfg.kl_coef and zero_at_zero_advantage(cfg.policy_loss)
        )

    @torch.no_grad()
    def reference_logprobs(self, mb: TrainMicroBatch) -> torch.Tensor:
        """log π_ref of the response tokens under the agent's initial policy. (b,T).

        Full weights: a frozen copy of the initial model, shared per (model, dtype, device).
        LoRA: the shared base with the adapters off (B = 0 at init: the same policy)."""
        with autocast(self.device, self.config.dtype):
            return self.policy.reference(lambda module: self._logprobs(module, mb))

    def _logprobs(self, module: nn.Module, mb: TrainMicroBatch) -> Tensor:
        """log π of `mb`'s response tokens (b,T) under `module`, batched as the agent's
        `packing` says (padded, or by length: the same values, `packing.py`)."""
        cfg = self.config
        ids, attn, resp = mb.input_ids, mb.attention_mask, mb.response_mask
        return policy_logprobs(
            module, ids, attn, resp, temperature=cfg.temperature, packing=cfg.packing
        )

    def step(self, expect: dict[int, tuple[int, int]] | None = None) -> StepResult:
        """Clip, AdamW step, zero grads, version += 1 — or skip on non-finite loss/grad.

        `expect`: micro-batch → (tokens, seqs) the step must consist of, exactly; anything
        else raises `StepMismatchError` and leaves the pending accumulation untouched."""
        acc = self._pending
        if expect is not None and acc is not None:
            check_parts(self.agent, acc, expect)
        if acc is None:
            raise RuntimeError(f"{self.agent}: step() without begin_step() + accumulate()")
        if acc.seqs == 0:  # every micro-batch empty (a loop whose turns were all skipped)
            return self._empty_step(acc)
        finish_normalisation(self.agent, acc, self.config.aggregation, self._names)
        self._pending = None
        params = list(self._names)
        max_norm = self.config.grad_clip if self.config.grad_clip > 0 else math.inf
        norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        metrics = {k: v / max(acc.tokens - acc.skipped_tokens, 1) for k, v in acc.metrics.items()}
        if self._skips_zero_advantage:
            metrics["zero_adv_skipped_frac"] = acc.skipped_seqs / acc.seqs
            for p in self._names:  # a step of only zero-advantage rows: zero, not no, grads
                if p.grad is None:  # (AdamW still moves its moments, as it would have)
                    p.grad = torch.zeros_like(p)
        if self.config.echo_coef:  # of the step's response tokens, those under EchoRL's NLL
            metrics["echo_frac"] = acc.echo_tokens / max(acc.tokens, 1)
        skipped = not (acc.finite and math.isfinite(norm))
        if skipped:
            self.skipped_steps += 1
            log.warning(
                "%s: step skipped at version %d (loss=%s, grad_norm=%s); %d skipped so far",
                self.agent,
                self.version,
                acc.loss,
                norm,
                self.skipped_steps,
            )
        else:
            self.optimizer.step()
            self.version += 1
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(
            self.version,
            skipped,
            acc.loss,
            norm,
            acc.tokens,
            acc.seqs,
            metrics,
            acc.step,
            dict(acc.parts),
        )

    def _empty_step(self, acc: Accum) -> StepResult:
        """A step whose micro-batches held no row: nothing to learn, so no update (AdamW's
        moments and weight decay stay as they are) and the version stays; recorded as a
        skipped step, as a non-finite one is, and the run goes on."""
        if not acc.parts:
            raise RuntimeError(f"{self.agent}: step() without begin_step() + accumulate()")
        self._pending = None
        log.info(
            "%s: step %s held no rows; no update (version %d)", self.agent, acc.step, self.version
        )
        return StepResult(self.version, True, 0.0, 0.0, 0, 0, {}, acc.step, dict(acc.parts))

    # ---- state ----------------------------------------------------------------------------
    def weights(self) -> dict[str, Tensor]:
        """What rollout hosts load, detached: HF checkpoint names (no tied alias) for a full
        model, in the agent's compute dtype (a bf16 copy of the float32 masters; no copy in
        float32); under LoRA the adapter only, with PEFT's saved names
        (`base_model.model.….lora_A.weight`) — what `adapter_model.safetensors` holds."""
        self._require_loaded()
        return self.policy.published()

    def describe(self) -> dict[str, Any]:
        """JSON-able facts published with the weights (`{"lora": adapter_config}` or {})."""
        return self.policy.describe()

    def state(self) -> dict[str, Tensor]:
        """Own weights + optimizer + RNG as one flat named tensor dict (no copies)."""
        self._require_loaded()
        return trainer_state.tensors_of(self)

    def meta(self) -> dict[str, Any]:
        """JSON-able counterpart of `state()`."""
        return trainer_state.meta_of(self)

    def load_state(
        self, tensors: dict[str, Tensor], meta: dict[str, Any], device: str | None = None
    ) -> None:
        """Inverse of `state()`/`meta()`; tensors are adopted (moved to the device, no copy).

        `device` rebinds the trainer to another device (a different slot) on the way in.
        """
        trainer_state.load_into(self, tensors, meta, device)
        self._released = False

    def release(self) -> None:
        """Drop the state's tensors (own weights, grads, optimizer state); modules remain."""
        self.policy.release()
        self.optimizer.state.clear()
        self._pending = None
        self._released = True

    def close(self) -> None:
        """Give back what the trainer shares (a LoRA adapter's place on its base); the
        trainer is unusable afterwards. The slot manager calls it when it forgets an agent."""
        self.policy.close()
        self._released = True

    @property
    def released(self) -> bool:
        return self._released

    def _require_loaded(self) -> None:
        if self._released:
            raise RuntimeError(f"{self.agent}: trainer state is released; load_state() first")
