"""The rollout backend protocol: token ids in, token ids + behaviour logprobs out.

Both backends (`vllm`, `hf`) return, for every sampled token, its log-probability under the
distribution it was *sampled from*: `log_softmax(logits / T)` restricted to the top-p
nucleus (vLLM's `processed_logprobs`). That is the behaviour policy μ exactly. The trainer
computes `log_softmax(logits / T)` over the whole vocabulary (as verl and TRL do), so with
`top_p = 1` (the default) the two agree up to float noise whenever the weights are the same;
with `top_p < 1` the stored logprob is the renormalised in-nucleus one, ≥ the trainer's, and
the truncated importance weight of the `recompute` anchor absorbs the gap (losses.py).
Storing temperature-1 logprobs while sampling at T ≠ 1 would make the trainer optimise the
T = 1 policy while the sampler follows another one.

Response ids include the stop token when generation stops on EOS or a stop id (so the
trainer learns to stop); `finish_reason` is "stop" in that case and "length" when the
token budget (or the model context) ran out.

A `Cut` stops a batch before every request ends (the `april` rollout policy): requests are
grouped by episode, and once `quota` groups have every request finished (and every group in
`must_finish` too), the rest stop where they are, with finish_reason "partial" and the tokens
and logprobs they have so far. Both backends decide it after each decode step, so the cut is
a function of the tokens drawn, never of wall-clock time: a re-run cuts at the same place.

A `Watch` stops single requests instead (the `rollverify` and `darts` rollout policies):
each running request is shown to `watch.stop(i, tokens)` every `watch.every` tokens and
after every decode step in which a request of the batch ended (`watch.finish(i)`); one it
stops comes back with the tokens it has and finish_reason `watch.reason`. Also decided
from the tokens alone, so a re-run stops the same requests at the same tokens.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from engines.families import max_positions
from meg.registry import Registry

if TYPE_CHECKING:  # the driver imports this module (errors, SamplingParams) and never torch
    from torch import Tensor

FINISH_REASONS = ("stop", "length", "partial", "verified", "dropped")


class RolloutError(Exception):
    """Base class of every error the rollout engine raises on purpose."""


class UnknownBackendError(RolloutError, KeyError):
    def __str__(self) -> str:  # KeyError would print the repr with quotes
        return str(self.args[0])


class ModelNotFoundError(RolloutError, FileNotFoundError):
    pass


class PromptTooLongError(RolloutError, ValueError):
    pass


class BadRequestError(RolloutError, ValueError):
    """Malformed prompts or sampling parameters."""


class WeightUpdateError(RolloutError, ValueError):
    """Wrong tensor names / shapes, or a version that does not move forward."""


class HostCrashedError(RolloutError, RuntimeError):
    """The model host died mid-request; the caller retries on a (re-created) host."""


@dataclass(frozen=True, slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 64
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    speculate: Speculation | None = None  # draft from earlier rollouts (hf backend only)
    sparse_kv: SparseKV | None = None  # a bounded KV cache per sequence (hf backend only)

    def __post_init__(self) -> None:
        if self.n < 1:
            raise BadRequestError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.max_tokens < 1:
            raise BadRequestError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature <= 0:
            raise BadRequestError(
                f"SamplingParams.temperature must be > 0, got {self.temperature} "
                "(greedy decoding is not a policy; use a small temperature instead)"
            )
        if not 0 < self.top_p <= 1:
            raise BadRequestError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True, slots=True)
class Speculation:
    """Speculative rollout (SRT, `engines.rollout.speculative`): `draft` tokens proposed per
    forward pass from earlier rollouts of the same prompt, suffixes of up to `match` tokens
    looked up, the last `history` completions of each prompt kept by the engine."""

    draft: int = 4
    match: int = 3
    history: int = 16

    def __post_init__(self) -> None:
        if self.draft < 1 or self.match < 1 or self.history < 0:
            raise BadRequestError(f"Speculation needs draft, match >= 1, history >= 0: {self}")


@dataclass(frozen=True, slots=True)
class SparseKV:
    """Sparse-KV rollout (Sparse-RL, `engines.rollout.sparse_kv`): each layer's cache keeps
    at most `budget` entries per sequence and KV head — the first `sinks` (attention sinks),
    the last `window` (the recent tokens, whose queries also score the rest) and the entries
    those queries attended most — compressed each time `every` entries were added past it."""

    budget: int = 64
    sinks: int = 4
    window: int = 8
    every: int = 8

    def __post_init__(self) -> None:
        if self.sinks < 0 or self.window < 1 or self.every < 1:
            raise BadRequestError(f"SparseKV needs sinks >= 0, window >= 1, every >= 1: {self}")
        if self.sinks + self.window > self.budget:
            raise BadRequestError(f"SparseKV: sinks + window exceed the budget: {self}")


@dataclass(frozen=True, slots=True)
class Completion:
    response_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # logprob of each response id under the sampling distribution
    finish_reason: str  # "stop" | "length"


@dataclass(frozen=True, slots=True)
class Cut:
    """Stop early once enough groups are complete (see the module docstring).

    With a cut every prompt is one request (`SamplingParams.n == 1`): a group's samples are
    separate prompts, so a continued sample can carry its own prefix and budget."""

    groups: tuple[int, ...]  # the group (episode) of each prompt
    quota: int  # stop once this many groups have every request finished ...
    must_finish: frozenset[int] = frozenset()  # ... and every one of these groups
    max_tokens: tuple[int, ...] = ()  # new-token budget per prompt; () = params.max_tokens

    def check(self, n_prompts: int, params: SamplingParams) -> None:
        if params.n != 1:
            raise BadRequestError(f"a Cut needs one request per prompt (n=1), got n={params.n}")
        if len(self.groups) != n_prompts:
            raise BadRequestError(
                f"Cut.groups has {len(self.groups)} entries for {n_prompts} prompts"
            )
        if self.max_tokens and len(self.max_tokens) != n_prompts:
            raise BadRequestError(
                f"Cut.max_tokens has {len(self.max_tokens)} entries for {n_prompts} prompts"
            )
        if any(t < 1 for t in self.max_tokens):
            raise BadRequestError("Cut.max_tokens must all be >= 1")

    def budget(self, i: int, prompt_len: int, params: SamplingParams, context: int) -> int:
        limit = self.max_tokens[i] if self.max_tokens else params.max_tokens
        return min(limit, context - prompt_len)


class CutTracker:
    """Counts finished requests per group; `reached()` once the cut may happen."""

    def __init__(self, cut: Cut) -> None:
        self.cut = cut
        self.left: dict[int, int] = {}
        for g in cut.groups:
            self.left[g] = self.left.get(g, 0) + 1
        self.complete = 0

    def finish(self, i: int) -> None:
        g = self.cut.groups[i]
        self.left[g] -= 1
        if self.left[g] == 0:
            self.complete += 1

    def reached(self) -> bool:
        return self.complete >= self.cut.quota and all(
            self.left.get(g, 0) == 0 for g in self.cut.must_finish
        )


@runtime_checkable
class Watch(Protocol):
    """Stops single requests of a batch before they end (see the module docstring). With a
    watch every prompt is one request (`SamplingParams.n == 1`): request i is prompt i."""

    every: int  # tokens between two looks at a running request
    reason: str  # the finish_reason of a request it stopped

    def finish(self, i: int) -> None:
        """Request i ended on its own (a stop token or its budget)."""

    def stop(self, i: int, tokens: Sequence[int]) -> bool:
        """Request i is running with `tokens` so far: stop it now?"""
        ...


def check_watch(watch: Watch, cut: Cut | None, params: SamplingParams) -> None:
    if cut is not None:
        raise BadRequestError("a batch takes a Cut or a Watch, not both")
    if params.n != 1:
        raise BadRequestError(f"a Watch needs one request per prompt (n=1), got n={params.n}")
    if watch.every < 1 or watch.reason not in FINISH_REASONS:
        raise BadRequestError(f"Watch.every must be >= 1 and reason one of {FINISH_REASONS}")


def check_request(
    prompts: Sequence[Sequence[int]],
    params: SamplingParams,
    context: int,
    vocab: int,
    cut: Cut | None,
    watch: Watch | None,
) -> None:
    """What every backend's `generate` checks before it samples: the prompts fit the model
    (`check_prompts`), a cut or a watch (not both) fits the batch, and a speculative or
    sparse-KV rollout comes without either (they stop no request)."""
    check_prompts(prompts, context, vocab)
    if cut is not None:
        cut.check(len(prompts), params)
    if watch is not None:
        check_watch(watch, cut, params)
    if params.speculate is not None and (cut is not None or watch is not None):
        raise BadRequestError("speculative rollout stops no request: no cut or watch")
    if params.sparse_kv is not None and (
        cut is not None or watch is not None or params.speculate is not None
    ):
        raise BadRequestError("a sparse-KV rollout takes no cut, watch or speculation")


@dataclass(frozen=True, slots=True)
class AdapterServing:
    """What an engine must know up front to serve LoRA adapters on its base: how many
    adapters may be resident at once (the agents sharing the base; one more is loaded
    transiently while a version replaces the previous one) and the largest rank."""

    max_adapters: int
    max_rank: int

    def __post_init__(self) -> None:
        if self.max_adapters < 1 or self.max_rank < 1:
            raise ValueError(f"AdapterServing needs max_adapters, max_rank >= 1; got {self}")


class AdapterError(RolloutError, ValueError):
    """An adapter that this engine cannot load or does not hold."""


@runtime_checkable
class RolloutBackend(Protocol):
    """Token-in/token-out sampling. A backend built with `adapters=AdapterServing(...)`
    also serves LoRA adapters on its base: `load_adapter` / `remove_adapter` by name, and
    `generate(..., adapter=name)` samples with one (None: the base itself)."""

    name: str
    version: int
    model_path: str

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        adapter: str | None = None,
        cut: Cut | None = None,
        watch: Watch | None = None,
    ) -> list[list[Completion]]:
        """Return completions indexed [prompt][sample] (len(prompts) × params.n); with a
        `cut`, requests still running when it is reached come back "partial"; with a
        `watch`, those it stops come back with `watch.reason`. Every backend first checks
        the request with `check_request`."""
        ...

    def load_adapter(self, name: str, tensors: dict[str, Tensor], config: dict[str, Any]) -> None:
        """Make adapter `name` (PEFT saved names, adapter_config.json) servable."""
        ...

    def remove_adapter(self, name: str) -> None:
        """Forget adapter `name` (its memory is freed once no request uses it)."""
        ...

    def update_weights(self, tensors: dict[str, Tensor], version: int) -> None:
        """Replace all weights in place (HF parameter names); `version` must increase."""
        ...

    def reset(self) -> None:
        """Back to the state of an engine just built from `model_path`: the directory's own
        weights as version 0, no adapters, nothing cached from earlier prompts. How a
        long-lived worker hands one run's engine to the next (`hosts.adopt_host`)."""
        ...

    def max_context(self) -> int: ...


