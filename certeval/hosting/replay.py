"""Replay host: answers from recorded scores (``replay:<scores file>#<model>``).

Optional ``?latency=SECONDS`` sleeps per item to simulate a real model in load tests.

The table is read once per process (:meth:`ReplayTable.shared`; only ``model, item_id,
score``) and kept as a dense matrix (models × items, NaN where not recorded) with the model
and item names as lookups, so one Ray actor can serve every model of a file: openllm_tiny's
1,989 models × 493 items take 8 MB instead of a ~350 MB pandas frame per model actor.
float64, not float32: replayed scores must equal the recorded ones bit for bit.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np
import pandas as pd

from certeval.errors import InputError
from certeval.inputs.banks import load_scores, resolve_path
from certeval.inputs.model_spec import ModelSpec
from certeval.inputs.synthetic import is_synthetic, synthetic_scores

from .base import ModelHost


class ReplayTable:
    """Recorded scores of one file: ``matrix[model_row, item_col]`` (NaN = not recorded)."""

    _cache: dict[str, ReplayTable] = {}
    _lock = threading.Lock()

    def __init__(self, models: list[str], items: list[str], matrix: np.ndarray, location: str) -> None:
        self.location = location
        self.models = models
        self.model_row = {m: i for i, m in enumerate(models)}
        self.item_col = {it: j for j, it in enumerate(items)}
        self.items = items
        self.matrix = matrix

    @classmethod
    def shared(cls, location: str) -> ReplayTable:
        """The table of ``location``, loaded once per process."""
        with cls._lock:
            if location not in cls._cache:
                cls._cache[location] = SyntheticTable(location) if is_synthetic(location) else cls.load(location)
            return cls._cache[location]

    def row(self, name: str) -> np.ndarray:
        """Model ``name``'s recorded scores by item column (NaN: not recorded)."""
        return self.matrix[self.model_row[name]]

    @classmethod
    def load(cls, location: str) -> ReplayTable:
        """Read only ``model, item_id, score``; anything a quick check cannot vouch for goes through
        :func:`certeval.inputs.banks.load_scores`, whose validation raises the usual one-line errors."""
        frame = None
        resolved = resolve_path(location)
        if resolved.lower().endswith((".parquet", ".pq")):
            try:
                frame = pd.read_parquet(resolved, columns=["model", "item_id", "score"])
            except Exception:  # missing columns, unreadable: let load_scores name the problem
                frame = None
        if frame is not None:
            scores = pd.to_numeric(frame["score"], errors="coerce").to_numpy(dtype=float)
            if len(frame) == 0 or not (np.isfinite(scores).all() and (scores >= 0).all() and (scores <= 1).all()):
                frame = None
        if frame is None:
            frame = load_scores(location)
            scores = frame["score"].to_numpy(dtype=float)
        model = pd.Categorical(frame["model"].astype(str))
        item = pd.Categorical(frame["item_id"].astype(str))
        matrix = np.full((len(model.categories), len(item.categories)), np.nan)
        matrix[model.codes, item.codes] = scores
        if int(np.isfinite(matrix).sum()) != len(frame):  # duplicate (model, item) rows
            load_scores(location)  # raises the validation error
            raise InputError(f"scores file {location!r} has duplicate (model, item_id) rows")
        return cls(list(model.categories), list(item.categories), matrix, location)


class SyntheticTable:
    """A ``synthetic:<M>x<N>[:<seed>]`` table (:mod:`certeval.inputs.synthetic`) behind the replay interface: rows are
    generated when a model is asked, never held for every model (10⁸ cells would be 800 MB per actor)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.source = synthetic_scores(location)
        self.model_row = self.source.model_row
        self.models = list(self.source.model_names)
        self.items = list(self.source.item_ids)
        self.item_col = {it: j for j, it in enumerate(self.items)}

    def row(self, name: str) -> np.ndarray:
        return self.source.row(self.model_row[name])


class ReplayHost(ModelHost):
    def __init__(self, spec: ModelSpec, latency_s: float = 0.0, table: ReplayTable | None = None) -> None:
        self.spec = spec
        self.latency_s = latency_s
        self.table = table if table is not None else ReplayTable.shared(spec.location)
        if spec.name not in self.table.model_row:
            models = sorted(self.table.models)
            raise InputError(f"unknown model {spec.name!r} in {spec.location!r}; it has {len(models)} models, e.g. {', '.join(models[:5])}")
        self._row = None if isinstance(self.table, SyntheticTable) else self.table.row(spec.name)
        self.calls = 0

    def _scores_row(self) -> np.ndarray:
        return self._row if self._row is not None else self.table.row(self.spec.name)  # synthetic: rebuilt per call

    @property
    def item_ids(self) -> list[str]:
        return [self.table.items[j] for j in np.flatnonzero(np.isfinite(self._scores_row()))]

    def score(self, items: list[dict[str, Any]]) -> list[dict[str, Any]]:
        self.calls += 1
        out = []
        cols = self.table.item_col
        row = self._scores_row()
        for item in items:
            t0 = time.perf_counter()
            iid = str(item["item_id"])
            j = cols.get(iid)
            value = row[j] if j is not None else np.nan
            if not np.isfinite(value):
                raise InputError(f"model {self.spec.name!r} has no recorded score for item {iid!r}")
            if self.latency_s:
                time.sleep(self.latency_s)
            out.append({"item_id": iid, "score": float(value), "tokens": 0,
                        "latency_s": time.perf_counter() - t0})
        return out


def build_host(spec: ModelSpec, **kwargs: Any) -> ReplayHost:
    latency = float(spec.option("latency", kwargs.get("latency_s", 0.0)))
    return ReplayHost(spec, latency_s=latency)
