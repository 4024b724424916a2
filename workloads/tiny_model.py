"""Tiny local models: a seeded model of a real family plus a byte-level BPE tokenizer.

Nothing can be downloaded at run time on the development machines, so every test, example
and benchmark builds its model here. By default the model is a plain `LlamaForCausalLM` saved with
safetensors and the tokenizer a `PreTrainedTokenizerFast`, so the same directory loads in
`transformers` and in vLLM (the head dim defaults to 64, which vLLM's CPU attention kernels
accept; odd head dims are not safe there). Other families (Qwen2, Qwen3, GPT-2, Gemma: tied
embeddings, biases, q/k norm, dropout, a 151,936-row vocabulary) come from the registry in
`workloads.family_configs`; the default `llama` family is byte-identical to the original model.
Every tokenizer carries a small chat template (`CHAT_TEMPLATE`) for `chat:` nodes.

Determinism: for one seed and one corpus the weight file is byte-identical across builds
(`torch.manual_seed` before construction, safetensors with fixed metadata), so tests can
compare outputs across processes.

`build_tiny_model` only creates the random model; a supervised warm start lives elsewhere
and takes the directory this returns (keep this boundary: build → optionally warm-start).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2 (tokenizers assigns specials first)

_WORDS_TEXT = (
    "correct wrong yes no verdict plan step answer question solve check final agree "
    "disagree because so the is not and then sum product result worker aggregate judge"
)
_WORDS = tuple(_WORDS_TEXT.split())


def default_corpus(lines: int = 2000, seed: int = 0) -> Iterator[str]:
    """Arithmetic / QA-style lines over the workloads' alphabet (digits, + - * =, Q:/A:, words).

    Seeded, so the trained tokenizer (and therefore the whole model directory) is reproducible.
    """
    g = torch.Generator().manual_seed(seed)

    def pick(n: int) -> int:
        return int(torch.randint(n, (1,), generator=g).item())

    ops = "+-*"
    yield "abcdefghijklmnopqrstuvwxyz 0123456789 + - * = Q: A: Answer:\n"
    for _ in range(lines):
        a, b, op = pick(100), pick(100), ops[pick(3)]
        res = a + b if op == "+" else a - b if op == "-" else a * b
        w1, w2 = _WORDS[pick(len(_WORDS))], _WORDS[pick(len(_WORDS))]
        verdict = ("correct", "wrong")[pick(2)]
        yield (
            f"Q: {a} {op} {b} = ?\nA: step {w1} {w2} {a}{op}{b}={res}\n"
            f"Answer: {res}\nverdict: {verdict} {('yes', 'no')[pick(2)]}\n"
        )


def train_tokenizer(corpus: Iterable[str], vocab: int):  # -> PreTrainedTokenizerFast
    """Byte-level BPE trained on `corpus`, wrapped for transformers with bos/eos/pad set."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD
    )


TOKENIZER_MAX_VOCAB = 512  # the BPE tokenizer never grows past this, whatever the model vocab

# A small chat template in the style of instruct models (role headers, the assistant's turn
# opened by the generation prompt), so `chat:` nodes are tested end to end on tiny models.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ '<|' + m['role'] + '|>\n' + m['content'] + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% endif %}"
)


def build_tiny_model(
    out_dir: str | Path,
    *,
    family: str = "llama",
    layers: int = 2,
    hidden: int = 128,
    heads: int = 2,
    intermediate: int = 256,
    vocab: int | None = None,
    max_positions: int = 512,
    seed: int = 0,
    corpus: Iterable[str] | None = None,
) -> Path:
    """Build and save a seeded tiny model of `family` + tokenizer into `out_dir`; return it.

    `family` is one of `workloads.family_configs.FAMILIES` (llama, qwen2, qwen3, gpt2, gemma).
    `vocab` is the model's embedding size (None: the family's default, 512 for llama/gpt2/
    gemma, 151936 for qwen2/qwen3). The tokenizer is trained to `min(vocab, 512)` tokens; a
    model vocabulary larger than the tokenizer is normal (real Qwen checkpoints have 151,665
    tokens for 151,936 embeddings). Byte-level BPE needs 256 byte tokens + 3 specials, so
    `vocab` must be at least 259.
    """
    from workloads.family_configs import Sizes, get_family

    fam = get_family(family)
    vocab = fam.default_vocab if vocab is None else vocab
    if vocab < 259:
        raise ValueError(f"vocab={vocab} is too small: byte-level BPE needs >= 259 tokens")
    if hidden % heads:
        raise ValueError(f"hidden={hidden} must be divisible by heads={heads}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tokenizer = train_tokenizer(
        corpus if corpus is not None else default_corpus(seed=seed),
        min(vocab, TOKENIZER_MAX_VOCAB),
    )
    if len(tokenizer) > vocab:  # cannot happen with BpeTrainer, but never save a broken pair
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens > model vocab {vocab}")

    sizes = Sizes(
        layers=layers,
        hidden=hidden,
        heads=heads,
        intermediate=intermediate,
        vocab=vocab,
        max_positions=max_positions,
        bos=tokenizer.bos_token_id,
        eos=tokenizer.eos_token_id,
        pad=tokenizer.pad_token_id,
    )
    config = fam.make_config(sizes)
    torch.manual_seed(seed)
    model = fam.model_class()(config)
    model.generation_config.do_sample = True  # a policy, not a greedy decoder
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    (out / "flexmarl_tiny.json").write_text(
        json.dumps(
            {
                "family": family,
                "layers": layers,
                "hidden": hidden,
                "heads": heads,
                "intermediate": intermediate,
                "vocab": vocab,
                "max_positions": max_positions,
                "seed": seed,
            },
            sort_keys=True,
        )
    )
    return out


def load_tokenizer(path: str | Path):  # -> PreTrainedTokenizerFast
    """Load the tokenizer saved next to a model (local directory; raises naming the path)."""
    from transformers import AutoTokenizer

    p = Path(path)
    if not (p / "tokenizer.json").is_file() and not (p / "tokenizer_config.json").is_file():
        raise FileNotFoundError(f"no tokenizer found in model directory {p}")
    return AutoTokenizer.from_pretrained(str(p))