BACKENDS: Registry[Callable[..., RolloutBackend]] = Registry(
    "rollout backend", builtins=("engines.rollout.hf_backend", "engines.rollout.vllm_backend")
)


def register_backend(name: str) -> Callable[[type], type]:
    """Class decorator: `@register_backend("vllm")`."""

    def deco(cls: type) -> type:
        BACKENDS.add(name, cls)
        return cls

    return deco


def known_backends() -> list[str]:
    return BACKENDS.names()


def make_backend(name: str, model_path: str | Path, **opts: Any) -> RolloutBackend:
    """Build a registered backend; an unknown name raises listing the known ones."""
    if name == "auto":  # a MEG's default: made concrete when a run or evaluation is planned
        raise UnknownBackendError(
            "backend 'auto' is chosen when a run is planned (flows.runs.engine_choice."
            f"choose_engines); pass a spec that went through it, or one of {known_backends()}"
        )
    try:
        cls = BACKENDS.get(name)
    except KeyError as e:
        raise UnknownBackendError(str(e)) from None
    return cls(model_path, **opts)


# ---- helpers shared by the backends -------------------------------------------------------


def check_model_dir(model_path: str | Path) -> Path:
    """A local HF model directory with a config.json, or a clear error naming the path."""
    p = Path(model_path)
    if not p.is_dir():
        raise ModelNotFoundError(f"model directory {p} does not exist")
    if not (p / "config.json").is_file():
        raise ModelNotFoundError(f"model directory {p} has no config.json (not a HF model)")
    return p


