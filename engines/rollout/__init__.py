"""Rollout Engine: token-in/token-out backends, model hosts and the load balancer.

Importing this package registers the `vllm` and `hf` backends; neither imports its heavy
library (vLLM, transformers) until a backend is constructed.
"""

from engines.rollout import hf_backend, vllm_backend  # noqa: F401 — registers the backends
from engines.rollout.base import (
    BadRequestError,
    Completion,
    HostCrashedError,
    ModelNotFoundError,
    PromptTooLongError,
    RolloutBackend,
    RolloutError,
    SamplingParams,
    UnknownBackendError,
    WeightUpdateError,
    known_backends,
    make_backend,
    register_backend,
)

__all__ = [
    "BadRequestError",
    "Completion",
    "HostCrashedError",
    "ModelNotFoundError",
    "PromptTooLongError",
    "RolloutBackend",
    "RolloutError",
    "SamplingParams",
    "UnknownBackendError",
    "WeightUpdateError",
    "known_backends",
    "make_backend",
    "register_backend",
]
