"""Factorized Active Querying (FAQ: Wu, Nair & Candès 2026): Laplace posterior, hybrid policy, PAI estimator and intervals.

Pieces (each a plain function over arrays, vectorised over ``R`` independent runs, so the backtest can
simulate many runs at once), and the ``faq`` method that speaks the round protocol:

* :func:`laplace_update` — online Laplace update of the new model's Gaussian factor posterior after one
  observation, with Sherman–Morrison (002 eq. 3–5, App. A.2).
* :func:`hybrid_policy` — oracle score √(p̂(1−p̂)) (002 Thm 3.2), active-learning score d_j (002 §3.4,
  App. A.5), mixing α_s and tempering β_s schedules and τ-uniform mixing (002 eq. 9–10). Items are drawn
  WITH replacement (002 App. B): the estimator below needs q_s over the whole bank.
* :func:`pai_terms` / :func:`pai_interval` — the Proactive Active Inference estimator
  φ_s = Σ_j w_j p̂_j + w_I (z_I − p̂_I)/q_s(I) (002 eq. 6, with estimand weights w_j; w_j = 1/N gives the
  paper's θ̂ = Σφ_s/(n_b N)) and three intervals:

  - ``"paper"``: the Wald interval of 002 eq. 7–8 as in the authors' code: mean squared correction minus an
    estimated squared-bias term, clamped at 0. Fixed budget only; it can collapse to zero width.
  - ``"default"``: same martingale CLT (002 Thm 3.1) but the variance is the mean squared correction
    *without* the subtraction (an upper bound in expectation: it adds the squared plug-in bias), shrunk
    with ``PSEUDO_DRAWS`` pseudo-draws towards the worst-case uniform-sampling variance 1/4 so it cannot
    collapse, and a Student-t quantile. Fixed budget only.
  - ``"anytime"``: a time-uniform asymptotic confidence sequence (Waudby-Smith, Arnold, Wu, Wang & Ramdas
    2024, Gaussian-mixture boundary, Thm 2.2 / §3 for martingale increments) around the same estimator,
    with the same conservative variance: valid at any data-dependent stopping time (asymptotically).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from scipy.special import expit

from certeval.errors import InputError

from ..protocol import BankMethod, Proposal, register
from ..results import Estimate
from ..validation import (
    check_choice,
    check_in_range,
    check_item_indices,
    check_positive,
    check_positive_int,
    check_same_length,
    check_scores,
)

CI_KINDS = ("default", "paper", "anytime")
# The default and anytime intervals shrink the observed second moment towards the worst case of uniform
# sampling (a Bernoulli variance of 1/4) with this many pseudo-draws: negligible at large budgets, it keeps
# the interval from collapsing and restores coverage when the few heavy-weight draws have not happened yet.
PSEUDO_DRAWS = 4.0
PROB_CLIP = 1e-6  # p̂ kept inside (0, 1) so logs and √(p(1−p)) stay finite

GUARANTEES = {
    "paper": (
        "fixed-budget asymptotic Wald interval of FAQ/PAI (002 eq. 8: squared-bias term subtracted, clamped at 0); "
        "valid only at a budget fixed in advance and known to under-cover at small budgets"
    ),
    "default": (
        "fixed-budget asymptotic interval for the PAI martingale (002 Thm 3.1) with a conservative variance "
        "(no bias subtraction, shrunk towards the worst-case variance 1/4 by 4 pseudo-draws) and a Student-t quantile; valid at a budget "
        "fixed in advance, not under optional stopping"
    ),
    "anytime": (
        "anytime-valid asymptotic confidence sequence for the PAI martingale (Waudby-Smith et al. 2024, "
        "Gaussian-mixture boundary): holds simultaneously over all rounds, so any data-dependent stopping time is allowed"
    ),
}


# ----------------------------------------------------------------------------------------------
# posterior
# ----------------------------------------------------------------------------------------------
def predict_probs(mean: np.ndarray, item_factors: np.ndarray) -> np.ndarray:
    """p̂_j = σ(μᵀv_j) for each run: (R, K) × (N, K) → (R, N), clipped into (0, 1)."""
    return np.clip(expit(np.atleast_2d(mean) @ item_factors.T), PROB_CLIP, 1.0 - PROB_CLIP)


def laplace_update(mean: np.ndarray, cov: np.ndarray, v: np.ndarray, z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One online Laplace step after observing score ``z`` on an item with factor ``v`` (002 App. A.2).

    With p = σ(μᵀv) and w = p(1−p) at the current mean (the expansion point):
    Σ' = Σ − w Σv vᵀΣ / (1 + w vᵀΣv)   (Sherman–Morrison for (Σ⁻¹ + w v vᵀ)⁻¹),
    μ' = μ + Σ' v (z − p).
    Vectorised over runs: mean (R, K), cov (R, K, K), v (R, K), z (R,).
    """
    p = np.clip(expit(np.einsum("rk,rk->r", mean, v)), PROB_CLIP, 1.0 - PROB_CLIP)
    w = p * (1.0 - p)
    sv = np.matmul(cov, v[:, :, None])[:, :, 0]
    vsv = np.einsum("rk,rk->r", v, sv)
    c = w / (1.0 + w * vsv)
    # Σ' = Σ − c Σv vᵀΣ (symmetric by construction: Σv (Σv)ᵀ)
    new_cov = cov - (c[:, None, None] * sv[:, :, None]) * sv[:, None, :]
    # Σ'v = Σv − c Σv (vᵀΣv) = Σv / (1 + w vᵀΣv): no second K×K product needed
    new_mean = mean + (sv / (1.0 + w * vsv)[:, None]) * (z - p)[:, None]
    return new_mean, new_cov