def config_max_positions(model_dir: Path) -> int:
    return max_positions(json.loads((model_dir / "config.json").read_text()))


def check_prompts(prompts: Sequence[Sequence[int]], context: int, vocab: int) -> None:
    """Every prompt non-empty, ids in range, and leaving room for at least one new token."""
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise BadRequestError(f"prompt {i} is empty; give at least one token id (e.g. BOS)")
        if len(p) >= context:
            raise PromptTooLongError(
                f"prompt {i} has {len(p)} tokens; the model context is {context}, "
                "which leaves no room for a response — shorten the prompt"
            )
        bad = [t for t in p if not 0 <= int(t) < vocab]
        if bad:
            raise BadRequestError(f"prompt {i} has token ids outside [0, {vocab}): {bad[:5]}")


def budget(prompt_len: int, params: SamplingParams, context: int) -> int:
    """New tokens allowed for one prompt: max_tokens, capped by what the context leaves."""
    return min(params.max_tokens, context - prompt_len)


def base_weights(model_dir: str | Path) -> dict[str, Tensor]:
    """The weights a model directory holds (every `*.safetensors` shard), by HF name."""
    from safetensors.torch import load_file

    out: dict[str, Tensor] = {}
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        out |= load_file(str(f))
    return out


def check_weights(
    tensors: dict[str, Tensor], expected: dict[str, tuple[int, ...]], current: int, version: int
) -> None:
    """Full state dict with HF names and shapes, and a version newer than the loaded one."""
    if version <= current:
        raise WeightUpdateError(
            f"weight version {version} is not newer than the loaded version {current}"
        )
    missing = sorted(set(expected) - set(tensors))
    unknown = sorted(set(tensors) - set(expected))
    if missing or unknown:
        raise WeightUpdateError(
            f"update_weights needs the full HF state dict: missing {missing[:5]}, "
            f"unknown {unknown[:5]} (expected names like {sorted(expected)[:3]})"
        )
    for k, shape in expected.items():
        if tuple(tensors[k].shape) != shape:
            raise WeightUpdateError(
                f"tensor {k!r} has shape {tuple(tensors[k].shape)}, expected {shape}"
            )
