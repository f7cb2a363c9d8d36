"""Running without-replacement confidence sequences for K streams on one shared item order drawn ∝ weight.

A paired run (compare, rank, select on the bank target) scores the same items for every model, in one order
fixed before any score. The estimand of stream k is the bank's weighted mean ``m_k = Σ_j w_j z_kj`` (``w_j`` =
1/N for a plain mean, 1/(S N_s) for the mean of S sub-dataset means; ``z`` a model's score, or a pair's
``(x_a − x_b + 1)/2``). The order is successive sampling ∝ weight (:func:`weighted_order`): draw i takes an
undrawn item j with probability ``w_j / U_i``, ``U_i`` the undrawn weight. With ``K_{i−1,k}`` the weighted sum
of stream k's values already drawn,

    E[z_i | past] = Σ_{j undrawn} (w_j/U_i) z_j = (m_k − K_{i−1,k}) / U_i =: ν_i(m_k),

affine and increasing in the estimand, as Waudby-Smith & Ramdas's ``μ_i^WoR(m) = (N m − S_{i−1})/(N − i + 1)``
(the equal-weight case). Each sub-dataset is drawn in proportion to its weight, so no value is rescaled by
``max_j N w_j`` (a uniform order with ``y_j = N w_j z_j`` doubled the range on unequal sub-datasets).

Two constructions, both exact (width 0 once every item is scored) and valid at every look:

* :class:`BettingStreams` — the hedged betting CS (WSR 2020 §3; JRSS-B 2024): per candidate m,
  ``½∏(1 + λ⁺_i(z_i − ν_i(m))) + ½∏(1 − λ⁻_i(z_i − ν_i(m)))`` is a nonnegative martingale under the truth;
  rejected once it reaches 1/δ (Ville). Bets from :func:`~certeval.estimators.single.bounds.bet_sizes` on the running variance,
  truncated to ``c/ν`` and ``c/(1 − ν)``. A grid of candidates per stream: for tens of models.
* :class:`WorStreams` — the predictable plug-in empirical-Bernstein CS (WSR 2020, Thm 4) in closed form,
  O(1) per stream and item: for thousands of models, where a grid per pair would not fit.

:func:`make_streams` picks betting whenever its grids fit :data:`BETTING_CELLS`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..single.bounds import bet_sizes, horizon_scale

TRUNCATION = 0.5  # empirical-Bernstein bets: lambda_i <= 1/2, as in wor_confidence_sequence
STREAM_GRID = 1025  # candidates per betting stream: one step is 1/1024 of [0, 1] (2,049 moved widths < 0.002)
# Truncation of the betting streams' bets (every factor >= 1 - c): WSR's own 1/2. On 45 pairs of 10 models at n = 100
# and 200 (vlm_ocrbench, helm_mmlu, openllm_arc, helm_raft) the pair widths were 2-13% narrower than with the
# 0.8 that suits importance-weighted residuals; selection on Bernoulli streams used 0.55 of the items instead of 0.63.
STREAM_C = 0.5
BETTING_CELLS = 1 << 21  # streams x grid of the largest betting family (two float64 capitals: 32 MiB; each item
# costs ~25 passes over them, so thousands of models use the O(1) empirical-Bernstein streams)
# With a control variate the bet values (x - a + 1)/2 have half the slope in m and a small variance: the
# empirical-Bernstein bets hit their truncation at 1/2, and on 94 vlm_ocrbench models (half the bank as history,
# epsilon 0.05) history then cost cells (0.77 vs 0.72 of the cells) where the betting CS saved them (0.66 vs 0.71
# betting without history). Betting is kept up to 2^25 cells (about 32,000 pairs, 256 models: 512 MiB of capitals).
CONTROLLED_BETTING_CELLS = 1 << 25
_CHUNK_CELLS = 1 << 20  # items x streams x window per vectorised update


def weighted_order(weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Successive sampling ∝ weight without replacement: ``argsort(E_j / w_j)`` with ``E_j`` i.i.d.
    exponential (each next item is an undrawn j with probability ``w_j / U``); a uniform permutation when the
    weights are equal."""
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or w.size == 0 or not (w > 0).all():
        raise InputError(f"order weights must be positive, got min {float(w.min()) if w.size else None!r}")
    return np.argsort(rng.exponential(size=w.size) / w, kind="stable")


