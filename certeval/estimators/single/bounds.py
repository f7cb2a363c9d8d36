"""Confidence radii and confidence sequences for the mean of scores in [0, 1].

* :func:`hoeffding_radius` — fixed-sample Hoeffding (1963), two-sided:
  ``sqrt(ln(2/δ) / (2n))``. Valid at one pre-set n only (the "Base" of Wang et al. 2025, arXiv:2505.03814).
* :func:`seq_radius` — Wang et al. 2025, Algorithm 3 line 3 (adaptive Hoeffding, anytime valid):
  ``ε_n = sqrt({2 ln(ln n + 1) + ln(4/δ)} / n)`` (natural logs; docs/results_single.md).
* :func:`cereval_radius` — Wang et al. 2025, Algorithm 1 lines 10–11 (per-stratum adaptive
  empirical Bernstein): ``η = sqrt({2 ln(ln n + 1) + ln(16K/δ)}/n)``,
  ``ε = 2η²/3 + 2 sqrt((v + η + η²) η²)``.
* :class:`BettingCS` — the hedged betting confidence sequence of Waudby-Smith &
  Ramdas, for sampling *without replacement* from a finite population
  ("Confidence sequences for sampling without replacement", NeurIPS 2020, §3,
  the capital process K_t(m) = ∏ (1 + λ_i (X_i − μ_i^WoR(m))) with
  μ_i^WoR(m) = (N m − Σ_{j<i} X_j)/(N − i + 1)), or for an i.i.d. stream
  ("Estimating means of bounded random variables by betting", JRSS-B 2024,
  Thm 3 / eq. (26)–(27): μ_i(m) = m).
"""

from __future__ import annotations

import math

import numpy as np


def hoeffding_radius(n: int | np.ndarray, delta: float) -> np.ndarray | float:
    """Two-sided fixed-sample Hoeffding radius ``sqrt(ln(2/δ)/(2n))`` (1.0 when n = 0)."""
    n_arr = np.asarray(n, dtype=float)
    with np.errstate(divide="ignore"):
        out = np.where(n_arr > 0, np.sqrt(math.log(2.0 / delta) / (2.0 * np.maximum(n_arr, 1.0))), 1.0)
    return float(out) if out.ndim == 0 else out


def seq_radius(n: int | np.ndarray, delta: float) -> np.ndarray | float:
    """Wang et al. 2025, Alg. 3 line 3: ``sqrt({2 ln(ln n + 1) + ln(4/δ)}/n)``; 1.0 for n = 0."""
    n_arr = np.maximum(np.asarray(n, dtype=float), 1.0)
    out = np.sqrt((2.0 * np.log(np.log(n_arr) + 1.0) + math.log(4.0 / delta)) / n_arr)
    out = np.where(np.asarray(n) > 0, out, 1.0)
    return float(out) if out.ndim == 0 else out


def cereval_radius(n: int | np.ndarray, v: float | np.ndarray, n_strata: int, delta: float) -> np.ndarray | float:
    """Wang et al. 2025, Alg. 1 lines 10–11 for a stratum with ``n`` points and empirical variance ``v``.

    η = sqrt({2 ln(ln n + 1) + ln(16K/δ)}/n);  ε = 2η²/3 + 2 sqrt((v + η + η²) η²).
    Returns 1.0 (trivial) for n = 0.
    """
    n_arr = np.asarray(n, dtype=float)
    safe = np.maximum(n_arr, 1.0)
    eta2 = (2.0 * np.log(np.log(safe) + 1.0) + math.log(16.0 * n_strata / delta)) / safe
    eta = np.sqrt(eta2)
    eps = 2.0 * eta2 / 3.0 + 2.0 * np.sqrt((np.asarray(v, dtype=float) + eta + eta2) * eta2)
    out = np.where(n_arr > 0, eps, 1.0)
    return float(out) if out.ndim == 0 else out


def deterministic_bounds(total: float, n_scored: int, n_population: int) -> tuple[float, float]:
    """Bounds on a finite population's mean from its scored part alone (unscored ∈ [0, 1])."""
    return total / n_population, (total + (n_population - n_scored)) / n_population


