"""Model / checkpoint selection (seed 004 §7.3.3): discard the weak early, then precision or best-model identification.

Each model gets a group-sequential repeated CI for its (mean-of-means) score on the shared
item order, at level ``alpha / M`` (Bonferroni over the M models, so all intervals hold
simultaneously with probability >= 1 - alpha, over all looks).  At each look:

1. a model whose upper bound is below ``threshold`` is discarded ("below");
2. ``mode="precision"``: a model whose half-width is <= ``halfwidth`` stops ("precise");
   ``mode="best"``: a model whose upper bound is below the largest lower bound of another
   model cannot be the best and stops ("not-best"); sampling ends when one candidate is left
   or every remaining interval is within ``halfwidth``.

Because every interval holds simultaneously, every discard and every "not-best" is correct
with probability >= 1 - alpha, and the best model is among the candidates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from ._validation import InputError, check_alpha, check_choice, check_in_range, check_positive
from .results import to_jsonable
from .sequential import boundary_multiplier, mean_of_means

STATUSES = ("running", "below", "precise", "not-best", "candidate", "exhausted")


@dataclass(frozen=True)
class ModelStatus:
    model: str
    mean: float
    lower: float
    upper: float
    n_scored: int
    status: str  # one of STATUSES
    look: int | None

    def ci(self) -> tuple[float, float]:
        return (self.lower, self.upper)


@dataclass(frozen=True)
class Selection:
    """Selected models (those not discarded, best first) with every model's final interval."""

    selected: tuple[str, ...]
    discarded: tuple[str, ...]
    models: tuple[ModelStatus, ...]
    n_total: int
    threshold: float
    halfwidth: float
    mode: str
    alpha: float
    guarantee: str

    @property
    def fraction_used(self) -> float:
        return float(sum(m.n_scored for m in self.models)) / (len(self.models) * self.n_total)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({
            "selected": list(self.selected),
            "discarded": list(self.discarded),
            "models": [vars(m) | {} for m in self.models],
            "n_total": self.n_total,
            "fraction_used": self.fraction_used,
            "threshold": self.threshold,
            "halfwidth": self.halfwidth,
            "mode": self.mode,
            "alpha": self.alpha,
            "guarantee": self.guarantee,
        })


def select_models(scores: np.ndarray, names: Sequence[str], look_n: Sequence[int], *, threshold: float,
                  halfwidth: float, alpha: float = 0.05, mode: str = "precision", spending: str = "pocock",
                  look_size: int = 100, subsets: np.ndarray | None = None,
                  n_subsets: int | None = None) -> Selection:
    """Replay selection over ``scores`` (``(M, n)``, columns in the shared scoring order)."""
    scores = np.asarray(scores, dtype=float)
    if scores.ndim != 2 or scores.shape[0] != len(names) or scores.shape[1] == 0:
        raise InputError(f"scores must be (models, items) with one row per name and >= 1 item, got {scores.shape}")
    if np.isnan(scores).any():
        raise InputError("every model must have a score for every shared item")
    alpha = check_alpha(alpha)
    threshold = check_in_range(threshold, "threshold", 0.0, 1.0)
    halfwidth = check_positive(halfwidth, "halfwidth")
    check_choice(mode, "mode", ("precision", "best"))
    m, n = scores.shape
    model_alpha = alpha / m
    status = ["running"] * m
    look_of: list[int | None] = [None] * m
    used = np.zeros(m, dtype=np.int64)
    mean = np.full(m, np.nan)
    lower = np.zeros(m)
    upper = np.ones(m)
    looks = [int(x) for x in look_n if 0 < x <= n]
    if not looks:
        raise InputError("no look: look sizes must lie in [1, number of items]")
    for k, n_k in enumerate(looks):
        active = np.array([s == "running" for s in status])
        if not active.any():
            break
        idx = np.flatnonzero(active)
        codes = None if subsets is None else subsets[:n_k]
        mu, var = mean_of_means(scores[idx, :n_k], codes, n_subsets)
        c = boundary_multiplier(spending, model_alpha, looks[: k + 1], n, look_size, 2)
        half = c * np.sqrt(var)
        exact = n_k == n
        mean[idx], used[idx] = mu, n_k
        lower[idx] = np.where(exact, mu, np.clip(mu - half, 0, 1))
        upper[idx] = np.where(exact, mu, np.clip(mu + half, 0, 1))
        ok = np.isfinite(half) | exact
        for j in idx:
            if not ok[np.searchsorted(idx, j)]:
                continue
            if upper[j] < threshold:
                status[j], look_of[j] = "below", k + 1
        if mode == "precision":
            for j in idx:
                if status[j] == "running" and ok[np.searchsorted(idx, j)] and (upper[j] - lower[j]) / 2 <= halfwidth:
                    status[j], look_of[j] = "precise", k + 1
        else:
            alive = [j for j in range(m) if status[j] not in ("below", "not-best")]
            for j in alive:
                best_other = max((lower[i] for i in alive if i != j), default=-np.inf)
                if status[j] == "running" and upper[j] < best_other:
                    status[j], look_of[j] = "not-best", k + 1
            alive = [j for j in range(m) if status[j] not in ("below", "not-best")]
            if len(alive) == 1 or all((upper[j] - lower[j]) / 2 <= halfwidth for j in alive):
                for j in alive:
                    status[j], look_of[j] = "candidate", k + 1
        if exact:
            for j in range(m):
                if status[j] == "running":
                    status[j], look_of[j] = "exhausted", k + 1
    keep = [j for j in range(m) if status[j] not in ("below", "not-best")]
    keep.sort(key=lambda j: -mean[j])
    guarantee = (f"group-sequential repeated CIs per model at level {1 - model_alpha:.4g} (Bonferroni over {m} models, "
                 f"{spending} boundary on n/N): all discards correct with probability >= {1 - alpha:g}")
    return Selection(
        selected=tuple(names[j] for j in keep),
        discarded=tuple(names[j] for j in range(m) if j not in keep),
        models=tuple(ModelStatus(names[j], float(mean[j]), float(lower[j]), float(upper[j]), int(used[j]), status[j],
                                 look_of[j]) for j in range(m)),
        n_total=n, threshold=threshold, halfwidth=halfwidth, mode=mode, alpha=alpha, guarantee=guarantee)