def check_weights(weights: np.ndarray) -> np.ndarray:
    """The estimand's item weights: positive, summing to one over the bank."""
    w = np.asarray(weights, dtype=float)
    if w.ndim != 1 or w.size == 0 or (w <= 0).any() or not math.isclose(float(w.sum()), 1.0, rel_tol=1e-9):
        raise InputError(f"weights must be positive and sum to one over the bank, got sum {float(w.sum())!r}")
    return w


class _Streams:
    """What both constructions share: K streams that have seen the same ``n`` items of one order, the undrawn
    weight ``remaining`` (U), each stream's weighted sum ``known`` (K) and plain sum ``total``, and the running
    interval ``[lower, upper]`` on the [0, 1] scale."""

    FIELDS: tuple[str, ...] = ("total", "known", "lower", "upper")
    EXACT_AT_END = True  # the whole bank scored: the estimand is known (False for an i.i.d. stream's mean)

    def __init__(self, k: int, n_total: int, delta: float) -> None:
        self.n_total = int(n_total)
        self.delta = float(delta)
        self.n = 0
        self.remaining = 1.0
        self.total = np.zeros(k)
        self.known = np.zeros(k)
        self.lower = np.zeros(k)
        self.upper = np.ones(k)

    def __len__(self) -> int:
        return len(self.total)

    def _check_block(self, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, w = np.asarray(x, dtype=float), np.asarray(w, dtype=float).reshape(-1)
        if x.ndim != 2 or x.shape != (len(self), w.size):
            raise InputError(f"a block of values must be (streams={len(self)}, items={w.size}), got {x.shape}")
        if self.n + w.size > self.n_total:
            raise InputError(f"more values than the bank holds ({self.n_total})")
        return x, w

    def _undrawn_before(self, w: np.ndarray) -> np.ndarray:
        """U_i before each of the block's draws (never below the draw's own weight: float rounding)."""
        before = self.remaining - np.concatenate([[0.0], np.cumsum(w)[:-1]])
        return np.maximum(before, w)

    def _finish_block(self, x: np.ndarray, w: np.ndarray, v: np.ndarray | None = None) -> None:
        self.n += w.size
        self.total += (x if v is None else v).sum(axis=1)
        self.known += x @ w
        self.remaining = max(self.remaining - float(w.sum()), 0.0)
        if self.exhausted:  # the whole list is known: its weighted mean, width 0
            self.remaining = 0.0
            self.lower, self.upper = self.known.copy(), self.known.copy()

    @property
    def exhausted(self) -> bool:
        """Every value of the bank seen, and the estimand is the bank's: its exact value is known."""
        return self.EXACT_AT_END and self.n == self.n_total

    def bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(estimate, lower, upper)`` of each stream on the [0, 1] scale; the estimate is the plain mean of
        the values drawn ∝ weight (the weighted mean once exhausted)."""
        if self.exhausted:
            return self.known.copy(), self.lower.copy(), self.upper.copy()
        mean = self.total / self.n if self.n else np.full(len(self), np.nan)
        return np.clip(mean, self.lower, self.upper), self.lower.copy(), self.upper.copy()

    def keep(self, mask: np.ndarray) -> None:
        for f in self.FIELDS:
            setattr(self, f, getattr(self, f)[mask])

    def rows(self, rows: np.ndarray) -> _Streams:
        """A view-free copy of streams ``rows`` (same order position), to absorb for those only."""
        sub = object.__new__(type(self))
        sub.__dict__.update({k: v for k, v in self.__dict__.items() if k not in self.FIELDS})
        for f in self.FIELDS:
            setattr(sub, f, getattr(self, f)[rows].copy())
        return sub

    def put_rows(self, rows: np.ndarray, sub: _Streams) -> None:
        for f in self.FIELDS:
            getattr(self, f)[rows] = getattr(sub, f)
        self.n, self.remaining = sub.n, sub.remaining

    def state(self) -> dict[str, Any]:
        return {"construction": self.CONSTRUCTION, "n_total": self.n_total, "delta": self.delta, "n": self.n,
                "remaining": self.remaining, **self._scalars(), **{f: getattr(self, f).copy() for f in self.FIELDS}}

    def _scalars(self) -> dict[str, Any]:
        return {}

    CONSTRUCTION = ""


class WorStreams(_Streams):
    """Predictable plug-in empirical-Bernstein CSs (WSR 2020, Thm 4) on the order drawn ∝ weight.

    With ``ν_i(m) = α_i m + β_i`` (``α_i = 1/U_i``, ``β_i = −K_{i−1}/U_i``), values in [0, 1] and
    ``λ_i ≤ ½`` predictable, ``exp(Σ λ_i (z_i − ν_i(m)) − Σ v_i ψ(λ_i))`` is a nonnegative supermartingale
    under the truth (``v_i = 4(z_i − μ̂_{i−1})²``, ``ψ(λ) = (−log(1−λ) − λ)/4``); solved for m:

        C_t = [ Σ λ_i (z_i − β_i) / D_t  ±  (log(2/δ) + Σ v_i ψ(λ_i)) / D_t ],   D_t = Σ λ_i α_i,

    the equal-weight case being :func:`~certeval.estimators.distribution.comparison.wor_confidence_sequence` value by value.
    """

    CONSTRUCTION = "empirical-bernstein"
    FIELDS = _Streams.FIELDS + ("sq", "denom", "num", "vpsi")

    def __init__(self, k: int, n_total: int, delta: float) -> None:
        super().__init__(k, n_total, delta)
        self.sq = np.zeros(k)  # sum of (z_i - muhat_{i-1})^2
        self.denom = np.zeros(k)
        self.num = np.zeros(k)
        self.vpsi = np.zeros(k)

    def absorb(self, x: np.ndarray, w: np.ndarray, a: np.ndarray | None = None) -> None:
        """The next ``b`` values of every stream, ``(K, b)``, and the ``b`` items' weights; ``a``: their
        predictions (control variate, :class:`ControlledStreams`), fixed before the values were seen."""
        x, w = self._check_block(x, w)
        log_term = math.log(2.0 / self.delta)
        undrawn = self._undrawn_before(w)
        v, scale = (x, undrawn) if a is None else _controlled_values(x, a, undrawn)
        for col in range(w.size):
            i = self.n + 1
            xi, vi = x[:, col], v[:, col]
            mu_prev = (0.5 + self.total) / i
            var_prev = (0.25 + self.sq) / i
            h = min(i, self.n_total)
            lam = np.minimum(np.sqrt((2.0 * log_term / (h * math.log1p(h))) / var_prev), TRUNCATION)
            dev = (vi - mu_prev) ** 2
            self.denom += lam / scale[col]
            if a is None:
                self.num += lam * (xi + self.known / undrawn[col])
            else:  # nu_i(m) = (m - K - A)/(2U) + 1/2, A the predicted rest
                self.num += lam * (vi - 0.5 + (self.known + self.rest) / scale[col])
                self.rest -= w[col] * a[:, col]
            self.vpsi += dev * (-np.log1p(-lam) - lam)
            self.sq += dev
            self.total += vi
            self.known += w[col] * xi
            self.n += 1
            self.remaining = max(self.remaining - float(w[col]), 0.0)
            if self.exhausted:  # the whole list is known: its weighted mean, width 0
                self.remaining = 0.0
                self.lower, self.upper = self.known.copy(), self.known.copy()
                break
            center = self.num / self.denom
            width = (log_term + self.vpsi) / self.denom
            f_lo, f_hi = self.known, self.known + self.remaining
            np.maximum(self.lower, np.clip(center - width, f_lo, f_hi), out=self.lower)
            np.minimum(self.upper, np.clip(center + width, f_lo, f_hi), out=self.upper)
            crossed = self.lower > self.upper  # the probability-delta event or rounding: what is certain
            self.lower[crossed], self.upper[crossed] = f_lo[crossed], f_hi[crossed]

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> WorStreams:
        obj = cls(0, int(state["n_total"]), float(state["delta"]))
        obj.n, obj.remaining = int(state["n"]), float(state["remaining"])
        for f in cls.FIELDS:
            setattr(obj, f, np.asarray(state[f], dtype=float))
        return obj


class BettingStreams(_Streams):
    """Hedged betting CSs (see the module docstring) on a grid of ``grid_size`` candidates per stream.

    Bets are truncated at ``c/ν`` and ``c/(1 − ν)`` with ``c`` = :data:`STREAM_C`. Only the window of candidates not yet rejected is updated (rejection is permanent; the reported interval is
    the window's hull widened by one grid step, intersected with the deterministic bounds ``[K, K + U]``).
    Bets: :func:`~certeval.estimators.single.bounds.bet_sizes` with slope ``α_i = 1/U_i`` and the running variance
    ``(¼ + Σ (z_j − μ̂_j)²)/i`` — WSR's all-times plug-in, or tuned to ``bet_horizon`` items.
    """

    CONSTRUCTION = "betting"
    FIELDS = _Streams.FIELDS + ("sq", "win_lo", "win_hi", "log_kplus", "log_kminus")

    def __init__(self, k: int, n_total: int, delta: float, grid_size: int = STREAM_GRID,
                 bet_horizon: int | None = None) -> None:
        super().__init__(k, n_total, delta)
        self.grid_size = int(grid_size)
        self.bet_horizon = None if bet_horizon is None else int(bet_horizon)
        self.sq = np.full(k, 0.25)  # 1/4 + sum (z_j - muhat_j)^2
        self.win_lo = np.zeros(k, dtype=np.int64)
        self.win_hi = np.full(k, self.grid_size, dtype=np.int64)
        self.log_kplus = np.zeros((k, self.grid_size))
        self.log_kminus = np.zeros((k, self.grid_size))

    def _scalars(self) -> dict[str, Any]:
        return {"grid_size": self.grid_size, "bet_horizon": self.bet_horizon}

    @property
    def step(self) -> float:
        return 1.0 / (self.grid_size - 1)

    def absorb(self, x: np.ndarray, w: np.ndarray, a: np.ndarray | None = None) -> None:
        """The next ``b`` values of every stream, ``(K, b)``, and the ``b`` items' weights; ``a``: their
        predictions (control variate, :class:`ControlledStreams`), fixed before the values were seen."""
        x, w = self._check_block(x, w)
        if w.size == 0 or len(self) == 0:
            self.n += w.size
            self.remaining = max(self.remaining - float(w.sum()), 0.0)
            return
        width = int((self.win_hi - self.win_lo).max(initial=1))
        per = max(1, _CHUNK_CELLS // (len(self) * max(width, 1)))
        for s in range(0, w.size, per):
            self._absorb_chunk(x[:, s:s + per], w[s:s + per], None if a is None else a[:, s:s + per])

    def _absorb_chunk(self, x: np.ndarray, w: np.ndarray, a: np.ndarray | None = None) -> None:
        k, b = x.shape
        i = self.n + 1 + np.arange(b, dtype=float)
        undrawn = self._undrawn_before(w)
        v, scale = (x, undrawn) if a is None else _controlled_values(x, a, undrawn)
        # predictable running variance before each draw (shrunk mean and squares through draw i - 1)
        sums = self.total[:, None] + np.cumsum(v, axis=1)
        dev2 = (v - (0.5 + sums) / (i + 1.0)) ** 2
        sq_before = self.sq[:, None] + np.concatenate([np.zeros((k, 1)), np.cumsum(dev2, axis=1)[:, :-1]], axis=1)
        var = sq_before / i
        lam = bet_sizes(i, 1.0 / undrawn, var, 2.0 * math.log(2.0 / self.delta), None,  # scale-free in the values
                        horizon_scale(self.bet_horizon, self.n_total if self.EXACT_AT_END else None))  # (K, b)
        known_before = self.known[:, None] + np.concatenate(
            [np.zeros((k, 1)), np.cumsum(x * w, axis=1)[:, :-1]], axis=1)
        if a is not None:  # nu_i(m) = (m - K - A)/(2U) + 1/2, A the predicted rest before draw i
            aw = a * w
            known_before += self.rest[:, None] - np.concatenate([np.zeros((k, 1)), np.cumsum(aw, axis=1)[:, :-1]],
                                                                axis=1)
        # at least one column: every stream's window empty (the probability-delta event, or ties) is then handled
        # as one empty row is beside others, its bounds the certain ones
        width = max(1, int((self.win_hi - self.win_lo).max()))
        cols = np.minimum(self.win_lo[:, None] + np.arange(width)[None, :], self.grid_size - 1)  # (K, W)
        inside = (self.win_lo[:, None] + np.arange(width)[None, :]) < self.win_hi[:, None]
        m = cols * self.step
        # (K, b, W) arrays, in place where possible: this is the whole cost of a look
        nu = m[:, None, :] - known_before[:, :, None]
        nu /= scale[None, :, None]
        if a is not None:
            nu += 0.5
        np.clip(nu, 0.0, 1.0, out=nu)
        dev = v[:, :, None] - nu
        lam = lam[:, :, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            kp = np.divide(STREAM_C, nu)
            np.minimum(kp, lam, out=kp)
            kp *= dev
            np.log1p(kp, out=kp)
            np.cumsum(kp, axis=1, out=kp)
            kp += np.take_along_axis(self.log_kplus, cols, axis=1)[:, None, :]
            np.subtract(1.0, nu, out=nu)
            km = np.divide(STREAM_C, nu)
            np.minimum(km, lam, out=km)
            km *= dev
            np.negative(km, out=km)
            np.log1p(km, out=km)
            np.cumsum(km, axis=1, out=km)
            km += np.take_along_axis(self.log_kminus, cols, axis=1)[:, None, :]
        np.logaddexp(kp, km, out=dev)
        rejected = (dev >= math.log(2.0 / self.delta)).any(axis=1)
        rr, jj = np.nonzero(inside)  # each live candidate once
        self.log_kplus[rr, cols[rr, jj]] = kp[rr, -1, jj]
        self.log_kminus[rr, cols[rr, jj]] = km[rr, -1, jj]
        self.sq = sq_before[:, -1] + dev2[:, -1]
        if a is not None:
            self.rest = self.rest - aw.sum(axis=1)
        self._finish_block(x, w, None if a is None else v)
        if self.exhausted:
            return
        # the deterministic bounds only tighten: candidates outside them are rejected for good
        f_lo, f_hi = self.known, self.known + self.remaining
        ok = inside & ~rejected & (m >= f_lo[:, None] - self.step) & (m <= f_hi[:, None] + self.step)
        any_ok = ok.any(axis=1)
        first = np.argmax(ok, axis=1)
        last = width - 1 - np.argmax(ok[:, ::-1], axis=1)
        new_lo = np.where(any_ok, self.win_lo + first, self.win_lo)
        new_hi = np.where(any_ok, self.win_lo + last + 1, self.win_lo)
        self.win_lo, self.win_hi = new_lo, np.maximum(new_hi, new_lo)
        lo = np.where(any_ok, self.win_lo * self.step - self.step, f_lo)  # empty (probability <= delta): certain
        hi = np.where(any_ok, (self.win_hi - 1) * self.step + self.step, f_hi)
        lo, hi = np.clip(lo, f_lo, f_hi), np.clip(hi, f_lo, f_hi)
        new_lower, new_upper = np.maximum(self.lower, lo), np.minimum(self.upper, hi)
        crossed = new_lower > new_upper  # float rounding or the probability-delta event: what is certain
        self.lower = np.where(crossed, f_lo, new_lower)
        self.upper = np.where(crossed, f_hi, new_upper)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BettingStreams:
        horizon = state.get("bet_horizon")
        obj = cls(0, int(state["n_total"]), float(state["delta"]), int(state["grid_size"]),
                  None if horizon is None else int(horizon))
        obj.n, obj.remaining = int(state["n"]), float(state["remaining"])
        for f in cls.FIELDS:
            v = np.asarray(state[f])
            setattr(obj, f, v.astype(np.int64) if f.startswith("win_") else v.astype(float))
        return obj


def _controlled_values(x: np.ndarray, a: np.ndarray, undrawn: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bet values ``(x − a + 1)/2`` in [0, 1] of values ``x`` with predictions ``a`` (both in [0, 1]), and the
    scale ``2U`` of their conditional mean ``(m − K − A)/(2U) + 1/2`` (see :class:`ControlledStreams`)."""
    a = np.asarray(a, dtype=float)
    if a.shape != x.shape or (a < 0).any() or (a > 1).any():
        raise InputError(f"predictions must be in [0, 1] and shaped like the values {x.shape}, got {a.shape}")
    return (x - a + 1.0) / 2.0, 2.0 * undrawn


class ControlledStreams:
    """Streams with a control variate: each value ``x`` (in [0, 1]) comes with a prediction ``a`` (in [0, 1])
    fixed before it is seen, and the streams know ``A`` = Σ w a over the undrawn items (:attr:`rest`, set by the
    caller before each look: the predictions may change between looks, never within one).

    Draw i of the order drawn ∝ weight takes an undrawn item j with probability ``w_j / U_i``, so
    ``E[x_i − a_i | past] = (m − K_{i−1} − A_i) / U_i``: the bet value ``v = (x − a + 1)/2`` lies in [0, 1] with
    conditional mean ``ν_i(m) = (m − K_{i−1} − A_i)/(2U_i) + 1/2``, affine and increasing in m. The betting and
    empirical-Bernstein constructions run on ``v`` with that ν unchanged otherwise (Ville: valid at every look,
    whatever the predictions, as long as they are predictable); the deterministic bounds ``[K, K + U]`` and the
    exact value at exhaustion use ``x``. ``total`` sums the bet values; the point estimate is ``K + A``.
    """

    FIELDS_EXTRA = ("rest",)

    def _init_rest(self, k: int) -> None:
        self.rest = np.zeros(k)

    def absorb(self, x: np.ndarray, w: np.ndarray, a: np.ndarray | None = None) -> None:
        if a is None:
            raise InputError("controlled streams need the values' predictions")
        super().absorb(x, w, a)  # type: ignore[misc]

    def bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.n == self.n_total:  # type: ignore[attr-defined]
            return super().bounds()  # type: ignore[misc]
        est = np.clip(self.known + self.rest, self.lower, self.upper)  # type: ignore[attr-defined]
        return est, self.lower.copy(), self.upper.copy()  # type: ignore[attr-defined]


class ControlledBettingStreams(ControlledStreams, BettingStreams):
    FIELDS = BettingStreams.FIELDS + ControlledStreams.FIELDS_EXTRA

    def __init__(self, k: int, n_total: int, delta: float, grid_size: int = STREAM_GRID,
                 bet_horizon: int | None = None) -> None:
        BettingStreams.__init__(self, k, n_total, delta, grid_size, bet_horizon)
        self._init_rest(k)


class ControlledWorStreams(ControlledStreams, WorStreams):
    FIELDS = WorStreams.FIELDS + ControlledStreams.FIELDS_EXTRA

    def __init__(self, k: int, n_total: int, delta: float) -> None:
        WorStreams.__init__(self, k, n_total, delta)
        self._init_rest(k)


def make_controlled_streams(k: int, n_total: int, delta: float, bet_horizon: int | None = None) -> _Streams:
    """Streams with a control variate (:class:`ControlledStreams`): betting up to :data:`CONTROLLED_BETTING_CELLS`
    grid cells (hundreds of models), the empirical-Bernstein CS beyond."""
    if k * STREAM_GRID <= CONTROLLED_BETTING_CELLS:
        return ControlledBettingStreams(k, n_total, delta, bet_horizon=bet_horizon)
    return ControlledWorStreams(k, n_total, delta)


def make_streams(k: int, n_total: int, delta: float, bet_horizon: int | None = None) -> _Streams:
    """Betting CSs when ``k`` grids fit :data:`BETTING_CELLS`, else the closed-form empirical-Bernstein CSs."""
    if k * STREAM_GRID <= BETTING_CELLS:
        return BettingStreams(k, n_total, delta, bet_horizon=bet_horizon)
    return WorStreams(k, n_total, delta)


def fresh_like(streams: _Streams, k: int) -> _Streams:
    """``k`` new streams of the same construction, level and bank as ``streams``, at the order's start."""
    if isinstance(streams, ControlledStreams):
        if isinstance(streams, BettingStreams):
            return ControlledBettingStreams(k, streams.n_total, streams.delta, grid_size=streams.grid_size,
                                            bet_horizon=streams.bet_horizon)
        return ControlledWorStreams(k, streams.n_total, streams.delta)
    if isinstance(streams, BettingStreams):
        return BettingStreams(k, streams.n_total, streams.delta, grid_size=streams.grid_size,
                              bet_horizon=streams.bet_horizon)
    return WorStreams(k, streams.n_total, streams.delta)


def streams_from_state(state: dict[str, Any]) -> _Streams:
    kind = state.get("construction")
    if kind == BettingStreams.CONSTRUCTION:
        return BettingStreams.from_state(state)
    if kind == WorStreams.CONSTRUCTION:
        return WorStreams.from_state(state)
    raise InputError("this stored paired state predates draws in proportion to the estimand's weights (stream "
                     f"construction {kind!r}); start the run again in a new folder")


def absorb_rows(streams: _Streams, rows: np.ndarray, block: np.ndarray, w: np.ndarray,
                predictions: np.ndarray | None = None) -> None:
    """Absorb ``block`` into the streams ``rows`` only (the others are frozen where their model left);
    ``predictions``: the block's control variate, for :class:`ControlledStreams`."""
    if len(rows) == 0:
        return
    sub = streams.rows(rows)
    sub.absorb(block, w, predictions)  # every construction takes a=None (only controlled streams refuse it)
    streams.put_rows(rows, sub)
