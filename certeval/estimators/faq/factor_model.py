"""Logistic factor model of a partially observed model × item correctness matrix (FAQ: Wu et al. 2026, arXiv:2601.20251, §3.1 and App. A.1).

P(model i answers item j correctly) = σ(uᵢᵀvⱼ), no bias term (as in 002 eq. 2). The fit minimises the
L2-penalised negative log-likelihood over the *observed* entries,

    L(U, V) = Σ_{(i,j) observed} [softplus(uᵢᵀvⱼ) − z_ij uᵢᵀvⱼ] + (λ/2)(‖U‖² + ‖V‖²),

(002 eq. 13 with the weight decay written as an explicit penalty) with scipy's L-BFGS on a vectorised
gradient, instead of the paper's 2000 AdamW epochs. The dimension K and penalty λ are chosen by
cross-validation on held-out observed entries with the one-standard-error rule (Friedman, Hastie &
Tibshirani 2010), as in 002 §4.

The fitted item factors double as item embeddings (:func:`item_embeddings`) for Cer-Eval's partition.
Persistence is array-only (:meth:`FactorModel.to_arrays` / :meth:`FactorModel.from_arrays`, written
with ``np.savez`` outside this pure package): never pickle.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import minimize

from certeval.errors import InputError

from ..validation import check_positive, check_positive_int

DEFAULT_FACTOR_GRID = (2, 4, 8, 16)
DEFAULT_PENALTY_GRID = (0.3, 1.0, 3.0, 10.0)


# ----------------------------------------------------------------------------------------------
# loss and gradient
# ----------------------------------------------------------------------------------------------
def factor_loss_and_grad(
    model_factors: np.ndarray,
    item_factors: np.ndarray,
    scores: np.ndarray,
    mask: np.ndarray,
    penalty: float,
) -> tuple[float, np.ndarray, np.ndarray]:
    """Penalised masked negative log-likelihood (002 eq. 13) and its gradient in U and V.

    ``scores`` is the (M, N) matrix (any value where ``mask`` is False), ``mask`` the observed entries.
    Scores in [0, 1] are allowed (the Bernoulli log-likelihood extends to fractional targets).
    Returns ``(loss, dL/dU, dL/dV)``.
    """
    logits = model_factors @ item_factors.T
    # softplus(x) − z·x with one exp: softplus(x) = log1p(e^{−|x|}) + max(x, 0); σ(x) from the same e^{−|x|}
    e = np.exp(-np.abs(logits))
    nll = np.log1p(e) + np.maximum(logits, 0.0) - scores * logits
    loss = float(np.sum(nll * mask))
    inv = 1.0 / (1.0 + e)
    prob = np.where(logits >= 0, inv, e * inv)
    resid = (prob - scores) * mask  # unobserved entries contribute nothing
    grad_u = resid @ item_factors + penalty * model_factors
    grad_v = resid.T @ model_factors + penalty * item_factors
    loss += 0.5 * penalty * (float(np.sum(model_factors**2)) + float(np.sum(item_factors**2)))
    return loss, grad_u, grad_v


def fit_factors(
    scores: np.ndarray,
    mask: np.ndarray,
    n_factors: int,
    penalty: float,
    rng: np.random.Generator,
    *,
    tol: float = 1e-6,
    max_iter: int = 500,
    init_scale: float = 0.1,
) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """Fit U (M×K) and V (N×K) by L-BFGS from a random start drawn with ``rng`` (deterministic given it)."""
    m, n = scores.shape
    k = int(n_factors)
    z = np.where(mask, scores, 0.0)
    x0 = init_scale * rng.standard_normal((m + n) * k)

    def fun(x: np.ndarray) -> tuple[float, np.ndarray]:
        u = x[: m * k].reshape(m, k)
        v = x[m * k:].reshape(n, k)
        loss, gu, gv = factor_loss_and_grad(u, v, z, mask, penalty)
        return loss, np.concatenate([gu.ravel(), gv.ravel()])

    # ftol is relative to the loss; the loss is a sum over entries, so scale-free enough
    res = minimize(fun, x0, jac=True, method="L-BFGS-B", options={"maxiter": max_iter, "ftol": tol, "gtol": 1e-5})
    u = res.x[: m * k].reshape(m, k)
    v = res.x[m * k:].reshape(n, k)
    info = {"loss": float(res.fun), "n_iter": int(res.nit), "converged": bool(res.success)}
    return u, v, info


def heldout_log_loss(model_factors: np.ndarray, item_factors: np.ndarray, rows: np.ndarray, cols: np.ndarray, z: np.ndarray) -> float:
    """Mean Bernoulli log-loss on held-out entries (rows, cols, z)."""
    logits = np.einsum("ik,ik->i", model_factors[rows], item_factors[cols])
    return float(np.mean(np.logaddexp(0.0, logits) - z * logits))


# ----------------------------------------------------------------------------------------------
# cross-validation with the one-standard-error rule
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class CVResult:
    """Cross-validated held-out log-loss per (K, λ) and the choice made by the 1-SE rule."""

    factor_grid: tuple[int, ...]
    penalty_grid: tuple[float, ...]
    mean_loss: np.ndarray  # (len(factor_grid), len(penalty_grid))
    se_loss: np.ndarray
    n_factors: int
    penalty: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "factor_grid": list(self.factor_grid),
            "penalty_grid": list(self.penalty_grid),
            "mean_loss": self.mean_loss.tolist(),
            "se_loss": self.se_loss.tolist(),
            "n_factors": int(self.n_factors),
            "penalty": float(self.penalty),
        }


def one_se_choice(factor_grid: Sequence[int], penalty_grid: Sequence[float], mean_loss: np.ndarray, se_loss: np.ndarray) -> tuple[int, float]:
    """The simplest (smallest K, then largest λ) setting whose CV loss is within one SE of the best.

    Friedman, Hastie & Tibshirani (2010) §2.5 / ESL §7.10: threshold = min mean + SE at the minimum.
    """
    best = np.unravel_index(np.nanargmin(mean_loss), mean_loss.shape)
    threshold = mean_loss[best] + se_loss[best]
    order = sorted(
        (int(factor_grid[a]), -float(penalty_grid[b]), a, b) for a in range(len(factor_grid)) for b in range(len(penalty_grid))
    )
    for _, _, a, b in order:
        if mean_loss[a, b] <= threshold:
            return int(factor_grid[a]), float(penalty_grid[b])
    return int(factor_grid[best[0]]), float(penalty_grid[best[1]])  # pragma: no cover - the best always qualifies


def cross_validate(
    scores: np.ndarray,
    mask: np.ndarray,
    rng: np.random.Generator,
    *,
    factor_grid: Sequence[int] = DEFAULT_FACTOR_GRID,
    penalty_grid: Sequence[float] = DEFAULT_PENALTY_GRID,
    n_folds: int = 3,
    tol: float = 1e-5,
    max_iter: int = 300,
) -> CVResult:
    """``n_folds``-fold CV over observed entries (held-out log-loss), then the 1-SE rule."""
    rows, cols = np.nonzero(mask)
    if rows.size < n_folds:
        raise InputError(f"history has {rows.size} observed entries, too few for {n_folds}-fold cross-validation")
    fold = rng.permutation(rows.size) % n_folds
    losses = np.full((len(factor_grid), len(penalty_grid), n_folds), np.nan)
    base_seed = int(rng.integers(2**31))
    for f in range(n_folds):
        held = fold == f
        train_mask = mask.copy()
        train_mask[rows[held], cols[held]] = False
        z_held = scores[rows[held], cols[held]]
        for a, k in enumerate(factor_grid):
            for b, lam in enumerate(penalty_grid):
                # one seed per (fold, K, λ): the grid cell's fit does not depend on iteration order
                cell_rng = np.random.default_rng([base_seed, f, a, b])
                u, v, _ = fit_factors(scores, train_mask, k, lam, cell_rng, tol=tol, max_iter=max_iter)
                losses[a, b, f] = heldout_log_loss(u, v, rows[held], cols[held], z_held)
    mean = losses.mean(axis=2)
    se = losses.std(axis=2, ddof=1) / np.sqrt(n_folds) if n_folds > 1 else np.zeros_like(mean)
    k_best, lam_best = one_se_choice(factor_grid, penalty_grid, mean, se)
    return CVResult(tuple(int(k) for k in factor_grid), tuple(float(x) for x in penalty_grid), mean, se, k_best, lam_best)


# ----------------------------------------------------------------------------------------------
# the estimator
# ----------------------------------------------------------------------------------------------
class FactorModel:
    """Logistic factor model P(correct) = σ(uᵢᵀvⱼ) fitted on a partially observed history (002 §3.1).

    scikit-learn contract: ``__init__`` stores parameters; :meth:`fit` sets ``model_factors_`` (M×K),
    ``item_factors_`` (N×K), ``n_factors_``, ``penalty_``, ``cv_`` (a :class:`CVResult` or None) and
    ``fit_info_``. ``n_factors`` / ``penalty`` set to None are chosen by cross-validation (1-SE rule).
    """

    def __init__(
        self,
        n_factors: int | None = None,
        penalty: float | None = None,
        *,
        factor_grid: Sequence[int] = DEFAULT_FACTOR_GRID,
        penalty_grid: Sequence[float] = DEFAULT_PENALTY_GRID,
        n_folds: int = 3,
        tol: float = 1e-6,
        max_iter: int = 500,
    ) -> None:
        self.n_factors = n_factors
        self.penalty = penalty
        self.factor_grid = factor_grid
        self.penalty_grid = penalty_grid
        self.n_folds = n_folds
        self.tol = tol
        self.max_iter = max_iter

    def _validate(self, scores: Any, mask: Any) -> tuple[np.ndarray, np.ndarray]:
        z = np.asarray(scores, dtype=float)
        if z.ndim != 2:
            raise InputError(f"history must be a 2-D model × item matrix, got shape {z.shape}")
        observed = np.isfinite(z) if mask is None else np.asarray(mask, dtype=bool)
        if observed.shape != z.shape:
            raise InputError(f"mask must have the history's shape {z.shape}, got {observed.shape}")
        if mask is not None and not np.all(np.isfinite(z[observed])):
            raise InputError("history has a NaN or infinite score at an observed entry")
        vals = z[observed]
        if vals.size and (vals.min() < 0 or vals.max() > 1):
            raise InputError(f"history scores must lie in [0, 1], got a value {vals[(vals < 0) | (vals > 1)][0]!r}")
        if z.shape[0] < 2:
            raise InputError(f"history must hold at least 2 models to form a prior, got {z.shape[0]}")
        if not observed.any():
            raise InputError("history has no observed entry")
        if self.n_factors is not None:
            check_positive_int(self.n_factors, "n_factors")
        if self.penalty is not None:
            check_positive(self.penalty, "penalty")
        check_positive_int(self.n_folds, "n_folds", minimum=2)
        return np.where(observed, z, 0.0), observed

    def fit(self, scores: Any, mask: Any = None, *, rng: np.random.Generator | None = None) -> FactorModel:
        """Fit on ``scores`` (M×N; NaN = missing unless ``mask`` is given). ``rng`` makes it deterministic."""
        z, observed = self._validate(scores, mask)
        rng = np.random.default_rng(0) if rng is None else rng
        self.cv_ = None
        k, lam = self.n_factors, self.penalty
        if k is None or lam is None:
            grid_k = (int(k),) if k is not None else tuple(self.factor_grid)
            grid_l = (float(lam),) if lam is not None else tuple(self.penalty_grid)
            self.cv_ = cross_validate(z, observed, rng, factor_grid=grid_k, penalty_grid=grid_l, n_folds=self.n_folds, tol=max(self.tol, 1e-5), max_iter=min(self.max_iter, 300))
            k, lam = self.cv_.n_factors, self.cv_.penalty
        self.n_factors_, self.penalty_ = int(k), float(lam)
        u, v, info = fit_factors(z, observed, self.n_factors_, self.penalty_, rng, tol=self.tol, max_iter=self.max_iter)
        self.model_factors_, self.item_factors_, self.fit_info_ = u, v, info
        return self

    # -- use ---------------------------------------------------------------------------------
    def prior(self) -> tuple[np.ndarray, np.ndarray]:
        """Gaussian prior for a new model's factor: empirical mean and covariance of U (002 §3.1)."""
        return factor_prior(self.model_factors_)

    # -- persistence (arrays only; the caller writes them with np.savez) -------------------------
    def to_arrays(self, item_ids: Sequence[str] | None = None, model_ids: Sequence[str] | None = None) -> dict[str, np.ndarray]:
        out = {
            "model_factors": np.asarray(self.model_factors_, dtype=float),
            "item_factors": np.asarray(self.item_factors_, dtype=float),
            "penalty": np.asarray(self.penalty_, dtype=float),
        }
        if item_ids is not None:
            out["item_ids"] = np.asarray([str(i) for i in item_ids], dtype=str)
        if model_ids is not None:
            out["model_ids"] = np.asarray([str(i) for i in model_ids], dtype=str)
        return out

    @classmethod
    def from_arrays(cls, arrays: Any) -> FactorModel:
        u = np.asarray(arrays["model_factors"], dtype=float)
        v = np.asarray(arrays["item_factors"], dtype=float)
        if u.ndim != 2 or v.ndim != 2 or u.shape[1] != v.shape[1]:
            raise InputError(f"factor arrays must be (M, K) and (N, K), got {u.shape} and {v.shape}")
        pen = float(arrays["penalty"]) if "penalty" in arrays else float("nan")
        obj = cls(n_factors=u.shape[1], penalty=pen if np.isfinite(pen) else None)
        obj.model_factors_, obj.item_factors_ = u, v
        obj.n_factors_, obj.penalty_ = int(u.shape[1]), pen
        obj.cv_, obj.fit_info_ = None, {}
        return obj


