"""Response lengths: drawn per (node, step, micro-batch) from a distribution per node.

A draw is seeded by (seed, step, micro-batch, node), like the real sampler's seed
(`tasks.rollout.sampling_for`), so a scenario is reproducible and every mode of one
scenario sees the same lengths for the same task.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from bench.sim.calibration import LogNormal


class Lengths(Protocol):
    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class Quantiles:
    """An empirical distribution given by evenly spaced quantiles (0 … 1), sampled by
    inverse CDF with linear interpolation."""

    q: tuple[float, ...]

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        u = rng.random(n) * (len(self.q) - 1)
        return np.maximum(1, np.rint(np.interp(u, np.arange(len(self.q)), self.q))).astype(int)


@dataclass(frozen=True, slots=True)
class LogNormalLengths:
    dist: LogNormal

    def draw(self, rng: np.random.Generator, n: int) -> np.ndarray:
        x = rng.lognormal(np.log(self.dist.median), self.dist.sigma, n)
        return np.maximum(1, np.rint(x)).astype(int)


def rng_for(seed: int, step: int, mb: int, node: str) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(f"{seed}/{step}/{mb}/{node}".encode()))


def draw(model: Lengths, cap: int, n: int, seed: int, step: int, mb: int, node: str) -> np.ndarray:
    """n response lengths of `node` in (step, mb), capped by the node's max_tokens."""
    return np.minimum(model.draw(rng_for(seed, step, mb, node), n), cap)
