"""What finished rows leaving the batch saves the `hf` backend's sampling loop.

    python -m bench.compaction [--small] [--json PATH] [--repeats R]

One `hf` engine on one torch thread (a rollout worker of the default layouts), the same
prompts and seeded `SamplingParams` (16 prompts × n = 4, temperature 1, up to 128 tokens),
generated with `compact` on (a row that finished leaves the batch, its cache row too) and
off (every row decodes to the longest), calls alternating after one untimed warm-up each.
`generate_s` is the median of `--repeats` calls; `compaction_time_ratio` is on / off (< 1:
compaction saves time).

Two length profiles on random models of growing size (`bench.rollout_engines.SIZES`):

- `longtail`: a set of stop tokens of ~1/64 of the vocabulary, so each token ends its row
  with p ≈ 1/64: lengths spread from a few tokens to the budget, as RL responses do;
- `full`: no stop token, every row runs (nearly) to the budget: what compaction costs when
  it has nothing to drop.

Both arms sample the same tokens (tests/engines/rollout/test_backends.py), so the tokens
decoded are the same and only the seconds differ. `--small` (the test suite): the toy
model, 32 tokens, 2 repeats; keys, not timings.
"""

from __future__ import annotations

import statistics
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    alternate,
    engine_bench_args,
    one_thread,
    results_header,
    write_results,
)
from bench.rollout_engines import SIZES

HELPS = ("the toy model, 32 tokens (tests)", "timed calls per arm")  # --small, --repeats
DEFAULT_JSON = Path(__file__).parent / "results" / "compaction.json"
PROMPTS, SAMPLES, PROMPT_LEN = 16, 4, 24


def stop_tokens(profile: str, vocab: int) -> tuple[int, ...]:
    """`longtail`: vocab / 64 ids (from 100 on, clear of the specials); `full`: none."""
    return tuple(range(100, 100 + max(1, vocab // 64))) if profile == "longtail" else ()


def time_arms(engine: Any, profile: str, max_tokens: int, repeats: int) -> dict[str, Any]:
    """Median generate seconds with compaction on and off, calls alternating."""
    from engines.rollout.base import SamplingParams

    vocab = engine._vocab
    prompts = [[(7 * i + j) % (vocab - 10) + 5 for j in range(PROMPT_LEN)] for i in range(PROMPTS)]
    params = SamplingParams(
        n=SAMPLES,
        max_tokens=max_tokens,
        temperature=1.0,
        seed=1,
        stop_token_ids=stop_tokens(profile, vocab),
    )

    def arm(compact: bool) -> Callable[[], Any]:
        def call() -> Any:
            engine.compact = compact
            return engine.generate(prompts, params)

        return call

    outs, med = alternate({"compact": arm(True), "all_rows": arm(False)}, repeats)
    lengths = [len(c.response_ids) for per in outs["all_rows"] for c in per]
    on, off = med["compact"], med["all_rows"]
    return {
        "max_tokens": max_tokens,
        "mean_length": round(statistics.mean(lengths), 1),
        "generate_s": {"compact": round(on, 4), "all_rows": round(off, 4)},
        "compaction_time_ratio": round(on / off, 3),
    }


def measure(sizes: Sequence[str], max_tokens: int, repeats: int, work: Path) -> dict[str, Any]:
    from bench.rollout_engines import parameters
    from engines.rollout.hf_backend import HFBackend
    from workloads.tiny_model import build_tiny_model

    out: dict[str, Any] = {}
    for size in sizes:
        model = build_tiny_model(work / size, **SIZES[size])
        engine = HFBackend(model)
        out[size] = {
            "parameters": parameters(model),
            **{p: time_arms(engine, p, max_tokens, repeats) for p in ("longtail", "full")},
        }
        del engine
    return out


def table(results: dict[str, Any]) -> str:
    lines = [
        "| model | parameters | lengths | mean length | compact s | all rows s | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for size, r in results.items():
        for p in ("longtail", "full"):
            b, g = r[p], r[p]["generate_s"]
            lines.append(
                f"| {size} | {r['parameters'] / 1e6:.1f} M | {p} | {b['mean_length']} of "
                f"{b['max_tokens']} | {g['compact']:.3f} | {g['all_rows']:.3f} | "
                f"{b['compaction_time_ratio']:.2f} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    a = engine_bench_args("bench.compaction", __doc__, DEFAULT_JSON, HELPS, argv)
    one_thread()
    sizes = ["toy"] if a.small else ["toy", "11m", "52m"]
    max_tokens, repeats = (32, 2) if a.small else (128, a.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        results = measure(sizes, max_tokens, repeats, Path(tmp))
    print(table(results))
    out = results_header(
        threads=1,
        repeats=repeats,
        completions=PROMPTS * SAMPLES,
        sizes=results,
        # the largest model's long-tail lengths: the case compaction is for
        compaction_time_ratio=results[sizes[-1]]["longtail"]["compaction_time_ratio"],
        # the same model with every row to the budget: what it costs with nothing to drop
        compaction_full_time_ratio=results[sizes[-1]]["full"]["compaction_time_ratio"],
    )
    write_results(out, a.json)
    return out


if __name__ == "__main__":
    main()
