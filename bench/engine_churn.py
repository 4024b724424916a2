"""vLLM engines built and closed one after another in one process: does the process grow?

    python -m bench.engine_churn [--engines N] [--vocab V] [--small] [--json PATH]

What a long-lived rollout worker does when its runs change models (every run rebuilds its
engines; `bench/reuse.py` measures whole runs). Two arms, each in a fresh process, building
N engines of one model in turn, each sampling, updated with new weights (as in every run),
sampling again and closed, and reading the process's RSS after each:

- `kept`: what vLLM keeps of a closed engine left as it is (the project before 2026-12-07):
  its process-wide memos, and its layers' entries in the layerwise-reload table;
- `cleared`: `engines.rollout.vllm_engines.forget_vllm_caches` on every close and
  `forget_reload_info` before every shutdown (the default).

The model is a random qwen2 (151,936 embeddings) whose tokenizer is replaced by a word-level
one of `--vocab` tokens (151,000 by default, about a real Qwen tokenizer's 151,665): vLLM
keeps deep copies of the tokenizer per engine, and the tiny models' 512-token tokenizers hide
what they cost.

Keys: `rss_mib_per_engine_kept` / `_cleared` = (RSS after the last engine − RSS after the
second) / (N − 2), in MiB (the first engine fills the process's one-time caches);
`churn_growth_ratio` = cleared / kept.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path
from typing import Any

from bench.common import cpu_model, write_results
from bench.rss import rss_bytes

ARMS = ("kept", "cleared")
WARM = 2  # engines before the growth is measured


def big_tokenizer_model(out: Path, vocab: int) -> Path:
    """A random qwen2 model dir whose tokenizer is a word-level one of `vocab` tokens (the
    tiny model's own tokens first, so its specials keep their ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    from workloads.tiny_model import build_tiny_model

    build_tiny_model(out, family="qwen2")
    small = AutoTokenizer.from_pretrained(out)
    words = dict(small.get_vocab())
    i = 0
    while len(words) < vocab:
        words.setdefault(f"w{i}", len(words))
        i += 1
    unk = small.unk_token or small.eos_token
    tok = Tokenizer(models.WordLevel(words, unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = {k: getattr(small, k) for k in ("eos_token", "bos_token", "pad_token")}
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token=unk, **specials)
    for f in out.glob("tokenizer*"):
        f.unlink()
    fast.save_pretrained(out)
    return out


def churn(model: str, arm: str, count: int) -> list[float]:
    """RSS (MiB) of this process after each of `count` engines is built, used and closed."""
    import gc

    from safetensors.torch import load_file

    import engines.rollout.vllm_engines as vllm_engines
    from engines.rollout.base import SamplingParams, make_backend

    if arm == "kept":  # the project before 2026-12-07
        vllm_engines.forget_vllm_caches = lambda: None
        vllm_engines.forget_reload_info = lambda llm: None
    weights = load_file(str(Path(model) / "model.safetensors"))
    out = []
    for _ in range(count):
        backend = make_backend("vllm", model)
        prompt = [[5, 6, 7]]
        backend.generate(prompt, SamplingParams(n=1, max_tokens=2, seed=1))
        backend.update_weights(weights, 1)  # as every run's engines are updated
        backend.generate(prompt, SamplingParams(n=1, max_tokens=2, seed=1))
        backend.close()  # type: ignore[attr-defined]
        del backend
        gc.collect()
        out.append(round(rss_bytes() / 2**20, 1))
    return out


def per_engine(rss: list[float]) -> float:
    """MiB a closed engine leaves behind, after the first `WARM` engines."""
    return round((rss[-1] - rss[WARM - 1]) / (len(rss) - WARM), 2)


def run_arm(model: Path, arm: str, engines: int) -> list[float]:
    """One arm in a fresh process (nothing of the other arm's engines in it)."""
    cmd = [sys.executable, "-m", "bench.engine_churn", "--arm", arm, "--model", str(model)]
    out = subprocess.run(
        [*cmd, "--engines", str(engines)], capture_output=True, text=True, timeout=1800
    )
    if out.returncode != 0:
        raise RuntimeError(f"arm {arm} failed:\n{out.stderr[-4000:]}")
    rss: list[float] = json.loads(out.stdout.strip().splitlines()[-1])
    return rss


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engines", type=int, default=6, help="engines per arm (at least 3)")
    ap.add_argument("--vocab", type=int, default=151_000, help="tokens of the tokenizer")
    ap.add_argument("--small", action="store_true", help="3 engines, a 20,000-token tokenizer")
    ap.add_argument("--json", default="bench/results/engine_churn.json")
    ap.add_argument("--arm", choices=ARMS, help=argparse.SUPPRESS)  # one arm's own process
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.arm:
        print(json.dumps(churn(args.model, args.arm, args.engines)))
        return {}
    engines, vocab = (3, 20_000) if args.small else (args.engines, args.vocab)
    if engines <= WARM:
        ap.error(f"--engines must be at least {WARM + 1}")
    with tempfile.TemporaryDirectory(prefix="flexmarl-churn-") as tmp:
        model = big_tokenizer_model(Path(tmp) / "model", vocab)
        rss = {arm: run_arm(model, arm, engines) for arm in ARMS}
    kept, cleared = per_engine(rss["kept"]), per_engine(rss["cleared"])
    results = {
        "date": str(date.today()),
        "machine": cpu_model(),
        "engines": engines,
        "tokenizer_vocab": vocab,
        "rss_mib": rss,
        "rss_mib_per_engine_kept": kept,
        "rss_mib_per_engine_cleared": cleared,
        "churn_growth_ratio": round(cleared / kept, 3) if kept > 0 else None,
    }
    print(f"{'arm':8} {'RSS MiB after each engine':60} MiB/engine")
    for arm, per in (("kept", kept), ("cleared", cleared)):
        print(f"{arm:8} {rss[arm]!s:60} {per}")
    write_results(results, args.json)
    return results


if __name__ == "__main__":
    main()
