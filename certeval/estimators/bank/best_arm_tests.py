"""Sequential tests of "model j is not the best" for every model at once: one betting test per model, whose
opponent is chosen item by item, on the shared item order drawn ∝ weight.

For model j the null is ``H_j: mu_j >= mu_k`` for every k (j is a best model). Before the i-th draw the test picks
an opponent ``k_i`` from the draws before i alone — the running model with the largest running total other than j —
and bets on ``z_i = (x_{k_i,i} − x_{j,i} + 1)/2``. With ``K^{kj}_{i−1} = Σ_{drawn} w (x_k − x_j + 1)/2`` and
``U_i`` the undrawn weight, the conditional mean of ``z_i`` is ``(m_{kj} − K^{kj}_{i−1})/U_i``
(:mod:`.wor_streams`), and under ``H_j`` every ``m_{kj} = (1 + mu_k − mu_j)/2 <= 1/2``, so

    T^j_t = ∏_{i <= t} (1 + λ_i (z_i − ν_i)),   ν_i = (1/2 − K^{k_i j}_{i−1}) / U_i,   λ_i ∈ [0, c/ν_i],

is a nonnegative supermartingale under ``H_j`` whichever opponents were picked: each factor has conditional mean at
most 1 because ``k_i`` and ``λ_i`` are fixed before draw i. By Ville's inequality ``T^j`` ever reaches ``1/δ``
with probability at most δ. The deterministic bound rejects ``H_j`` once some running model's drawn weighted sum
exceeds j's by more than the undrawn weight (certainly, not by chance).

The level: only the best models' nulls are true. Fix one best model b; the event "b is rejected" has probability at
most δ, and off it b is never dropped. So every test may run at the whole level δ (no correction over the M models):
on that event some best model always survives, which is what a selection needs (when the best is unique, every
drop is then correct). The test is the boundary test of Waudby-Smith & Ramdas's betting CS (2020 §3) with a
predictable opponent. The bets are :mod:`.epsilon_tests`' (aGRAPA aimed at the boundary, the running pair mean shrunk towards
1/2 by its prior pseudo-draws, truncated so every factor stays >= 1 − c).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from certeval.errors import InputError

from .epsilon_tests import CERTAIN_TOL, PRIOR, TEST_C, EpsilonTests


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
    def from_state(cls, state: dict[str, Any]) -> NotBestTests:
        obj = cls(len(state["total"]), int(state["n_total"]), float(state["delta"]), float(state["c"]))
        obj.n, obj.drawn = int(state["n"]), float(state["drawn"])
        for f in cls.FIELDS:
            v = np.asarray(state[f])
            setattr(obj, f, v.astype(bool) if f == "rejected" else v.astype(float))
        return obj


class LeaderListings:
    """The ε-listing tests (:class:`~.epsilon_tests.EpsilonTests`) that a top-1 stop reads — the leader's pair with
    each other running model — each opened when first read by replaying the order so far, kept while both models
    run. A test is a function of the order alone, so a late opening gives the test it would have had from the start
    (up to float rounding), and the level (set by the caller over every pair the rule could read) covers it: a run
    costs the pairs read, O(M) per leader, not all M(M − 1)/2."""

    def __init__(self, m: int, n_total: int, delta: float, epsilon: float) -> None:
        self.tests = EpsilonTests(0, n_total, delta, epsilon)
        self.a = np.zeros(0, dtype=np.int64)  # the open pairs (a < b), one test row each
        self.b = np.zeros(0, dtype=np.int64)
        self.n = 0
        self.seen_items = np.zeros(n_total, dtype=np.int64)  # the order so far and the running models' scores
        self.seen_x = np.full((m, n_total), np.nan)

    def absorb(self, live: np.ndarray, x: np.ndarray, items: np.ndarray, w: np.ndarray) -> None:
        """A look: ``live`` the running models (rows of ``x`` scored), ``w`` the items' weights. Pairs with a model
        that left are discarded first."""
        seen = slice(self.n, self.n + items.size)
        self.seen_items[seen] = items
        self.seen_x[live, seen] = x[live]
        self.n += items.size
        running = np.zeros(self.seen_x.shape[0], dtype=bool)
        running[live] = True
        keep = running[self.a] & running[self.b]
        if not keep.all():
            self.tests.keep(keep)
            self.a, self.b = self.a[keep], self.b[keep]
        self.tests.absorb((x[self.a] - x[self.b] + 1.0) / 2.0, w)

    def _rows(self, leader: int, others: np.ndarray) -> np.ndarray:
        """Row of each pair (leader, j), -1 where not open."""
        row_of = {(int(a), int(b)): r for r, (a, b) in enumerate(zip(self.a, self.b))}
        return np.array([row_of.get((min(leader, int(j)), max(leader, int(j))), -1) for j in others], dtype=np.int64)

    def listed_above(self, leader: int, others: np.ndarray, w: np.ndarray) -> np.ndarray:
        """Whether "leader above j" (mu_leader >= mu_j − ε) is certified for each running ``j`` of ``others``,
        opening the missing pairs first (``w``: the bank's weights, by position)."""
        others = np.asarray(others, dtype=np.int64)
        rows = self._rows(leader, others)
        new = others[rows < 0]
        if new.size:
            a, b = np.minimum(leader, new), np.maximum(leader, new)
            fresh = EpsilonTests(new.size, self.tests.n_total, self.tests.delta, self.tests.epsilon)
            values = (self.seen_x[a, :self.n] - self.seen_x[b, :self.n] + 1.0) / 2.0
            fresh.absorb(values, w[self.seen_items[:self.n]])
            fresh.remaining = self.tests.remaining  # the same order: keep one float path for the undrawn weight
            self.tests.extend(fresh)
            self.a, self.b = np.concatenate([self.a, a]), np.concatenate([self.b, b])
            rows = self._rows(leader, others)
        leads_a = self.a[rows] == leader
        return np.where(leads_a, self.tests.rejected_a[rows], self.tests.rejected_b[rows])

    def matrix(self) -> np.ndarray:
        """``(M, M)``: True where an open pair's test certifies mu_i >= mu_j − ε."""
        above = np.zeros((self.seen_x.shape[0],) * 2, dtype=bool)
        above[self.a, self.b] = self.tests.rejected_a
        above[self.b, self.a] = self.tests.rejected_b
        return above

    def state(self) -> dict[str, Any]:
        return {"tests": self.tests.state(), "a": self.a.copy(), "b": self.b.copy(), "n": self.n,
                "models": self.seen_x.shape[0],
                "seen_items": self.seen_items.copy(), "seen_x": self.seen_x.copy()}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LeaderListings:
        tests = EpsilonTests.from_state(state["tests"])
        seen_x = np.asarray(state["seen_x"], dtype=float).reshape(int(state["models"]), -1)
        obj = cls(seen_x.shape[0], tests.n_total, tests.delta, tests.epsilon)
        obj.tests, obj.n, obj.seen_x = tests, int(state["n"]), seen_x.copy()
        obj.a = np.asarray(state["a"], dtype=np.int64).copy()
        obj.b = np.asarray(state["b"], dtype=np.int64).copy()
        obj.seen_items = np.asarray(state["seen_items"], dtype=np.int64).copy()
        return obj
