"""Sequential tests of "model j is not the best" for every model at once: one betting test per model, whose
opponent is chosen item by item, on the shared item order drawn ∝ weight.

For model j the null is ``H_j: mu_j >= mu_k`` for every k (j is a best model). Before the i-th draw the test picks
an opponent ``k_i`` from the draws before i alone — the running model with the largest running total other than j —
and bets on ``z_i = (x_{k_i,i} − x_{j,i} + 1)/2``. With ``K^{kj}_{i−1} = Σ_{drawn} w (x_k − x_j + 1)/2`` and
``U_i`` the undrawn weight, the conditional mean of ``z_i`` is ``(m_{kj} − K^{kj}_{i−1})/U_i`` (:mod:`.wor_streams`),
and under ``H_j`` every ``m_{kj} = (1 + mu_k − mu_j)/2 <= 1/2``, so

    T^j_t = ∏_{i <= t} (1 + λ_i (z_i − ν_i)),   ν_i = (1/2 − K^{k_i j}_{i−1}) / U_i,   λ_i ∈ [0, c/ν_i],

is a nonnegative supermartingale under ``H_j`` whichever opponents were picked: each factor has conditional mean at
most 1 because ``k_i`` and ``λ_i`` are fixed before draw i. By Ville's inequality ``T^j`` ever reaches ``1/δ``
with probability at most δ. The deterministic bound rejects ``H_j`` once some running model's drawn weighted sum
exceeds j's by more than the undrawn weight (certainly, not by chance).

The level: only the best models' nulls are true. Fix one best model b; the event "b is rejected" has probability at
most δ, and off it b is never dropped. So every test may run at the whole level δ (no correction over the M models):
on that event some best model always survives, which is what a selection needs (when the best is unique, every
drop is then correct). This is the intersection-union structure of Berger (1982) applied to the one arm that
matters, and the test is the boundary test of Waudby-Smith & Ramdas's betting CS (2020 §3) with a predictable
opponent. The bets are :mod:`.epsilon_tests`' (aGRAPA aimed at the boundary, the running pair mean shrunk towards
1/2 by its prior pseudo-draws, truncated so every factor stays >= 1 − c).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ._validation import InputError
from .epsilon_tests import CERTAIN_TOL, PRIOR, TEST_C


def _before(start: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``start + Σ_{j < i} values_j`` for every column i: the running sums just before each draw."""
    run = np.cumsum(values, axis=-1) - values
    return start[..., None] + run if np.ndim(start) else start + run


