"""Checkpoints (safetensors + JSON, on any fsspec URL) and export to a HF model directory.

A checkpoint directory holds exactly two objects, written tensors-first so that `meta.json`
is the commit marker (a directory without it is an unfinished write and is ignored)::

    <dir>/state.safetensors   model/…, optim/…, rng/cpu  (AgentTrainer.state())
    <dir>/meta.json           agent, model_path, version, skipped_steps, param groups, config

Never pickle; nothing here calls `torch.load`. Restoring then stepping reproduces the next
update bit-exactly (tested), because model, AdamW moments and step counters, and the CPU RNG
all round-trip without conversion.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import fsspec
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from engines.training.lora import LoraConfig, save_adapter
from engines.training.trainer import AgentTrainer, TrainConfig

STATE_FILE = "state.safetensors"
META_FILE = "meta.json"
TOKENIZER_FILES = re.compile(
    r"^(tokenizer.*|special_tokens_map\.json|added_tokens\.json|vocab\..*|merges\.txt"
    r"|.*\.model|chat_template.*)$"
)


def _unshare(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """safetensors refuses aliased storage (tied embeddings): clone the later aliases."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for k, v in tensors.items():
        key = (v.untyped_storage().data_ptr(), int(v.storage_offset())) if v.numel() else (0, id(v))
        out[k] = v.clone() if key in seen else v.contiguous()
        seen.add(key)
    return out


def save_state(url: str, tensors: dict[str, Tensor], meta: dict[str, Any]) -> None:
    """Write a (tensors, meta) pair as a checkpoint directory at `url` (tensors first)."""
    fs, path = fsspec.core.url_to_fs(url)
    fs.makedirs(path, exist_ok=True)
    cpu = {k: v.detach().cpu() for k, v in _unshare(tensors).items()}
    with fs.open(f"{path}/{STATE_FILE}", "wb") as f:
        f.write(st_save(cpu))
    with fs.open(f"{path}/{META_FILE}", "w") as f:
        json.dump(meta, f, indent=1, sort_keys=True)


def load_checkpoint(url: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read a checkpoint directory → (tensors on CPU, meta). Raises naming the missing file."""
    fs, path = fsspec.core.url_to_fs(url)
    for name in (META_FILE, STATE_FILE):
        if not fs.exists(f"{path}/{name}"):
            raise FileNotFoundError(f"checkpoint {url!r} has no {name} (unfinished or wrong dir)")
    with fs.open(f"{path}/{META_FILE}", "r") as f:
        meta = json.load(f)
    with fs.open(f"{path}/{STATE_FILE}", "rb") as f:
        tensors = st_load(f.read())
    return tensors, meta


def save_checkpoint(trainer: AgentTrainer, url: str) -> None:
    """Checkpoint `trainer` (model, optimizer, RNG, version) into directory `url`."""
    save_state(url, trainer.state(), trainer.meta())


def checkpoint_dir(root: str, version: int) -> str:
    return f"{root.rstrip('/')}/v{version:06d}"


def maybe_checkpoint(
    trainer: AgentTrainer, root: str, every: int, keep: int | None = None
) -> str | None:
    """Checkpoint every `every` policy versions into `<root>/v{version:06d}`; return its URL.

    `keep`: afterwards delete all but the newest `keep` committed checkpoints (None: keep
    all). Resume and `--checkpoint` only read the newest; with full optimizer state, keeping
    every step's checkpoint fills disks (1 GB for the 100-step default run of two tiny
    models)."""
    if every <= 0:
        raise ValueError(f"checkpoint interval must be > 0, got {every}")
    if keep is not None and keep < 1:
        raise ValueError(f"checkpoints to keep must be >= 1, got {keep}")
    if trainer.version == 0 or trainer.version % every:
        return None
    url = checkpoint_dir(root, trainer.version)
    save_checkpoint(trainer, url)
    if keep is not None:
        prune_checkpoints(root, keep)
    return url


def committed_checkpoints(root: str) -> list[str]:
    """URLs of the committed checkpoints under `root` (meta.json written), oldest first."""
    fs, path = fsspec.core.url_to_fs(root)
    if not fs.exists(path):
        return []
    found = sorted(
        p.rstrip("/").rsplit("/", 1)[1]
        for p in fs.ls(path, detail=False)
        if re.fullmatch(r"v\d{6}", p.rstrip("/").rsplit("/", 1)[1])
        and fs.exists(f"{p.rstrip('/')}/{META_FILE}")
    )
    return [f"{root.rstrip('/')}/{name}" for name in found]


def prune_checkpoints(root: str, keep: int) -> list[str]:
    """Delete all but the newest `keep` committed checkpoints; return the deleted URLs.
    Uncommitted directories (a write in progress or cut short) are left alone."""
    old = committed_checkpoints(root)[:-keep]
    for url in old:
        fs, path = fsspec.core.url_to_fs(url)
        fs.rm(f"{path}/{META_FILE}")  # uncommit first: a cut-short delete is then ignored
        fs.rm(path, recursive=True)
    return old


def latest_checkpoint(root: str) -> str | None:
    """URL of the committed checkpoint with the highest version under `root`, or None."""
    found = committed_checkpoints(root)
    return found[-1] if found else None


def restore_trainer(url: str, device: str = "cpu", model_path: str | None = None) -> AgentTrainer:
    """Rebuild an AgentTrainer from a checkpoint: config and model path come from meta."""
    tensors, meta = load_checkpoint(url)
    cfg = dict(meta["config"])
    cfg["betas"] = tuple(cfg["betas"])
    if cfg.get("lora") is not None:
        lora = dict(cfg["lora"])
        cfg["lora"] = LoraConfig(**{**lora, "target_modules": tuple(lora["target_modules"])})
    trainer = AgentTrainer(
        meta["agent"], model_path or meta["model_path"], TrainConfig(**cfg), device
    )
    trainer.load_state(tensors, meta)
    return trainer


def export_hf(trainer: AgentTrainer, out_dir: str | Path) -> Path:
    """Write a HF model directory (config, safetensors, tokenizer files copied from the source).

    transformers' `from_pretrained` and vLLM load it; the evaluator uses it. Tokenizer files
    are copied only when the source is a local directory. Under LoRA the adapter is merged
    into the written weights, and also written unmerged (PEFT format) to `<out>/adapter`.
    """
    out = Path(out_dir)
    merged = trainer.merged_weights()  # raises if the state is released
    trainer.model.save_pretrained(out, state_dict={k: v.contiguous() for k, v in merged.items()})
    if trainer.config.lora is not None:
        save_adapter(trainer.weights(), trainer.config.lora, trainer.model_path, out / "adapter")
    src = Path(trainer.model_path)
    if src.is_dir():
        for f in src.iterdir():
            if f.is_file() and TOKENIZER_FILES.match(f.name):
                shutil.copy2(f, out / f.name)
    info = {"agent": trainer.agent, "version": trainer.version}
    (out / "flexmarl.json").write_text(json.dumps(info))
    return out
