"""Checkpoints (safetensors + JSON, on any fsspec URL) and export to a HF model directory.

A checkpoint directory holds two objects, written tensors-first so that `meta.json` is the
commit marker (a directory without it is an unfinished write and is ignored)::

    <dir>/state.safetensors   model/…, optim/…, rng/cpu  (AgentTrainer.state())
    <dir>/meta.json           agent, model_path, version, skipped_steps, param groups, config,
                              digest: sha256 of every other file and of meta.json's own fields

A LoRA agent's checkpoint is also a PEFT adapter directory: its `model/` tensors are written
as `adapter_model.safetensors` + `adapter_config.json` (PEFT's layout, loadable by
`peft.PeftModel.from_pretrained` and vLLM), the rest (optimizer, RNG) in `state.safetensors`;
`meta.json` still goes last. How the files are written (a temp folder renamed into place on
a local disk) and checked: `checkpoint_files`.

Loading verifies the digest. `latest_checkpoint` and `restore_latest` skip a corrupt
checkpoint: it is renamed aside (`vNNNNNN.corrupt`, never deleted), a warning is logged and
the previous one is used; the training tasks then re-train the steps it held from the store
(`tasks.accounting`). A checkpoint from before digests loads unverified, with a note.

Never pickle; nothing here calls `torch.load`. Restoring then stepping reproduces the next
update bit-exactly (tested), because model, AdamW moments and step counters, and the CPU RNG
all round-trip without conversion.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save
from torch import Tensor

from engines.tokenizers import TOKENIZER_FILES
from engines.training.checkpoint_files import (
    META_FILE,
    STATE_FILE,
    CorruptCheckpointError,
    read_dir,
    remember_verified,
    seal,
    write_dir,
)
from engines.training.checkpoint_index import (
    checkpoint_dir,
    committed_checkpoints,
    prune_checkpoints,
    set_aside,
)
from engines.training.lora import (
    ADAPTER_WEIGHTS,
    LoraConfig,
    is_adapter_dir,
    merge_adapter,
    write_adapter,
)
from engines.training.train_config import DTYPES
from engines.training.trainer import AgentTrainer, TrainConfig
from storage.fs import open_fs

log = logging.getLogger(__name__)


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
    """Write a (tensors, meta) pair as a checkpoint directory at `url`: the tensor files,
    then `meta.json` with their sha256 (checkpoint_files). A failed write (a full disk:
    `CheckpointError` with errno ENOSPC) commits nothing; the previous checkpoint stays."""
    files: dict[str, bytes] = {}
    lora = meta.get("lora")
    if lora is not None:  # the agent's own weights as a PEFT adapter, beside the rest
        adapter = {k[len("model/") :]: v for k, v in tensors.items() if k.startswith("model/")}
        tensors = {k: v for k, v in tensors.items() if not k.startswith("model/")}
        files[ADAPTER_WEIGHTS] = st_save(
            {k: v.detach().cpu().contiguous() for k, v in adapter.items()}
        )
        files["adapter_config.json"] = json.dumps(lora, indent=1, sort_keys=True).encode()
    files[STATE_FILE] = st_save({k: v.detach().cpu() for k, v in _unshare(tensors).items()})
    write_dir(url, {**files, META_FILE: seal(meta, files)})
    remember_verified(url)  # written from these very bytes: no need to read them back


def _tensors(url: str, blobs: Mapping[str, bytes], name: str) -> dict[str, Tensor]:
    try:
        return st_load(blobs[name])
    except (SafetensorError, KeyError) as e:  # only reachable without a digest
        raise CorruptCheckpointError(f"checkpoint {url}: {name} cannot be read ({e})") from e


def load_checkpoint(url: str) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """Read a checkpoint directory → (tensors on CPU, meta), its digest verified.
    Raises FileNotFoundError if `meta.json` is missing (not a committed checkpoint),
    CorruptCheckpointError naming a damaged or missing file under it."""
    meta, blobs = read_dir(url, _needed(url))
    tensors = _tensors(url, blobs, STATE_FILE)
    if meta.get("lora") is not None:
        if ADAPTER_WEIGHTS not in blobs:
            raise CorruptCheckpointError(f"LoRA checkpoint {url}: {ADAPTER_WEIGHTS} is missing")
        adapter = _tensors(url, blobs, ADAPTER_WEIGHTS)
        tensors |= {f"model/{k}": v for k, v in adapter.items()}
    return tensors, meta


def _needed(url: str) -> tuple[str, ...]:
    """The files a load reads: the state, and the adapter of a LoRA checkpoint."""
    fs, path = open_fs(url)
    lora = fs.exists(f"{path}/{ADAPTER_WEIGHTS}")
    return (STATE_FILE, ADAPTER_WEIGHTS) if lora else (STATE_FILE,)


def save_checkpoint(trainer: AgentTrainer, url: str) -> None:
    """Checkpoint `trainer` (own weights, optimizer, RNG, version) into directory `url`."""
    save_state(url, trainer.state(), trainer.meta() | trainer.describe())


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


def restore_latest(
    root: str, device: str = "cpu", model_path: str | None = None
) -> AgentTrainer | None:
    """A trainer from the newest intact checkpoint under `root` (corrupt ones are set
    aside, as in `latest_checkpoint`), or None if there is none."""
    for url in reversed(committed_checkpoints(root)):
        try:
            return restore_trainer(url, device=device, model_path=model_path)
        except CorruptCheckpointError as e:
            set_aside(url, e)
    return None


def restore_trainer(url: str, device: str = "cpu", model_path: str | None = None) -> AgentTrainer:
    """Rebuild an AgentTrainer from a checkpoint: config and model path come from meta."""
    tensors, meta = load_checkpoint(url)
    cfg = dict(meta["config"])
    cfg["betas"] = tuple(cfg["betas"])
    cfg["lora"] = LoraConfig.from_json(cfg.get("lora"))
    trainer = AgentTrainer(
        meta["agent"], model_path or meta["model_path"], TrainConfig(**cfg), device
    )
    trainer.load_state(tensors, meta)
    return trainer


EXPORTS = ("adapter", "merged")


def _copy_tokenizer(src: Path, out: Path) -> None:
    if src.is_dir():
        for f in src.iterdir():
            if f.is_file() and TOKENIZER_FILES.match(f.name):
                shutil.copy2(f, out / f.name)


def export_hf(trainer: AgentTrainer, out_dir: str | Path, how: str = "adapter") -> Path:
    """Export the agent's policy for transformers, peft and vLLM; returns `out_dir`.

    Full weights: a HF model directory (config, safetensors, tokenizer files copied from a
    local source). LoRA (`how`): `adapter` writes a PEFT adapter directory (+ the tokenizer
    files) that `PeftModel.from_pretrained(base, out)` and vLLM's `LoRARequest` load;
    `merged` writes the HF model with the adapter folded in (through peft's own
    `merge_and_unload`) and the adapter beside it in `<out>/adapter`. `flexmarl.json` names
    the agent, its version and, for an adapter, its base model."""
    if how not in EXPORTS:
        raise ValueError(f"export {how!r} unknown; known: {', '.join(EXPORTS)}")
    out = Path(out_dir)
    info: dict[str, Any] = {"agent": trainer.agent, "version": trainer.version}
    if trainer.config.lora is None:
        weights = trainer.weights()  # in the agent's dtype; raises if the state is released
        state = {k: v.contiguous() for k, v in weights.items()}
        model: Any = trainer.model  # a transformers PreTrainedModel, float32 masters
        model.save_pretrained(out, state_dict=state)
        # config.json states the saved dtype (save_pretrained writes the module's, float32)
        config = json.loads((out / "config.json").read_text())
        config["dtype"] = trainer.config.dtype
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    else:
        adapter_dir = out if how == "adapter" else out / "adapter"
        write_adapter(adapter_dir, trainer.weights(), trainer.describe()["lora"])
        info["base_model"] = trainer.model_path
        if how == "merged":
            merge_adapter(trainer.model_path, adapter_dir, out, DTYPES[trainer.config.dtype])
    out.mkdir(parents=True, exist_ok=True)
    _copy_tokenizer(Path(trainer.model_path), out)
    (out / "flexmarl.json").write_text(json.dumps(info))
    return out


def merged_model_dir(export_dir: str | Path, base_model: str, dtype: str, tmp: Path) -> Path:
    """A HF model directory for an export: itself, or (a LoRA adapter export) the adapter
    merged into `base_model` under `tmp` (what the evaluator loads)."""
    src = Path(export_dir)
    if (src / "config.json").is_file() or not is_adapter_dir(src):
        return src
    out = merge_adapter(base_model, src, tmp, DTYPES[dtype])
    _copy_tokenizer(Path(base_model), out)
    return out