class NotBestTests:
    """One test per model of "this model is a best one", each at level ``delta`` (see the module docstring)."""

    FIELDS = ("weighted", "total", "bet_sum", "bet_sq", "log_t", "rejected")

    def __init__(self, m: int, n_total: int, delta: float, c: float = TEST_C) -> None:
        if not 0.0 < delta < 1.0 or not 0.0 < c < 1.0:
            raise InputError(f"delta and c must lie in (0, 1), got {delta!r}, {c!r}")
        self.n_total, self.delta, self.c = int(n_total), float(delta), float(c)
        self.n = 0
        self.drawn = 0.0  # Σ w over the drawn items
        self.weighted = np.zeros(m)  # each model's Σ w x over the items it scored
        self.total = np.zeros(m)  # and its plain Σ x (ranks the opponents)
        self.bet_sum = np.zeros(m)  # Σ z and Σ z² of each test's own bet values (its running variance)
        self.bet_sq = np.zeros(m)
        self.log_t = np.zeros(m)
        self.rejected = np.zeros(m, dtype=bool)

    def __len__(self) -> int:
        return len(self.total)

    def absorb(self, rows: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
        """The next ``b`` draws: ``rows`` the models still running (each scored every draw so far), ``x`` their
        scores ``(len(rows), b)``, ``w`` the draws' weights. Models outside ``rows`` stay frozen."""
        rows = np.asarray(rows, dtype=np.int64)
        x, w = np.asarray(x, dtype=float), np.asarray(w, dtype=float).reshape(-1)
        if x.shape != (rows.size, w.size):
            raise InputError(f"a block of scores must be (running models={rows.size}, items={w.size}), got {x.shape}")
        if self.n + w.size > self.n_total:
            raise InputError(f"more draws than the bank holds ({self.n_total})")
        if w.size == 0:
            return
        if rows.size >= 2:
            self._bet(rows, x, w)
        self.weighted[rows] += x @ w
        self.total[rows] += x.sum(axis=1)
        self.n += w.size
        self.drawn += float(w.sum())
        undrawn = 0.0 if self.n == self.n_total else max(1.0 - self.drawn, 0.0)
        if rows.size >= 2:  # certain: some model's drawn sum already beats j's whatever the undrawn items hold
            sums = self.weighted[rows]
            self.rejected[rows] |= sums.max() - sums > undrawn + CERTAIN_TOL

    def _bet(self, rows: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
        b = x.shape[1]
        cols = np.arange(b)[None, :]
        total = _before(self.total[rows], x)  # (r, b): running totals before each draw
        weighted = _before(self.weighted[rows], x * w)
        drawn = _before(np.asarray(self.drawn), w)  # (b,)
        count = self.n + np.arange(b, dtype=float)  # draws before each one
        undrawn = np.maximum(1.0 - drawn, w)
        opp = self._opponents(total, x)
        z = (x[opp, cols] - x + 1.0) / 2.0
        known = (weighted[opp, cols] - weighted + drawn) / 2.0  # K^{kj} before the draw
        nu = (0.5 - known) / undrawn
        pair_mean = (0.5 * PRIOR + (total[opp, cols] - total + count) / 2.0) / (count + PRIOR)
        bet_sum, bet_sq = _before(self.bet_sum[rows], z), _before(self.bet_sq[rows], z * z)
        spread = bet_sq - bet_sum ** 2 / np.maximum(count, 1.0)  # Σ (z − mean)² over the test's own draws
        var = np.maximum((0.25 + spread) / (count + 1.0), 1e-6)
        drift = np.maximum(pair_mean - 0.5, 0.0) / undrawn
        with np.errstate(divide="ignore", invalid="ignore"):
            lam = np.where(nu > 0, np.minimum(drift / (var + drift * drift), self.c / nu), 0.0)
        steps = np.log1p(np.where(lam > 0, lam * (z - nu), 0.0))
        path = self.log_t[rows][:, None] + np.cumsum(steps, axis=1)
        self.rejected[rows] |= (path >= math.log(1.0 / self.delta)).any(axis=1)
        self.log_t[rows] = path[:, -1]
        self.bet_sum[rows] += z.sum(axis=1)
        self.bet_sq[rows] += (z * z).sum(axis=1)

    @staticmethod
    def _opponents(total: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``(r, b)`` row of each test's opponent before each draw, from the running totals before it alone: the
        leader, or the runner-up for the leader itself (``x``, the draws themselves, must not be read)."""
        ranked = np.argsort(-total, axis=0, kind="stable")
        first, second = ranked[0][None, :], ranked[1][None, :]
        return np.where(np.arange(total.shape[0])[:, None] == first, second, first)

    def state(self) -> dict[str, Any]:
        return {"construction": "not-best-tests", "n_total": self.n_total, "delta": self.delta, "c": self.c,
                "n": self.n, "drawn": self.drawn, **{f: getattr(self, f).copy() for f in self.FIELDS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> "NotBestTests":
        obj = cls(len(state["total"]), int(state["n_total"]), float(state["delta"]), float(state["c"]))
        obj.n, obj.drawn = int(state["n"]), float(state["drawn"])
        for f in cls.FIELDS:
            v = np.asarray(state[f])
            setattr(obj, f, v.astype(bool) if f == "rejected" else v.astype(float))
        return obj