class _HedgedGridCS:
    """What both betting CSs below keep: the grid of candidate means, the two log capitals K⁺ and K⁻ per
    candidate, the permanently rejected candidates, the Ville threshold ln(1/δ) and the bet tuning
    (:func:`bet_sizes`; ``population`` N for a horizon's ``1/n* − 1/N``)."""

    def __init__(self, delta: float, grid_size: int, c: float, bet_halfwidth: float | None,
                 bet_horizon: int | None, population: int | None) -> None:
        self.delta = float(delta)
        self.c = float(c)
        self.bet_halfwidth = None if bet_halfwidth is None else float(bet_halfwidth)
        self._horizon = horizon_scale(bet_horizon, population)
        self.grid = np.linspace(0.0, 1.0, int(grid_size))
        self.step = self.grid[1] - self.grid[0]
        self.log_kplus = np.zeros(self.grid.size)
        self.log_kminus = np.zeros(self.grid.size)
        self.rejected = np.zeros(self.grid.size, dtype=bool)
        self.n = 0
        self._log_threshold = math.log(1.0 / self.delta)
        self._log_bet = 2.0 * math.log(2.0 / self.delta)


class BettingCS(_HedgedGridCS):
    """Hedged betting confidence sequence for a mean in [0, 1], over a grid of candidate means.

    Construction (Waudby-Smith & Ramdas 2020/2024): for each candidate mean m
    two capital processes are run,

        K⁺_t(m) = ∏_{i≤t} (1 + λ⁺_i(m) (X_i − μ_i(m))),
        K⁻_t(m) = ∏_{i≤t} (1 − λ⁻_i(m) (X_i − μ_i(m))),

    with μ_i(m) the mean of the *remaining* population under m (without
    replacement, ``n_population`` given) or m itself (i.i.d.). The bets are the
    predictable plug-in λ̂_i = sqrt(2 ln(2/δ) / (σ̂²_{i−1} i ln(1+i))) with
    σ̂²_{i−1} = (1/4 + Σ_{j<i} (X_j − μ̂_j)²)/i and μ̂_j = (1/2 + Σ_{l≤j} X_l)/(j+1),
    truncated to λ⁺ = min(λ̂, c/μ_i(m)), λ⁻ = min(λ̂, c/(1 − μ_i(m))) with c = 1/2,
    so every factor stays ≥ 1 − c > 0. Under the true m each process is a
    nonnegative martingale with initial value 1 (uniform sampling without
    replacement makes E[X_i | past] = μ_i(m)); so is their average
    K_t = (K⁺_t + K⁻_t)/2 and Ville's inequality gives
    P(∃t: K_t(μ) ≥ 1/δ) ≤ δ. The confidence sequence is {m : K_s(m) < 1/δ ∀s ≤ t}
    (running intersection; still valid by the same event), further intersected
    with the deterministic bounds of a finite population, so the width is exactly
    zero once every item is scored.

    The grid makes the set computable incrementally (O(grid) per observation).
    The reported interval is the hull of the accepted grid points widened by one
    grid step on each side, so a true mean between two grid points is not cut off.
    """

    def __init__(self, delta: float, n_population: int | None = None, grid_size: int = 4097, c: float = 0.5,
                 bet_halfwidth: float | None = None, bet_horizon: int | None = None) -> None:
        super().__init__(delta, grid_size, c, bet_halfwidth, bet_horizon, n_population)
        self.n_population = None if n_population is None else int(n_population)
        self.total = 0.0
        self._shrunk_mean = 0.5  # μ̂_n = (1/2 + Σ X)/(n+1)
        self._sq_dev = 0.25  # 1/4 + Σ (X_j − μ̂_j)²
        self.running = (0.0, 1.0)
        self._window = (0, self.grid.size)  # candidates [a, b) not yet rejected

    # -- bets --------------------------------------------------------------
    def _bets(self, x: np.ndarray) -> np.ndarray:
        """Predictable plug-in λ̂_i for the next len(x) observations (each uses only earlier ones)."""
        var = np.empty(x.size)
        n, s, sq, mu_hat = self.n, self.total, self._sq_dev, self._shrunk_mean
        for j, xj in enumerate(x):
            i = n + 1
            var[j] = sq / i
            # update running statistics with X_i
            s += xj
            mu_hat = (0.5 + s) / (i + 1)
            sq += (xj - mu_hat) ** 2
            n = i
        self._sq_dev, self._shrunk_mean = sq, mu_hat
        i = self.n + 1 + np.arange(x.size, dtype=float)
        # slope of the conditional mean in m: N/(N − i + 1) without replacement, 1 for an i.i.d. stream
        alpha = np.ones(x.size) if self.n_population is None else self.n_population / np.maximum(
            self.n_population - i + 1, 1.0)
        return bet_sizes(i, alpha, var, self._log_bet, self.bet_halfwidth, self._horizon)

    def update(self, x: np.ndarray, chunk: int = 256) -> None:
        x = np.asarray(x, dtype=float).reshape(-1)
        for start in range(0, x.size, chunk):
            self._update_chunk(x[start:start + chunk])
        self._refresh_running()

    def _update_chunk(self, x: np.ndarray) -> None:
        if x.size == 0:
            return
        lam = self._bets(x)[:, None]
        # rejection is permanent, so only the window of still-accepted candidates is updated
        a, b = self._window
        grid = self.grid[a:b]
        prior_sums = self.total + np.concatenate([[0.0], np.cumsum(x)[:-1]])
        if self.n_population is None:
            mu = np.broadcast_to(grid, (x.size, grid.size))
        else:
            idx = self.n + np.arange(x.size)  # i − 1 for each observation
            remaining = (self.n_population - idx)[:, None].astype(float)
            mu = (self.n_population * grid[None, :] - prior_sums[:, None]) / remaining
        mu = np.clip(mu, 0.0, 1.0)  # infeasible candidates are rejected by the deterministic bounds
        dev = x[:, None] - mu
        with np.errstate(divide="ignore"):
            lam_plus = np.minimum(lam, self.c / mu)
            lam_minus = np.minimum(lam, self.c / (1.0 - mu))
        self.log_kplus[a:b] += np.log1p(lam_plus * dev).sum(axis=0)
        self.log_kminus[a:b] += np.log1p(-lam_minus * dev).sum(axis=0)
        self.n += x.size
        self.total += float(x.sum())
        log_k = np.logaddexp(self.log_kplus[a:b], self.log_kminus[a:b]) - math.log(2.0)
        self.rejected[a:b] |= log_k >= self._log_threshold
        f_lo, f_hi = self.feasible()
        ok = ~self.rejected[a:b] & (grid >= f_lo - self.step) & (grid <= f_hi + self.step)
        acc = np.flatnonzero(ok)
        if acc.size == 0:
            self._window = (a, a)
        else:
            self._window = (a + int(acc[0]), a + int(acc[-1]) + 1)
        self.rejected[:self._window[0]] = True
        self.rejected[self._window[1]:] = True

    # -- interval ------------------------------------------------------------
    def feasible(self) -> tuple[float, float]:
        if self.n_population is None:
            return 0.0, 1.0
        return deterministic_bounds(self.total, self.n, self.n_population)

    def _refresh_running(self) -> None:
        lo, hi = self._current()
        running = (max(self.running[0], lo), min(self.running[1], hi))
        if running[0] > running[1]:
            # the sequence has excluded every value (an event of probability ≤ δ, or float rounding at
            # exhaustion): report what is certain, the population's deterministic bounds — exact once every
            # item is scored — never a midpoint of crossed bounds
            running = self.feasible()
        self.running = running

    def _current(self) -> tuple[float, float]:
        f_lo, f_hi = self.feasible()
        if self.n == 0:
            return f_lo, f_hi
        ok = ~self.rejected & (self.grid >= f_lo - self.step) & (self.grid <= f_hi + self.step)
        acc = np.flatnonzero(ok)
        if acc.size == 0:
            return f_lo, f_hi
        lo = self.grid[acc[0]] - self.step
        hi = self.grid[acc[-1]] + self.step
        lo, hi = max(lo, f_lo, 0.0), min(hi, f_hi, 1.0)
        if lo > hi:
            return f_lo, f_hi
        return lo, hi

    def interval(self) -> tuple[float, float]:
        """The running-intersection interval for the mean."""
        return self.running

    @property
    def mean(self) -> float:
        return self.total / self.n if self.n else float("nan")


