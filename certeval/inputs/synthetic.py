"""A synthetic recorded-scores source, generated on demand and never stored: ``synthetic:<M>x<N>[:<seed>]``.

``replay:synthetic:10000x10000:7#m00042`` replays model 42 of a 10,000-model × 10,000-item table that
exists only as a rule: model ``k`` answers item ``j`` correctly when ``u_kj < expit(theta_k - b_j)``
(a Rasch model), with abilities ``theta ~ N(0, 1)``, difficulties ``b ~ N(0, 1)`` and the uniforms
``u_k.`` of row ``k`` drawn from ``default_rng([seed, 3, k])``. Any row is rebuilt bit for bit from the
location alone, so a 10⁸-cell bank costs nothing to store or ship: the plan, the bank and the replay
actors each derive what they need (``benchmarks/scale.py``'s 10k × 10k run).

Model names are ``m`` + the zero-padded index, item ids ``i`` + the zero-padded index; no sub-datasets.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np
import pandas as pd

from certeval.errors import InputError

PREFIX = "synthetic:"
_PATTERN = re.compile(r"^synthetic:(\d+)x(\d+)(?::(\d+))?$")
MAX_CELLS = 10**9  # a row is generated whole; beyond this a typo (an extra zero) is more likely than intent
MAX_ITEMS = 10**7  # item ids and a row are built whole (10⁹ ids did not fit in memory: MemoryError at run time)


def is_synthetic(location: str) -> bool:
    return str(location).startswith(PREFIX)


@dataclass(frozen=True)
class SyntheticScores:
    n_models: int
    n_items: int
    seed: int = 0

    @classmethod
    def parse(cls, location: str) -> SyntheticScores:
        """The table a ``synthetic:<M>x<N>[:<seed>]`` location names (checked: M >= 1, N >= 1)."""
        match = _PATTERN.match(str(location))
        if match is None:
            raise InputError(f"synthetic scores location must look like synthetic:<models>x<items>[:<seed>] "
                             f"(e.g. synthetic:10000x10000:7), got {location!r}")
        m, n, seed = int(match[1]), int(match[2]), int(match[3] or 0)
        if m < 1 or n < 1 or m * n > MAX_CELLS or n > MAX_ITEMS:
            raise InputError(f"synthetic scores {location!r}: models and items must be >= 1, items <= {MAX_ITEMS:,} "
                             f"and models x items <= {MAX_CELLS:,}, got {m} x {n}")
        return cls(m, n, seed)

    @functools.cached_property
    def model_names(self) -> tuple[str, ...]:
        width = len(str(self.n_models - 1))
        return tuple(f"m{k:0{width}d}" for k in range(self.n_models))

    @functools.cached_property
    def model_row(self) -> dict[str, int]:
        return {name: k for k, name in enumerate(self.model_names)}

    @functools.cached_property
    def item_ids(self) -> np.ndarray:
        width = len(str(self.n_items - 1))
        return np.asarray([f"i{j:0{width}d}" for j in range(self.n_items)], dtype=object)

    @functools.cached_property
    def abilities(self) -> np.ndarray:
        return np.random.default_rng([self.seed, 1]).normal(0.0, 1.0, self.n_models)

    @functools.cached_property
    def difficulties(self) -> np.ndarray:
        return np.random.default_rng([self.seed, 2]).normal(0.0, 1.0, self.n_items)

    def row(self, k: int) -> np.ndarray:
        """Model ``k``'s scores (0.0 / 1.0) on every item, in item order."""
        if not 0 <= k < self.n_models:
            raise InputError(f"synthetic model index {k} outside [0, {self.n_models})")
        p = 1.0 / (1.0 + np.exp(self.difficulties - self.abilities[k]))
        u = np.random.default_rng([self.seed, 3, k]).random(self.n_items)
        return (u < p).astype(float)

    def bank_means(self) -> np.ndarray:
        """Every model's exact bank mean (one row at a time: the table is never held whole)."""
        return np.asarray([self.row(k).mean() for k in range(self.n_models)])

    def items_frame(self) -> pd.DataFrame:
        return pd.DataFrame({"item_id": self.item_ids})


@functools.lru_cache(maxsize=8)
def synthetic_scores(location: str) -> SyntheticScores:
    return SyntheticScores.parse(location)