# ----------------------------------------------------------------------------------------------
# sampling policy
# ----------------------------------------------------------------------------------------------
def schedules(step: int, n_budget: int | None, beta0: float, rho: float, gamma: float) -> tuple[float, float]:
    """α_s = max(0, 1 − (s+1)/(ρ n_b)) and β_s = β₀ min(1, (s+1)/(γ n_b)) (002 §3.5); ρ = 0 → α = 0, γ = 0 → β = β₀."""
    if rho > 0 or gamma > 0:
        if n_budget is None:
            raise InputError("budget must be given when rho or gamma is positive (the schedules are fractions of it)")
    alpha = max(0.0, 1.0 - (step + 1.0) / (rho * n_budget)) if rho > 0 else 0.0
    beta = beta0 * min(1.0, (step + 1.0) / (gamma * n_budget)) if gamma > 0 else beta0
    return alpha, beta


def active_learning_scores(p: np.ndarray, cov: np.ndarray, item_factors: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Normalised active-learning score h_a ∝ d_j = w_j (v_jᵀΣg)² / (1 + w_j v_jᵀΣv_j), g = Σ_k ω_k w_k v_k (002 App. A.5).

    Computed in logs and normalised with a softmax, as the authors do, to avoid underflow.
    """
    w = p * (1.0 - p)
    g = (w * weights) @ item_factors  # (R, K)
    sg = np.einsum("rkl,rl->rk", cov, g)
    proj = sg @ item_factors.T  # (R, N): v_jᵀΣg
    vsv = np.einsum("nk,rkl,nl->rn", item_factors, cov, item_factors)
    log_d = np.log(w) + 2.0 * np.log(np.maximum(np.abs(proj), 1e-300)) - np.log1p(w * vsv)
    log_d -= log_d.max(axis=1, keepdims=True)
    d = np.exp(log_d)
    return d / d.sum(axis=1, keepdims=True)


@dataclass(frozen=True)
class Schedule:
    """The hybrid policy's schedule (002 eq. 9–10): mixing ``tau`` with uniform (q ≥ τ/N), the power β_s from
    ``beta0`` (rate ``gamma``), the active-learning weight α_s (rate ``rho``) over a planned ``budget`` draws
    (optional when ρ = γ = 0). The defaults are the authors' tuned winners (β₀ = 1, ρ = γ = 0)."""

    tau: float = 0.1
    budget: int | None = None
    beta0: float = 1.0
    rho: float = 0.0
    gamma: float = 0.0


@dataclass(frozen=True)
class FactorPrior:
    """The logistic factor model fitted on the history: ``item_factors`` (N×K, rows in bank order: e.g.
    :func:`certeval.estimators.faq.factor_model.item_embeddings`) and the Gaussian prior of a new model's factors,
    ``prior_mean`` (K) and ``prior_cov`` (K×K) (:func:`certeval.estimators.faq.factor_model.factor_prior`).
    None: not fitted."""

    item_factors: Any = None
    prior_mean: Any = None
    prior_cov: Any = None


DEFAULT_SCHEDULE, NO_FACTOR_PRIOR = Schedule(), FactorPrior()


def hybrid_policy(p: np.ndarray, cov: np.ndarray | None, item_factors: np.ndarray, weights: np.ndarray, *,
                  step: int, schedule: Schedule) -> np.ndarray:
    """q_s = (1−τ) h_s/Σh_s + τ/N with h_s = ((1−α_s) h_o + α_s h_a)^{β_s} (002 eq. 9–10).

    The oracle score carries the estimand weight: h_o ∝ ω_j √(p̂_j(1−p̂_j)) (002 Thm 3.2 with ω_j = 1/N).
    """
    n = p.shape[1]
    tau = schedule.tau
    alpha, beta = schedules(step, schedule.budget, schedule.beta0, schedule.rho, schedule.gamma)
    h = weights * np.sqrt(p * (1.0 - p))
    h = h / h.sum(axis=1, keepdims=True)
    if alpha > 0:
        h = (1.0 - alpha) * h + alpha * active_learning_scores(p, cov, item_factors, weights)
    if beta != 1.0:
        h = h**beta
    return (1.0 - tau) * h / h.sum(axis=1, keepdims=True) + tau / n


def draw_items(q: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draws with replacement: row r of ``u`` (R, k) in [0, 1) picks items from q[r] (R, N)."""
    r, n = q.shape
    cum = np.cumsum(q, axis=1)
    cum /= cum[:, -1:]
    offsets = np.arange(r)[:, None]
    # one searchsorted for all rows: row r's CDF lives in [r, r+1]
    flat = (cum + offsets).ravel()
    idx = np.searchsorted(flat, (u + offsets).ravel(), side="right").reshape(u.shape) - offsets * n
    return np.clip(idx, 0, n - 1)


def model_second_moment(p: np.ndarray, q: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """E[a_s² | past] if the working model were right (z_j ~ Bernoulli(p̂_j)): Σ_j ω_j² p̂_j(1−p̂_j)/q_j.

    Known before the draw and summed over the whole bank, so it does not depend on which items happened
    to be drawn: the default interval uses it as a floor for the observed second moment.
    """
    return (p * (1.0 - p) / q) @ (weights**2)


# ----------------------------------------------------------------------------------------------
# PAI estimator and intervals
# ----------------------------------------------------------------------------------------------
def pai_terms(z: np.ndarray, p_item: np.ndarray, q_item: np.ndarray, w_item: np.ndarray, plug_in: np.ndarray) -> dict[str, np.ndarray]:
    """Per-draw PAI quantities (002 eq. 6): correction a = w_I(z−p̂_I)/q, φ = plug-in + a, IPW term w_I z/q."""
    a = w_item * (z - p_item) / q_item
    return {"phi": plug_in + a, "corr": a, "ipw": w_item * z / q_item, "plug_in": plug_in}


def _sums(terms: dict[str, np.ndarray], cumulative: bool) -> dict[str, np.ndarray]:
    agg = (lambda x: np.cumsum(x, axis=-1)) if cumulative else (lambda x: np.sum(x, axis=-1))
    return {
        "phi": agg(terms["phi"]),
        "corr2": agg(terms["corr"] ** 2),
        "ipw": agg(terms["ipw"]),
        "plug_in": agg(terms["plug_in"]),
        "plug_in2": agg(terms["plug_in"] ** 2),
    }


def anytime_radius(n: np.ndarray, var: np.ndarray, alpha: float, planned_n: float) -> np.ndarray:
    """Half-width of the Gaussian-mixture asymptotic CS (Waudby-Smith et al. 2024, eq. for the two-sided AsympCS).

    σ̂ √( 2(nρ²+1)/(n²ρ²) · log(√(nρ²+1)/α) ), with ρ² tuned to be tightest at n = ``planned_n``:
    ρ² = (−2 log α + log(−2 log α + 1)) / planned_n.
    """
    rho2 = (-2.0 * math.log(alpha) + math.log(-2.0 * math.log(alpha) + 1.0)) / float(planned_n)
    n = np.asarray(n, dtype=float)
    return np.sqrt(var) * np.sqrt(2.0 * (n * rho2 + 1.0) / (n**2 * rho2) * np.log(np.sqrt(n * rho2 + 1.0) / alpha))


def interval_from_sums(
    sums: dict[str, np.ndarray],
    n: np.ndarray,
    confidence: float,
    kind: str,
    planned_n: float | None = None,
    pseudo_var: float = 0.25,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(mean, lower, upper, per-draw variance) of the PAI estimate after ``n`` draws, from running sums.

    ``pseudo_var`` is the worst-case per-draw variance of uniform sampling (1/4 for the plain bank mean;
    N Σω²/4 for other estimand weights). Runs with fewer than 2 draws get the trivial interval [0, 1].
    """
    check_choice(kind, "ci", CI_KINDS)
    n = np.asarray(n, dtype=float)
    from scipy import stats  # here: scipy.stats costs every command ~0.7 s at import

    nn = np.maximum(n, 1.0)
    alpha = 1.0 - confidence
    mean = sums["phi"] / nn
    m2 = sums["corr2"] / nn
    if kind == "paper":
        ipw_mean = sums["ipw"] / nn
        # (1/n) Σ_s (ipw̄ − P_s)², the authors' estimate of (Σ_j ω_j (z_j − p̂_j))², expanded in running sums
        bias2 = ipw_mean**2 - 2.0 * ipw_mean * sums["plug_in"] / nn + sums["plug_in2"] / nn
        var = np.maximum(m2 - bias2, 0.0)
        half = stats.norm.ppf(1.0 - alpha / 2.0) * np.sqrt(var / nn)
    elif kind == "default":
        var = (sums["corr2"] + PSEUDO_DRAWS * pseudo_var) / (n + PSEUDO_DRAWS)
        half = stats.t.ppf(1.0 - alpha / 2.0, np.maximum(n - 1.0, 1.0)) * np.sqrt(var / nn)
    else:
        var = (sums["corr2"] + PSEUDO_DRAWS * pseudo_var) / (n + PSEUDO_DRAWS)
        half = anytime_radius(nn, var, alpha, planned_n if planned_n else 100.0)
    lower = np.clip(mean - half, 0.0, 1.0)
    upper = np.clip(mean + half, 0.0, 1.0)
    few = n < 2
    lower = np.where(few, 0.0, lower)
    upper = np.where(few, 1.0, upper)
    return mean, lower, upper, var


def pai_interval(terms: dict[str, np.ndarray], confidence: float = 0.95, kind: str = "default", *, planned_n: float | None = None, path: bool = False, pseudo_var: float = 0.25):
    """PAI estimate and interval from per-draw terms with draws on the last axis.

    ``path=True`` returns the estimate/interval after every draw (for peeking / stopping-time studies).
    """
    sums = _sums(terms, cumulative=path)
    n_draws = terms["phi"].shape[-1]
    n = np.arange(1, n_draws + 1) if path else np.full(terms["phi"].shape[:-1], n_draws)
    return interval_from_sums(sums, n, confidence, kind, planned_n, pseudo_var)


# ----------------------------------------------------------------------------------------------
# the round-protocol method
# ----------------------------------------------------------------------------------------------
def _as_matrix(value: Any, name: str) -> np.ndarray:
    arr = np.asarray(value, dtype=float)
    if arr.ndim != 2 or not np.all(np.isfinite(arr)):
        raise InputError(f"{name} must be a finite 2-D array, got shape {arr.shape}")
    return arr


@register
class FAQ(BankMethod):
    """Factorized Active Querying (Wu et al. 2026, arXiv:2601.20251) as a round-protocol method named ``faq``.

    Parameters: ``factors`` (:class:`FactorPrior`), the policy's ``schedule`` (:class:`Schedule`, 002 §3.5; its
    ``budget`` also tunes the anytime interval), ``ci`` in ``default`` | ``paper`` | ``anytime``. Flat, as
    ``make_method`` and a state name them, every field is a parameter of its own (``tau``, ``item_factors``, …).

    Items are drawn with replacement: ``propose(k)`` may return an item twice, and an item may be scored
    again later. Each proposal is queued with its probability and plug-in; ``update`` matches scores to the
    oldest queued draw of the same item, so batches can be absorbed in any order.
    """

    validity = "asymptotic"  # every FAQ interval rests on a martingale CLT, its anytime CS included

    name: ClassVar[str] = "faq"
    with_replacement: ClassVar[bool] = True
    option_groups: ClassVar[dict[str, type]] = {"factors": FactorPrior, "schedule": Schedule}

    def __init__(self, factors: FactorPrior = NO_FACTOR_PRIOR, schedule: Schedule = DEFAULT_SCHEDULE,
                 ci: str = "default", confidence: float = 0.95, target: str = "bank") -> None:
        super().__init__(confidence=confidence, target=target)
        self.factors = factors
        self.schedule = schedule
        self.ci = ci

    @property
    def anytime_valid(self) -> bool:  # type: ignore[override]
        return self.ci == "anytime"

    def _validate_params(self) -> None:
        super()._validate_params()
        check_choice(self.ci, "ci", CI_KINDS)
        if self.target != "bank":
            raise InputError(f"faq estimates the bank's mean only (target='bank'), got target={self.target!r}")
        sc, fp = self.schedule, self.factors
        check_in_range(sc.tau, "tau", 0.0, 1.0, closed=False)
        check_positive(sc.beta0, "beta0")
        check_in_range(sc.rho, "rho", 0.0, float("inf"))
        check_in_range(sc.gamma, "gamma", 0.0, float("inf"))
        if sc.budget is not None:
            check_positive_int(sc.budget, "budget")
        elif sc.rho > 0 or sc.gamma > 0:
            raise InputError(f"budget must be given when rho ({sc.rho!r}) or gamma ({sc.gamma!r}) is positive")
        if fp.item_factors is None or fp.prior_mean is None or fp.prior_cov is None:
            raise InputError("faq needs item_factors, prior_mean and prior_cov (fit a FactorModel on the history first)")

    def _start_extra(self) -> None:
        v = _as_matrix(self.factors.item_factors, "item_factors")
        if v.shape[0] != self.bank_.n_items:
            raise InputError(f"item_factors must have one row per bank item ({self.bank_.n_items}), got {v.shape[0]}")
        mu = np.asarray(self.factors.prior_mean, dtype=float).reshape(-1)
        cov = _as_matrix(self.factors.prior_cov, "prior_cov")
        if mu.shape != (v.shape[1],) or cov.shape != (v.shape[1], v.shape[1]):
            raise InputError(f"prior_mean/prior_cov must have dimension K={v.shape[1]}, got {mu.shape} and {cov.shape}")
        self.factors_ = v
        self.weights_ = self.bank_.weights()
        self.mean_ = mu[None, :].copy()
        self.cov_ = cov[None, :, :].copy()
        self.step_ = 0  # draws proposed so far (the schedules' s)
        self.queue_: list[list[float]] = []  # proposed, not yet scored: [item, q, p_item, plug_in]
        self.draws_: list[list[float]] = []  # absorbed: [item, z, p_item, q, w_item, plug_in]

    # -- protocol ------------------------------------------------------------------------------
    def propose(self, k: int, rng: np.random.Generator) -> Proposal:
        self._check_started()
        k = check_positive_int(k, "k (batch size)")
        p = predict_probs(self.mean_, self.factors_)
        q = hybrid_policy(p, self.cov_, self.factors_, self.weights_, step=self.step_, schedule=self.schedule)
        items = draw_items(q, rng.random((1, k)))[0]
        plug = float(p[0] @ self.weights_)
        for it in items:
            self.queue_.append([int(it), float(q[0, it]), float(p[0, it]), plug])
        self.step_ += k
        return Proposal(items.astype(np.int64), q[0, items].astype(float))

    def update(self, items: Any, scores: Any) -> None:
        self._check_started()
        items = check_item_indices(items, self.bank_.n_items)
        scores = check_scores(scores)
        check_same_length(items, scores, "items", "scores")
        for it, z in zip(items.tolist(), scores.tolist()):
            pos = next((i for i, entry in enumerate(self.queue_) if entry[0] == it), None)
            if pos is None:
                raise InputError(f"items: item {it} was not proposed (or its draws were already scored)")
            _, q, p_item, plug = self.queue_.pop(pos)
            self.draws_.append([it, z, p_item, q, float(self.weights_[it]), plug])
            self.mean_, self.cov_ = laplace_update(self.mean_, self.cov_, self.factors_[[it]], np.array([z]))
            if not self.scored_[it]:
                self.scores_[it] = z
                self.scored_[it] = True
                self.order_ = np.concatenate([self.order_, [it]])
        if items.size:
            self.n_looks_ += 1

    def release(self, items: Any) -> None:
        """Forget queued draws of ``items`` (their batch was lost). Note: dropping draws after seeing their fate would bias PAI; only release lost work."""
        items = check_item_indices(items, self.bank_.n_items)
        for it in items.tolist():
            pos = next((i for i, entry in enumerate(self.queue_) if entry[0] == it), None)
            if pos is not None:
                self.queue_.pop(pos)

    def terms(self) -> dict[str, np.ndarray]:
        d = np.asarray(self.draws_, dtype=float).reshape(-1, 6)
        return pai_terms(d[:, 1], d[:, 2], d[:, 3], d[:, 4], d[:, 5])

    def result(self) -> Estimate:
        self._check_started()
        n = len(self.draws_)
        if n == 0:
            return self._empty_estimate(GUARANTEES[self.ci])
        terms = self.terms()
        # the anytime CS is time-uniform only for a tuning point fixed before the data: the budget, else N
        planned = self.schedule.budget if self.schedule.budget else self.bank_.n_items
        pseudo = 0.25 * self.bank_.n_items * float(np.sum(self.weights_**2))
        mean, lo, hi, var = pai_interval(terms, float(self.confidence), self.ci, planned_n=planned, pseudo_var=pseudo)
        extra = (
            ("ci", self.ci),
            ("n_draws", n),
            ("n_distinct", int(self.scored_.sum())),
            ("variance_per_draw", float(var)),
            ("plug_in", float(terms["plug_in"][-1])),
        )
        return Estimate(
            method=self.name,
            mean=float(mean),
            lower=float(lo),
            upper=float(hi),
            n_scored=n,
            confidence=float(self.confidence),
            anytime_valid=self.anytime_valid,
            target=self.target,
            n_total=self.bank_.n_items,
            guarantee=GUARANTEES[self.ci],
            exhausted=False,  # sampling with replacement never exhausts the bank: θ̂ stays an estimate
            validity="asymptotic",  # every FAQ interval rests on a martingale CLT, its anytime CS included
            extra=extra,
        )

    # -- persistence: the draws carry everything (an item drawn twice is one scored item and two draws) --------
    def _state_extra(self) -> dict[str, Any]:
        return {"step": self.step_, "queue": self.queue_, "draws": self.draws_, "posterior_mean": self.mean_[0],
                "posterior_cov": self.cov_[0]}

    def _replay(self, order: np.ndarray, scores: np.ndarray, looks: int) -> None:
        self.n_looks_ = looks  # the scores come back with the draws (:meth:`_load_extra`), posterior and all

    def _load_extra(self, extra: dict[str, Any]) -> None:
        self.step_ = int(extra.get("step", 0))
        self.queue_ = [[int(e[0]), float(e[1]), float(e[2]), float(e[3])] for e in extra.get("queue", [])]
        self.draws_ = [[int(d[0])] + [float(x) for x in d[1:]] for d in extra.get("draws", [])]
        self.mean_ = np.asarray(extra.get("posterior_mean", self.mean_[0]), dtype=float)[None, :]
        self.cov_ = np.asarray(extra.get("posterior_cov", self.cov_[0]), dtype=float)[None, :, :]
        for d in self.draws_:
            it = int(d[0])
            if not self.scored_[it]:
                self.scores_[it] = d[1]
                self.scored_[it] = True
                self.order_ = np.concatenate([self.order_, [it]])