def factor_prior(model_factors: np.ndarray, jitter: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """Mean and covariance of the historical model factors, with a tiny ridge so Σ₀ is positive definite."""
    u = np.asarray(model_factors, dtype=float)
    if u.ndim != 2 or u.shape[0] < 2:
        raise InputError(f"a prior needs at least 2 historical models, got model factors of shape {u.shape}")
    mean = u.mean(axis=0)
    cov = np.atleast_2d(np.cov(u, rowvar=False))
    cov = 0.5 * (cov + cov.T) + jitter * max(float(np.trace(cov)) / cov.shape[0], 1e-12) * np.eye(cov.shape[0])
    return mean, cov


def item_embeddings(item_factors: np.ndarray, factor_item_ids: Sequence[str] | None = None, bank_item_ids: Sequence[str] | None = None) -> np.ndarray:
    """Item factors as an ``(n_items, K)`` embedding array (for ``BankSpec.features``).

    With ``factor_item_ids`` and ``bank_item_ids`` the rows are reordered to the bank's order; bank items
    the factor model never saw get the zero vector (σ(0) = 1/2: no information). No overlap → InputError.
    """
    v = np.asarray(item_factors, dtype=float)
    if factor_item_ids is None or bank_item_ids is None:
        return v.copy()
    index = {str(iid): i for i, iid in enumerate(factor_item_ids)}
    pos = np.array([index.get(str(iid), -1) for iid in bank_item_ids], dtype=np.int64)
    if not np.any(pos >= 0):
        raise InputError(f"the factor model shares no item with the bank ({len(bank_item_ids)} items)")
    out = np.zeros((len(pos), v.shape[1]))
    out[pos >= 0] = v[pos[pos >= 0]]
    return out


def matrix_from_long(models: Sequence[str], item_ids: Sequence[str], scores: Sequence[float], model_order: Sequence[str], item_order: Sequence[str]) -> np.ndarray:
    """Dense (models × items) matrix from a long table (NaN where no score). Unknown ids are dropped."""
    mi = {str(m): i for i, m in enumerate(model_order)}
    ii = {str(t): j for j, t in enumerate(item_order)}
    out = np.full((len(mi), len(ii)), np.nan)
    r = np.array([mi.get(str(m), -1) for m in models], dtype=np.int64)
    c = np.array([ii.get(str(t), -1) for t in item_ids], dtype=np.int64)
    keep = (r >= 0) & (c >= 0)
    out[r[keep], c[keep]] = np.asarray(scores, dtype=float)[keep]
    return out
