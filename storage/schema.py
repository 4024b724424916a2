"""Row schema of a MEG Store table: segment keys and columnar sample batches.

A table row is one sampled response of one node invocation. Token sequences are ragged,
so they are stored as flat values plus offsets (Zarr has no ragged arrays):
``response(i) = response_ids[response_offsets[i]:response_offsets[i + 1]]``.
Behaviour logprobs share the response offsets, one float per response token, and so do
token versions: the policy version that generated each response token. They differ from the
row's ``policy_version`` only in a sample that was cut and continued in a later step under
newer weights (the `april` rollout policy): its prefix keeps the version that wrote it.

``source`` names who sampled a row that the table's own agent did not: "" for the agent
itself, else an external policy (the `external` rollout policy), as ``agent:<name>@v<k>``
(a teammate's version k) or ``model:<dir>`` (a frozen model). Such a row's
``policy_version`` (and token versions) is ``EXTERNAL_VERSION``: it was never sampled by any
version of the agent that trains on it, so no version count of the agent includes it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

SCHEMA_VERSION = 3  # 2: same-dtype columns packed into 2-D arrays; 3: token_versions

_NODE_RE = re.compile(r"^[A-Za-z0-9_@-]+$")
_ID_RE = re.compile(r"^k(\d{6,})-m(\d{4,})-([A-Za-z0-9_@-]+)$")


@dataclass(frozen=True, slots=True)
class SegmentKey:
    """One segment per (step, micro-batch, node); retries (attempts) stay internal."""

    step: int
    micro_batch: int
    node: str

    def __post_init__(self) -> None:
        for name in ("step", "micro_batch"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 0:
                raise ValueError(f"SegmentKey.{name} must be an int >= 0, got {value!r}")
        if not isinstance(self.node, str) or not _NODE_RE.match(self.node):
            raise ValueError(
                f"SegmentKey.node must match {_NODE_RE.pattern} (path-safe), got {self.node!r}"
            )

    @property
    def id(self) -> str:
        """Stable, sortable, path-safe id, e.g. ``k000003-m0001-solve``."""
        return f"k{self.step:06d}-m{self.micro_batch:04d}-{self.node}"

    @staticmethod
    def prefix(step: int, micro_batch: int | None = None) -> str:
        """What the ids of a step's segments (of one micro-batch) start with: a listing
        filters names by it before parsing any."""
        return f"k{step:06d}-" + ("" if micro_batch is None else f"m{micro_batch:04d}-")

    @classmethod
    def parse(cls, segment_id: str) -> SegmentKey:
        m = _ID_RE.match(segment_id)
        if m is None:
            raise ValueError(f"not a segment id: {segment_id!r} (expected k000003-m0001-node)")
        return cls(int(m.group(1)), int(m.group(2)), m.group(3))


# finish_reason of rows that are stored and never trained: an invocation a condition did not
# run (or one below it), and a tool node's output (`tool-stop`: the tool said terminal)
SKIPPED = "skipped"
TOOL = "tool"
TOOL_STOP = "tool-stop"
NOT_TRAINED = (SKIPPED, TOOL, TOOL_STOP)

# name -> (numpy dtype kind, per-row?) ; "ragged" columns are flat values with offsets.
STR_COLUMNS = ("sample_id", "group_id", "parent_ids", "node", "episode", "finish_reason", "source")
EXTERNAL_VERSION = -1  # the policy_version of a row an external policy sampled (`source`)
ROW_STR = (*STR_COLUMNS, "score_status")  # score_status: from score segments, not rows ones
ROW_NUMERIC = {
    "step": np.int64,
    "policy_version": np.int64,
    "reward": np.float32,
    "advantage": np.float32,
    "gen_start": np.float64,
    "gen_end": np.float64,
}
FLAT = {
    "prompt_ids": np.int32,
    "response_ids": np.int32,
    "logprobs": np.float32,
    "token_versions": np.int64,
    "prompt_offsets": np.int64,
    "response_offsets": np.int64,
}


def _as_str(a: Any) -> np.ndarray:
    arr = np.asarray(a)
    if arr.dtype.kind in "US" or arr.size == 0:
        return arr.astype(np.str_)
    return np.asarray([str(x) for x in arr.ravel()], dtype=np.str_)


def _check_offsets(name: str, offsets: np.ndarray, n_rows: int, n_values: int) -> None:
    if offsets.shape != (n_rows + 1,):
        raise ValueError(f"{name} must have N+1 = {n_rows + 1} entries, got {offsets.shape}")
    if offsets[0] != 0 or offsets[-1] != n_values:
        raise ValueError(
            f"{name} must start at 0 and end at the value count {n_values}, "
            f"got {offsets[0]}..{offsets[-1]}"
        )
    if n_rows and np.any(np.diff(offsets) < 0):
        raise ValueError(f"{name} must be non-decreasing")


@dataclass(frozen=True, slots=True)
class SampleBatch:
    """Columnar rows of one table (numpy arrays, N rows). Construction validates and coerces.

    reward/advantage are NaN until the scoring task writes a score segment; readers join
    scores onto rows. ``policy_version`` is the version of the agent that generated the row,
    which makes the staleness rule checkable from the store alone.
    """

    sample_id: np.ndarray  # (N,) str "{episode}/{node}/{invocation}/{sample}"
    group_id: np.ndarray  # (N,) str "{episode}/{node}/{invocation}" — GRPO group
    parent_ids: np.ndarray  # (N,) str, comma-joined parent sample ids ("" for roots)
    node: np.ndarray  # (N,) str
    episode: np.ndarray  # (N,) str
    step: np.ndarray  # (N,) int64
    policy_version: np.ndarray  # (N,) int64
    prompt_ids: np.ndarray  # (P,) int32 flat
    prompt_offsets: np.ndarray  # (N+1,) int64
    response_ids: np.ndarray  # (R,) int32 flat
    response_offsets: np.ndarray  # (N+1,) int64
    logprobs: np.ndarray  # (R,) float32, behaviour logprob per response token
    token_versions: np.ndarray  # (R,) int64, policy version that generated each response token
    reward: np.ndarray  # (N,) float32, NaN until scored
    advantage: np.ndarray  # (N,) float32, NaN until scored
    # (N,) str "stop" | "length" | "partial" (carry) | "verified" | "skipped" | "tool" |
    # "tool-stop" (the last three: `NOT_TRAINED`)
    finish_reason: np.ndarray
    gen_start: np.ndarray  # (N,) float64 unix seconds
    gen_end: np.ndarray  # (N,) float64 unix seconds
    # (N,) str, joined from the score segment: "" until scored, then "ok", "failed: <why>"
    # (the reward call raised or timed out) or "dropped: ..." (its group was dropped)
    score_status: np.ndarray = field(default_factory=lambda: np.zeros(0, np.str_))
    # (N,) str, "" for the table's own agent, else the external policy that sampled the row
    source: np.ndarray = field(default_factory=lambda: np.zeros(0, np.str_))

    def __post_init__(self) -> None:
        for name in ("score_status", "source"):  # defaulted: "" on every row
            if len(getattr(self, name)) == 0 and len(self.sample_id):
                object.__setattr__(self, name, np.full(len(self.sample_id), "", np.str_))
        for name in ROW_STR:
            object.__setattr__(self, name, _as_str(getattr(self, name)))
        for name, dtype in {**ROW_NUMERIC, **FLAT}.items():
            object.__setattr__(self, name, np.ascontiguousarray(getattr(self, name), dtype))
        n = len(self.sample_id)
        for name in (*ROW_STR, *ROW_NUMERIC):
            arr = getattr(self, name)
            if arr.shape != (n,):
                raise ValueError(
                    f"column {name} must have shape ({n},) like sample_id, got {arr.shape}"
                )
        for name in ("prompt_ids", "response_ids", "logprobs", "token_versions"):
            if getattr(self, name).ndim != 1:
                raise ValueError(f"column {name} must be flat (1-d)")
        _check_offsets("prompt_offsets", self.prompt_offsets, n, len(self.prompt_ids))
        _check_offsets("response_offsets", self.response_offsets, n, len(self.response_ids))
        for name in ("logprobs", "token_versions"):
            if len(getattr(self, name)) != len(self.response_ids):
                raise ValueError(
                    f"{name} must have one value per response token "
                    f"({len(self.response_ids)}), got {len(getattr(self, name))}"
                )
        if n and len(np.unique(self.sample_id)) != n:
            raise ValueError("sample_id must be unique within a batch")

    def __len__(self) -> int:
        return len(self.sample_id)

    def prompt(self, i: int) -> np.ndarray:
        return self.prompt_ids[self.prompt_offsets[i] : self.prompt_offsets[i + 1]]

    def response(self, i: int) -> np.ndarray:
        return self.response_ids[self.response_offsets[i] : self.response_offsets[i + 1]]

    def logprob(self, i: int) -> np.ndarray:
        return self.logprobs[self.response_offsets[i] : self.response_offsets[i + 1]]

    def token_version(self, i: int) -> np.ndarray:
        return self.token_versions[self.response_offsets[i] : self.response_offsets[i + 1]]

    @property
    def carried_tokens(self) -> np.ndarray:
        """(N,) response tokens of each row generated before the row's own version (by an
        earlier policy, before the sample was cut and continued)."""
        older = self.token_versions < np.repeat(self.policy_version, self.response_lengths)
        counts = np.concatenate([[0], np.cumsum(older, dtype=np.int64)])
        return counts[self.response_offsets[1:]] - counts[self.response_offsets[:-1]]

    @property
    def external(self) -> np.ndarray:
        """(N,) bool: rows an external policy sampled (`source` names it)."""
        return self.source != ""

    @property
    def own_versions(self) -> tuple[int, ...]:
        """The agent's own policy versions among these rows, sorted (external rows have none:
        they never count as a version of the agent)."""
        return tuple(int(v) for v in np.unique(self.policy_version[~self.external]))

    @property
    def response_lengths(self) -> np.ndarray:
        return np.diff(self.response_offsets)  # (N,)

    @property
    def prompt_lengths(self) -> np.ndarray:
        return np.diff(self.prompt_offsets)  # (N,)

    @property
    def trained(self) -> np.ndarray:
        """(N,) bool: rows a trainer learns from. A tool node's rows (environment text, which
        enters the next turn's prompt) and skipped invocations are stored, never trained."""
        return ~np.isin(self.finish_reason, NOT_TRAINED)

    def trainable(self) -> SampleBatch:
        """The rows a trainer learns from (`trained`), in order."""
        mask = self.trained
        return self if bool(mask.all()) else self.take(mask)

    def columns(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def replace(self, **columns: np.ndarray) -> SampleBatch:
        return SampleBatch(**{**self.columns(), **columns})

    @property
    def nbytes(self) -> int:
        """Bytes of the columns in memory (what moving the batch between processes costs)."""
        return sum(int(c.nbytes) for c in self.columns().values())

    def with_scores(self, reward: Any, advantage: Any, status: Any) -> SampleBatch:
        """These rows with their score segment joined on, in the types the store keeps (what
        `Table.read` returns once `Table.write_scores` committed the same values)."""
        n = len(self)
        return self.replace(
            reward=np.asarray(reward, np.float32).reshape(n),
            advantage=np.asarray(advantage, np.float32).reshape(n),
            score_status=np.asarray(status, np.str_).reshape(n),
        )

    def take(self, index: np.ndarray | Sequence[int]) -> SampleBatch:
        """Rows at ``index`` (ints or a boolean mask), in that order."""
        idx = np.asarray(index)
        idx = np.flatnonzero(idx) if idx.dtype == bool else idx.astype(np.int64).reshape(-1)
        cols: dict[str, np.ndarray] = {}
        for name in (*ROW_STR, *ROW_NUMERIC):
            cols[name] = getattr(self, name)[idx]
        for values, offsets, extra in (
            ("prompt_ids", "prompt_offsets", ()),
            ("response_ids", "response_offsets", ("logprobs", "token_versions")),
        ):
            off = getattr(self, offsets)
            parts = [np.arange(off[i], off[i + 1]) for i in idx]
            flat = np.concatenate(parts) if parts else np.zeros(0, np.int64)
            cols[values] = getattr(self, values)[flat]
            for name in extra:
                cols[name] = getattr(self, name)[flat]
            cols[offsets] = np.concatenate([[0], np.cumsum(off[idx + 1] - off[idx])])
        return SampleBatch(**cols)

    @staticmethod
    def concat(batches: Sequence[SampleBatch]) -> SampleBatch:
        if not batches:
            return SampleBatch.empty()
        cols: dict[str, np.ndarray] = {}
        for f in fields(SampleBatch):
            if f.name.endswith("_offsets"):
                parts = [
                    b.prompt_offsets if f.name[0] == "p" else b.response_offsets for b in batches
                ]
                shifts = np.cumsum([0] + [p[-1] for p in parts[:-1]])
                cols[f.name] = np.concatenate(
                    [parts[0][:1]] + [p[1:] + s for p, s in zip(parts, shifts, strict=True)]
                )
            else:
                cols[f.name] = np.concatenate([getattr(b, f.name) for b in batches])
        return SampleBatch(**cols)

    @staticmethod
    def empty() -> SampleBatch:
        return SampleBatch.from_rows([])

    @staticmethod
    def from_rows(rows: Sequence[Mapping[str, Any]]) -> SampleBatch:
        """Build from row dicts; token fields are int lists, ``parent_ids`` a list or str.

        Missing reward/advantage default to NaN, timings to 0.0, parents to roots, token
        versions to the row's policy version, the source to the agent itself ("").
        """
        n = len(rows)

        def col(name: str, default: Any = None) -> list[Any]:
            out = []
            for i, r in enumerate(rows):
                if name not in r and default is None:
                    raise ValueError(f"row {i} is missing field {name!r}")
                out.append(r.get(name, default))
            return out

        def ragged(name: str, dtype: type) -> tuple[np.ndarray, np.ndarray]:
            seqs: list[np.ndarray] = [np.asarray(s, dtype) for s in col(name)]
            lengths = [len(s) for s in seqs]
            flat = np.concatenate(seqs) if seqs else np.zeros(0, dtype)
            return flat, np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])

        prompt_ids, prompt_offsets = ragged("prompt_ids", np.int32)
        response_ids, response_offsets = ragged("response_ids", np.int32)
        logprobs, _ = ragged("logprobs", np.float32)
        versions = [
            r.get("token_versions", [r["policy_version"]] * len(r["response_ids"])) for r in rows
        ]
        token_versions = (
            np.concatenate([np.asarray(v, np.int64) for v in versions])
            if versions
            else np.zeros(0, np.int64)
        )
        parents = [p if isinstance(p, str) else ",".join(p) for p in col("parent_ids", "")]
        return SampleBatch(
            sample_id=np.asarray(col("sample_id"), np.str_).reshape(n),
            group_id=np.asarray(col("group_id"), np.str_).reshape(n),
            parent_ids=np.asarray(parents, np.str_).reshape(n),
            node=np.asarray(col("node"), np.str_).reshape(n),
            episode=np.asarray(col("episode"), np.str_).reshape(n),
            step=np.asarray(col("step"), np.int64).reshape(n),
            policy_version=np.asarray(col("policy_version"), np.int64).reshape(n),
            prompt_ids=prompt_ids,
            prompt_offsets=prompt_offsets,
            response_ids=response_ids,
            response_offsets=response_offsets,
            logprobs=logprobs,
            token_versions=token_versions,
            reward=np.asarray(col("reward", np.nan), np.float32).reshape(n),
            advantage=np.asarray(col("advantage", np.nan), np.float32).reshape(n),
            finish_reason=np.asarray(col("finish_reason", "stop"), np.str_).reshape(n),
            gen_start=np.asarray(col("gen_start", 0.0), np.float64).reshape(n),
            gen_end=np.asarray(col("gen_end", 0.0), np.float64).reshape(n),
            source=np.asarray(col("source", ""), np.str_).reshape(n),
        )
