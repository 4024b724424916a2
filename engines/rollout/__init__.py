"""Rollout Engine: token-in/token-out backends (`base`, `hf_backend`, `vllm_backend`), model
hosts (`hosts`) and the load balancer (`balancer`).

Import what you use from its module (`engines.rollout.base.make_backend`). This package
imports nothing itself, so that the driver can use the pure-Python balancer without torch;
the backends are registered by `engines.rollout.base.BACKENDS`, which names their modules.
"""
