"""Running confidence sequences for the means of K i.i.d. streams of values in [0, 1] (the distribution target).

On the distribution target the bank's items are a sample from a population and a model's estimand is its expected
score ``m = E[x]``; a paired run scores the items in a uniform random order, so each stream's values are i.i.d. with
mean ``m`` whatever was seen before: ``E[x_i | past] = m``. That is :mod:`certeval.estimators.bank.wor_streams`' conditional mean
``ν_i(m) = (m − K_{i−1}) / U_i`` with nothing used up (``U_i = 1``, ``K = 0``: every item weighs 0 in the sum of
what is known), and the same constructions hold with replacement (Waudby-Smith & Ramdas, "Estimating means of
bounded random variables by betting", JRSS-B 2024):

* :class:`IidBettingStreams` — the hedged capital ``½∏(1 + λ⁺_i(x_i − m)) + ½∏(1 − λ⁻_i(x_i − m))`` with
  predictable plug-in bets (WSR 2024 Thm 3, eq. (26)–(27)), on a grid of candidate means;
* :class:`IidBernsteinStreams` — the predictable plug-in empirical-Bernstein CS (WSR 2024 Thm 2) in closed form,
  O(1) per stream and item, for thousands of models.

A value may also come with a known range ``B_i >= 1`` fixed before it is drawn: values ``v_i`` in [0, 1] with
``E[v_i | past] = m / B_i`` (``ν_i(m) = (m − 0) / B_i``, slope ``1/B_i``) — the importance-weighted values of a
mean of sub-dataset means (:class:`~.selection.SequentialSelection`).

Both are nonnegative (super)martingales under the truth, so by Ville's inequality each stream's CS holds at every
item, hence at any stopping time, with probability >= 1 − δ (``exact``: no normal approximation). Unlike the bank
target, scoring the whole bank does not reveal the estimand: the width never collapses to 0.
"""

from __future__ import annotations

import numpy as np

from certeval.errors import InputError

from ..bank.wor_streams import BETTING_CELLS, STREAM_GRID, BettingStreams, WorStreams


class _Iid:
    """Values of an i.i.d. stream: the order's draws weigh nothing in the known sum (``ν_i(m) = B_i⁻¹ m``)."""

    EXACT_AT_END = False

    def absorb(self, x: np.ndarray, scale: np.ndarray | None = None, a: np.ndarray | None = None) -> None:
        """The next ``b`` values of every stream, ``(K, b)``, each in [0, 1] with conditional mean ``m / B_i`` given
        the past; ``scale``: the ``b`` values of ``B_i >= 1``, each fixed before its value is drawn (default 1: plain
        i.i.d. values of mean m)."""
        x = np.asarray(x, dtype=float)
        b = x.shape[-1] if x.ndim else 0
        scale = np.ones(b) if scale is None else np.asarray(scale, dtype=float).reshape(-1)
        if scale.shape != (b,) or not (scale >= 1.0).all():
            raise InputError(f"scales must be one number >= 1 per value ({b}), got {scale!r}")
        self._scales = scale  # read in order by _undrawn_before, chunk by chunk
        super().absorb(x, np.zeros(b), a)  # type: ignore[misc]

    def _undrawn_before(self, w: np.ndarray) -> np.ndarray:
        """``B_i`` of the next ``len(w)`` values: in the without-replacement streams' terms, the undrawn weight
        ``U_i`` (the slope of the conditional mean is ``1 / B_i``; nothing is used up, ``K`` stays 0)."""
        out, self._scales = self._scales[: w.size], self._scales[w.size:]
        return out

    def bounds(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(mean, lower, upper)`` of each stream (mean: nan before the first value)."""
        mean = self.total / self.n if self.n else np.full(len(self), np.nan)  # type: ignore[attr-defined]
        return mean, self.lower.copy(), self.upper.copy()  # type: ignore[attr-defined]


class IidBettingStreams(_Iid, BettingStreams):
    """Hedged betting CSs for i.i.d. means (see the module docstring); ``bet_horizon``: bets tuned to stop after
    that many values (WSR 2024 §5), else the all-times plug-in."""

    CONSTRUCTION = "iid-betting"


class IidBernsteinStreams(_Iid, WorStreams):
    """Predictable plug-in empirical-Bernstein CSs for i.i.d. means (see the module docstring)."""

    CONSTRUCTION = "iid-empirical-bernstein"


def make_iid_streams(k: int, n_max: int, delta: float, bet_horizon: int | None = None,
                     grid_size: int = STREAM_GRID) -> BettingStreams | WorStreams:
    """``k`` streams of at most ``n_max`` values each at level ``delta``: betting while the grids of ``grid_size``
    candidates fit :data:`~certeval.estimators.bank.wor_streams.BETTING_CELLS`, the closed-form empirical-Bernstein CSs beyond."""
    if k * grid_size <= BETTING_CELLS:
        return IidBettingStreams(k, n_max, delta, grid_size=grid_size, bet_horizon=bet_horizon)
    return IidBernsteinStreams(k, n_max, delta)
