"""What other models' recorded scores say about a new model's scores on the same items.

:func:`fit_history_prior` turns a history matrix (models × bank items, NaN where a model has no
record) into a :class:`HistoryPrior`: a Bayesian linear model of the new model's score on item j,

    x_j ≈ b_j + θ₀ + v_jᵀ θ,        θ₀ ~ N(0, τ₀²),  θ ~ N(0, diag(λ)),  noise variance σ²,

with ``b_j`` the history's item mean (shrunk towards the grand mean with a pseudo-count of 2 models),
``v_j`` the item's leading right-singular vectors of the centred history matrix (missing cells count
as the item mean), ``λ_k = s_k²/M`` the spread of the history models' own loadings on component k
(an empirical-Bayes prior: a new model is a priori like a history model), ``τ₀²`` the spread of
the history models' overall accuracies, and σ² the per-cell variance left after K components. As the
new model's scores arrive, :meth:`HistoryPrior.predict` returns the posterior-mean prediction of every
item (ridge regression with that prior; tinyBenchmarks' IRT and FAQ's factor model (Wu et al. 2026, arXiv:2601.20251) use the
same idea on the logit scale). Closed form, O(N K²) per call, so it can be refitted every round.

The predictions are only a *control variate* for :class:`~certeval.estimators.single.history.HistoryMethod`:
whatever they are, its interval stays exact; good predictions make it narrower.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from certeval.errors import InputError

DEFAULT_FACTORS = 5
ITEM_MEAN_PSEUDO_MODELS = 2.0  # shrink each item's history mean towards the grand mean by 2 models' worth
MIN_NOISE_VAR = 0.02


@dataclass(frozen=True)
class HistoryPrior:
    """A fitted history model over the bank's items (bank order); see the module docstring.

    ``item_mean`` (N,), ``factors`` (N, K), ``loading_var`` (K,), ``offset_var`` and ``noise_var``
    are the model; ``n_models`` / ``models`` / ``items_matched`` / ``sources`` say where it came from
    (provenance, stored in results).
    """

    item_mean: np.ndarray
    factors: np.ndarray
    loading_var: np.ndarray
    offset_var: float
    noise_var: float
    n_models: int
    items_matched: int
    models: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    extra: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def n_items(self) -> int:
        return int(self.item_mean.size)

    @property
    def n_factors(self) -> int:
        return int(self.factors.shape[1])

    def predict(self, items: np.ndarray, scores: np.ndarray) -> np.ndarray:
        """Posterior-mean prediction in [0, 1] of every item's score, given the model's scored ``items``.

        With no scores this is the history's item mean; each observed item moves the offset and the
        loadings (ridge regression with the empirical-Bayes prior).
        """
        items = np.asarray(items, dtype=np.int64)
        scores = np.asarray(scores, dtype=float)
        phi_all = self._design()
        prior_prec = 1.0 / np.concatenate([[self.offset_var], self.loading_var])
        if items.size == 0:
            return np.clip(self.item_mean, 0.0, 1.0)
        phi = phi_all[items]
        resid = scores - self.item_mean[items]
        precision = phi.T @ phi / self.noise_var + np.diag(prior_prec)
        theta = np.linalg.solve(precision, phi.T @ resid / self.noise_var)
        return np.clip(self.item_mean + phi_all @ theta, 0.0, 1.0)

    def _design(self) -> np.ndarray:
        return np.column_stack([np.ones(self.n_items), self.factors])

    def permuted(self, rng: np.random.Generator) -> HistoryPrior:
        """The same prior with its items shuffled: history that says nothing true about any item."""
        perm = rng.permutation(self.n_items)
        return HistoryPrior(self.item_mean[perm], self.factors[perm], self.loading_var, self.offset_var,
                            self.noise_var, self.n_models, self.items_matched, self.models, self.sources,
                            self.extra + (("permuted", True),))

    def describe(self) -> dict[str, Any]:
        """Provenance for results.json (no arrays)."""
        out: dict[str, Any] = {"n_models": int(self.n_models), "items_matched": int(self.items_matched),
                               "n_items": self.n_items, "n_factors": self.n_factors,
                               "sources": list(self.sources)}
        if self.models:
            out["models"] = list(self.models)
        out.update(dict(self.extra))
        return out

    def to_state(self) -> dict[str, Any]:
        return {
            "item_mean": self.item_mean.tolist(), "factors": self.factors.tolist(),
            "loading_var": self.loading_var.tolist(), "offset_var": float(self.offset_var),
            "noise_var": float(self.noise_var), "n_models": int(self.n_models),
            "items_matched": int(self.items_matched), "models": list(self.models), "sources": list(self.sources),
            "extra": [[k, v] for k, v in self.extra],
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> HistoryPrior:
        n = len(state["item_mean"])
        factors = np.asarray(state["factors"], dtype=float).reshape(n, -1)
        return cls(
            item_mean=np.asarray(state["item_mean"], dtype=float), factors=factors,
            loading_var=np.asarray(state["loading_var"], dtype=float).reshape(factors.shape[1]),
            offset_var=float(state["offset_var"]), noise_var=float(state["noise_var"]),
            n_models=int(state["n_models"]), items_matched=int(state["items_matched"]),
            models=tuple(state.get("models") or ()), sources=tuple(state.get("sources") or ()),
            extra=tuple((str(k), v) for k, v in state.get("extra") or ()),
        )


def check_history_matrix(matrix: Any) -> np.ndarray:
    """Validation step: a 2-D float array of scores in [0, 1] or NaN, with at least one recorded cell."""
    hist = np.asarray(matrix, dtype=float)
    if hist.ndim != 2:
        raise InputError(f"history must be a models × items matrix, got an array of shape {hist.shape}")
    if hist.shape[0] == 0:
        raise InputError("history has no models (after leaving out the model under evaluation)")
    seen = ~np.isnan(hist)
    if not seen.any():
        raise InputError(f"history shares no item with the bank ({hist.shape[0]} models, {hist.shape[1]} items, "
                         "no recorded score on any bank item)")
    vals = hist[seen]
    if not np.all(np.isfinite(vals)) or vals.min() < 0.0 or vals.max() > 1.0:
        bad = vals[~np.isfinite(vals) | (vals < 0) | (vals > 1)][0]
        raise InputError(f"history scores must lie in [0, 1]; got {bad!r}")
    return hist


def fit_history_prior(matrix: Any, n_factors: int = DEFAULT_FACTORS, *, models: tuple[str, ...] = (),
                      sources: tuple[str, ...] = ()) -> HistoryPrior:
    """Fit the :class:`HistoryPrior` of the module docstring on a models × items history matrix.

    Deterministic (an SVD; no randomness). ``n_factors`` is capped at M − 1 and at the rank.
    """
    hist = check_history_matrix(matrix)
    if isinstance(n_factors, bool) or not isinstance(n_factors, (int, np.integer)) or n_factors < 0:
        raise InputError(f"n_factors must be a non-negative integer, got {n_factors!r}")
    m, n = hist.shape
    seen = ~np.isnan(hist)
    counts = seen.sum(axis=0)
    grand = float(hist[seen].mean())
    item_mean = (np.where(seen, hist, 0.0).sum(axis=0) + ITEM_MEAN_PSEUDO_MODELS * grand) / (
        counts + ITEM_MEAN_PSEUDO_MODELS)
    resid = np.where(seen, hist - item_mean, 0.0)
    k = int(min(n_factors, m - 1, n))
    if k > 0:
        _, s, vt = np.linalg.svd(resid, full_matrices=False)
        keep = s[:k] > 1e-9 * max(s[0], 1e-12)
        k = int(keep.sum())
        factors = vt[:k].T.copy()
        loading_var = s[:k] ** 2 / m
        explained = float(np.sum(s[:k] ** 2))
    else:
        factors = np.zeros((n, 0))
        loading_var = np.zeros(0)
        explained = 0.0
    cells = max(int(seen.sum()), 1)
    noise_var = max((float(np.sum(resid**2)) - explained) / cells, MIN_NOISE_VAR)
    model_means = np.array([row[~np.isnan(row)].mean() for row in hist if (~np.isnan(row)).any()])
    offset_var = float(np.var(model_means)) + 1e-3 if model_means.size > 1 else 0.05
    return HistoryPrior(
        item_mean=item_mean, factors=factors, loading_var=loading_var, offset_var=offset_var,
        noise_var=noise_var, n_models=m, items_matched=int(np.count_nonzero(counts)),
        models=tuple(models), sources=tuple(sources),
    )