# Truncation of the control-variate bets: every factor 1 + λ(Y − ν) stays ≥ 1 − c > 0 (any c < 1 keeps the
# capital a nonnegative supermartingale). Importance-weighted residuals have a wide worst-case range but rarely
# reach it, so the range cap binds; c = 0.8 instead of ½ needed 10–25% fewer items for ``history`` at ±0.1 and
# ±0.05 (helm_mmlu, openllm_arc, vlm_ocrbench, 20 reps each; 0.9 gained 1–5% more).
CONTROL_VARIATE_C = 0.8


def horizon_scale(horizon: int | None, population: int | None) -> float | None:
    """``1/n* − 1/N`` for a run planned to stop after ``horizon`` = n* draws from a population of N (∞ when
    None); None when there is no horizon or it covers the population (the width is 0 there anyway)."""
    if horizon is None:
        return None
    scale = 1.0 / float(horizon) - (0.0 if population is None else 1.0 / float(population))
    return scale if scale > 0 else None


def bet_sizes(i: np.ndarray, alpha: np.ndarray, var: np.ndarray, log_bet: float,
              halfwidth: float | None, horizon: float | None = None) -> np.ndarray:
    """Bet sizes for observations ``i`` (1-based) with predictable variance ``var`` of the observation and slope
    ``α_i = dν_i/dm`` of its conditional mean in the estimand m (1 for an i.i.d. mean, ``N/(N − i + 1)``
    without replacement, ``W/U_i`` for a weighted bank).

    * ``halfwidth`` None — Waudby-Smith & Ramdas's predictable plug-in for all times (JRSS-B 2024, eq. (26)):
      ``λ_i = sqrt(2 ln(2/δ) / (v_i i ln(1+i)))`` (``log_bet`` = 2 ln(2/δ)).
    * ``halfwidth`` ε — tuned to where the run will stop: a candidate m at distance ε from the truth gains
      ``E log(1 + λ(Y − ν_i(m))) ≈ λ α_i ε − λ² v_i / 2`` per observation, largest at ``λ_i = α_i ε / v_i``;
      with constant α and v the capital of a candidate ε away reaches 2/δ after ``n = 2 v ln(2/δ)/ε²``
      observations — the best constant bet with the variance known (WSR 2024 §5's horizon-tuned choice).
    * ``horizon`` (``1/n* − 1/N`` from :func:`horizon_scale`) — tuned to stop after n* draws: the half-width
      reachable there, ``ε = sqrt(2 v ln(2/δ) (1/n* − 1/N))`` (without replacement Σ α_i² ≈ n* N/(N − n*)),
      in the rule above: ``λ_i = α_i sqrt(2 ln(2/δ) (1/n* − 1/N) / v_i)``.
    * both — tuned to the run's reachable horizon ``min(n_goal, n*)``: the goal's half-width unless the budget
      stops the run first, i.e. ``ε_i = max(ε, sqrt(2 v_i ln(2/δ) (1/n* − 1/N)))`` in ``λ_i = α_i ε_i / v_i``
      (the goal's implied size ``n_goal`` solves ``ε = sqrt(2 v ln(2/δ)(1/n − 1/N))``; a larger ε is a smaller n).

    Any nonnegative predictable λ keeps the capital a nonnegative (super)martingale: the choice changes the
    width, never the validity (callers truncate λ so that every factor stays ≥ 1 − c).
    """
    var = np.maximum(np.asarray(var, dtype=float), 1e-6)
    if halfwidth is not None:
        eps = float(halfwidth)
        if horizon is not None:  # the budget stops the run before the goal's size: tune to the budget
            eps = np.maximum(eps, np.sqrt(log_bet * float(horizon) * var))
        return np.asarray(alpha, dtype=float) * eps / var
    if horizon is not None:
        return np.asarray(alpha, dtype=float) * np.sqrt(log_bet * float(horizon) / var)
    return np.sqrt(log_bet / (var * i * np.log1p(i)))


class ControlVariateCS(_HedgedGridCS):
    """Betting confidence sequence for one group's weighted mean from importance-weighted draws.

    Observation i is ``Y_i`` with known range ``[y_min, y_max]`` and, under the candidate mean m,
    conditional mean ``ν_i(m) = α_i m + β_i`` (increasing in m). Capital as in Waudby-Smith & Ramdas
    (2020/2024): ``K_t(m) = ½∏(1 + λ⁺_i (Y_i − ν_i(m))) + ½∏(1 − λ⁻_i (Y_i − ν_i(m)))``, predictable bets
    from :func:`bet_sizes` (``v_i`` a predictable variance of Y_i; WSR's all-times plug-in, or tuned to the goal's
    half-width) truncated to ``c/(ν − y_min)`` and ``c/(y_max − ν)`` (``c`` = :data:`CONTROL_VARIATE_C`) so every
    factor is ≥ 1 − c > 0; rejection is permanent once
    ``K_t(m) ≥ 1/δ`` (Ville). Both products are monotone in m, so the grid hull widened by one step is
    an outer bound of the set.
    """

    def __init__(self, delta: float, grid_size: int = 4097, c: float = CONTROL_VARIATE_C,
                 bet_halfwidth: float | None = None, bet_horizon: int | None = None,
                 population: int | None = None) -> None:
        super().__init__(delta, grid_size, c, bet_halfwidth, bet_horizon, population)

    def _bets(self, i: np.ndarray, alpha: np.ndarray, var: np.ndarray) -> np.ndarray:
        """Predictable bet sizes before truncation (see :func:`bet_sizes`)."""
        return bet_sizes(i, alpha, var, self._log_bet, self.bet_halfwidth, self._horizon)

    def tuned_draws(self, i: float, alpha: float, var: float) -> float:
        """The number of draws n for which observation i's bet (variance ``var``) is the best constant bet,
        ``λ = sqrt(2 ln(2/δ) / (n v))`` solved for n: where a run with these bets is tuned to stop."""
        lam = float(self._bets(np.array([float(i)]), np.array([alpha]), np.array([var]))[0])
        return self._log_bet / (lam**2 * max(var, 1e-6))

    def predicted_width(self, i: float, alpha: float, var: float, reach: tuple[float, float], draws: float) -> float:
        """The width this CS is predicted to reach after ``draws`` observations like observation i: variance
        ``var``, slope ``alpha``, and ``reach`` = (ν − y_min, y_max − ν), how far Y can fall and rise.

        A side that stakes the truncated bet ``λ = min(λ_i, c/reach)`` gains ``λ α ε − λ² v/2`` per draw against a
        candidate ε away, so its half-width after n draws is ``ln(2/δ)/(n λ α) + λ v/(2α)``; both sides are added.
        This compares draw laws before a batch (a law that lowers v but widens the range can lose, since the
        truncation then binds); it is a prediction and never enters the capital.
        """
        lam = float(self._bets(np.array([float(i)]), np.array([alpha]), np.array([var]))[0])
        width = 0.0
        for r in reach:
            bet = max(min(lam, self.c / max(r, 1e-12)), 1e-12)
            width += 0.5 * self._log_bet / (draws * bet * alpha) + bet * var / (2.0 * alpha)
        return width

    def narrowest_law(self, i: float, alpha: float, laws: list[tuple[float, tuple[float, float]]]) -> int:
        """Index of the draw law, given as (variance, reach) of Y, predicted to give the narrowest interval where
        the first law's bets are tuned to stop; ties go to the first (the reference law)."""
        draws = self.tuned_draws(i, alpha, laws[0][0])
        return int(np.argmin([self.predicted_width(i, alpha, v, reach, draws) for v, reach in laws]))

    def observe(self, y: float, y_min: float, y_max: float, alpha: float, beta: float, var: float) -> None:
        """One observation: Y in [y_min, y_max] with E[Y | past] = alpha m + beta under candidate m."""
        self.observe_many(*(np.array([v], dtype=float) for v in (y, y_min, y_max, alpha, beta, var)))

    def observe_many(self, y: np.ndarray, y_min: np.ndarray, y_max: np.ndarray, alpha: np.ndarray,
                     beta: np.ndarray, var: np.ndarray, chunk: int = 256) -> None:
        """A sequence of observations, in order: the same capital and rejections as one at a time.

        Each candidate's log-capital is accumulated left to right from its current value (a cumulative sum that
        starts from it), and stops where the candidate is rejected (capital ≥ 1/δ anywhere inside the sequence):
        a rejected candidate stays rejected, so its capital is frozen there, however the sequence is cut.
        """
        y, y_min, y_max, alpha, beta, var = (np.asarray(v, dtype=float).reshape(-1)
                                             for v in (y, y_min, y_max, alpha, beta, var))
        for s in range(0, y.size, chunk):
            self._observe_chunk(*(v[s:s + chunk] for v in (y, y_min, y_max, alpha, beta, var)))

    def _observe_chunk(self, y, y_min, y_max, alpha, beta, var) -> None:
        n = y.size
        if n == 0:
            return
        i = self.n + 1 + np.arange(n, dtype=float)
        lam = self._bets(i, alpha, var)[:, None]
        live = np.flatnonzero(~self.rejected)
        if live.size:
            a, b = int(live[0]), int(live[-1]) + 1
            lo, hi = y_min[:, None], y_max[:, None]
            nu = np.clip(alpha[:, None] * self.grid[None, a:b] + beta[:, None], lo, hi)
            dev = y[:, None] - nu
            with np.errstate(divide="ignore", invalid="ignore"):
                lam_plus = np.minimum(lam, self.c / (nu - lo))
                lam_minus = np.minimum(lam, self.c / (hi - nu))
            # the current capital is added to the first step, so the sums run in the order one observation at a
            # time adds them
            cum_plus = np.log1p(lam_plus * dev)
            cum_plus[0] += self.log_kplus[a:b]
            np.cumsum(cum_plus, axis=0, out=cum_plus)
            cum_minus = np.log1p(-lam_minus * dev)
            cum_minus[0] += self.log_kminus[a:b]
            np.cumsum(cum_minus, axis=0, out=cum_minus)
            # log K = logaddexp(K+, K−) − log 2 ≤ max(K+, K−): only cells whose larger side reaches the threshold
            # can cross, so the (costly) mixture is formed for those alone
            near = np.maximum(cum_plus, cum_minus) >= self._log_threshold - 1e-9
            crossed = np.zeros_like(near)
            crossed[near] = np.logaddexp(cum_plus[near], cum_minus[near]) - math.log(2.0) >= self._log_threshold
            hit = crossed.any(axis=0)
            last = np.where(hit, np.argmax(crossed, axis=0), n - 1)  # where each candidate's capital stops
            moving = ~self.rejected[a:b]  # candidates rejected before this sequence keep their capital
            cols = np.arange(b - a)
            self.log_kplus[a:b] = np.where(moving, cum_plus[last, cols], self.log_kplus[a:b])
            self.log_kminus[a:b] = np.where(moving, cum_minus[last, cols], self.log_kminus[a:b])
            self.rejected[a:b] |= hit
        self.n += n

    def interval(self, f_lo: float, f_hi: float) -> tuple[float, float]:
        """Accepted hull widened by one grid step, inside the deterministic bounds [f_lo, f_hi]."""
        # the deterministic bounds only tighten: candidates outside them are rejected for good
        self.rejected |= (self.grid < f_lo - self.step) | (self.grid > f_hi + self.step)
        acc = np.flatnonzero(~self.rejected)
        if acc.size == 0:  # empty set (probability ≤ δ): fall back to what is certain
            return f_lo, f_hi
        lo, hi = max(self.grid[acc[0]] - self.step, f_lo), min(self.grid[acc[-1]] + self.step, f_hi)
        if lo > hi:
            return f_lo, f_hi
        return lo, hi
