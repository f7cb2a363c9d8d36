"""Sequential tests of the ε-listings of many pairs at once: two one-sided betting test supermartingales per pair,
O(1) memory each, on the shared item order drawn ∝ weight.

An ε-ranking states, for a pair, "a may be listed above b" (``Δ = mu_a − mu_b ≥ −ε``) or "b above a"
(``Δ ≤ ε``). On the scale of ``z = (x_a − x_b + 1)/2`` (estimand ``m = (1 + Δ)/2``) the listings are the
rejections of

    H_A: m ≤ m_A = (1 − ε)/2          (its rejection certifies "a above b"),
    H_B: m ≥ m_B = (1 + ε)/2          (its rejection certifies "b above a").

With ``ν_i(m) = (m − K_{i−1})/U_i`` the conditional mean of the i-th draw (:mod:`.wor_streams`; increasing in m)
and predictable bets ``λ_i ∈ [0, c/ν_i(m_A)]``,

    K^A_t = ∏_{i ≤ t} (1 + λ_i (z_i − ν_i(m_A)))

is a nonnegative supermartingale whenever H_A holds (``E[z_i | past] = ν_i(m) ≤ ν_i(m_A)`` for the true
``m ≤ m_A``), so by Ville's inequality it ever reaches ``1/δ`` with probability at most δ; symmetrically
``K^B_t = ∏ (1 − λ'_i (z_i − ν_i(m_B)))`` under H_B. These are the boundary tests of Waudby-Smith & Ramdas's
betting CS (2020 §3, JRSS-B 2024), without the grid and without the hedge: the ε-statement needs only the two
boundaries, and the two nulls are disjoint (``m_A < m_B``), so at most one of them is true and each test may
run at the pair's whole level δ (not δ/2): the probability that the pair certifies a false listing is at most
δ, at any stopping time. The deterministic bounds ``K ≤ m ≤ K + U`` reject H_A once ``K > m_A`` and H_B once
``K + U < m_B`` (certainly, not by chance).

With a control variate (``rank --history``): each value comes with a prediction ``a`` in [0, 1] fixed before the
look, and the caller sets :attr:`rest` (``A``, the predicted Σ w·a over the undrawn items) before each look. The
tests then bet on ``v = (z − a + 1)/2`` in [0, 1], whose conditional mean ``ν_i(m) = (m − K_{i−1} − A_i)/(2U_i) +
1/2`` is again increasing in m (:class:`~.wor_streams.ControlledStreams`): the same supermartingales, valid whatever
the predictions, with the variance of ``v`` (small when the predictions are good) setting the bets.

Bets (any predictable choice keeps the guarantee; this one aims at the fewest draws): against a boundary at
distance ``h`` from the truth a draw's excess ``z_i − ν_i`` has mean ``d = α_i h`` (``α_i = 1/U_i`` the slope of
ν) and second moment ``v + d²``; the bet is WSR's approximate growth-rate-optimal ``λ_i = d / (v + d²)`` (aGRAPA),
with ``h`` and ``v`` plugged in from the draws before i (``h_A = m̂ − m_A``, ``h_B = m_B − m̂``, floored at 0: no
bet on a boundary the data sit beyond; ``m̂`` the running mean shrunk towards ½ by :data:`PRIOR` pseudo-draws,
``v`` the running variance), truncated to ``c/ν_i`` so every factor stays ≥ 1 − c (with a control variate
:data:`CONTROLLED_TEST_C`: its bet values sit near 1/2, where a cap of 1/2 would bind). Against the interval-based
ε-verdicts (a hedged two-sided CS per pair, :mod:`.wor_streams`), the tests drop the grid, the hedge's factor 2
in the level and, beyond tens of models, the empirical-Bernstein penalty, and each bet aims at the one boundary
it must clear.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from certeval.errors import InputError

# Tuning (width only, never validity), chosen on 2-3 orders of vlm_ocrbench, vlm_hallusionbench, openllm_arc and
# helm_mmlu at epsilon 0.1 (cells: c 0.75 -> 0.5 and prior 1 -> 30 took 0.56 -> 0.53 on openllm_arc; c 0.4-0.6 and
# prior 30-60 within 0.01 of each other)
TEST_C = 0.5  # truncation: every factor >= 1 - TEST_C
# With a control variate the bet values v = (z - a + 1)/2 sit near 1/2 and have half the drift, so the cap binds:
# 0.9 (rank --history, epsilon 0.05, half the models as history, looks of 50): vlm_ocrbench 94 models 0.631 -> 0.588
# of the cells (plain 0.612), helm_mmlu 22 models 0.822 -> 0.794 and 0.846 -> 0.806 (plain 0.786, 0.834)
CONTROLLED_TEST_C = 0.9
PRIOR = 30.0  # pseudo-draws at 1/2 in the running mean that sets the bet (early bets stay small)
_BLOCK_CELLS = 1 << 22  # tests x items per vectorised update
CERTAIN_TOL = 1e-12  # float rounding of the weighted sums: a boundary met exactly is not a certain rejection


class PairTestRows:
    """What the two pair-test constructions share (:class:`EpsilonTests` per item, ``LookTests`` per look): one row
    per pair in each of the ``FIELDS`` arrays, the certain rejections, and rows kept or appended."""

    FIELDS: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.total)

    @property
    def m_a(self) -> float:
        return (1.0 - self.epsilon) / 2.0

    @property
    def m_b(self) -> float:
        return (1.0 + self.epsilon) / 2.0

    def _reject_certain(self) -> None:
        # the deterministic bounds K <= m <= K + U: certain rejections (also the whole list at exhaustion)
        self.rejected_a |= self.known > self.m_a + CERTAIN_TOL
        self.rejected_b |= self.known + self.remaining < self.m_b - CERTAIN_TOL

    def keep(self, mask: np.ndarray) -> None:
        for f in self.FIELDS:
            setattr(self, f, getattr(self, f)[mask])

    def extend(self, other: PairTestRows) -> None:
        """Append ``other``'s tests: the same values so far (a late pair's replay), level and epsilon."""
        if other.n != self.n or other.delta != self.delta or other.epsilon != self.epsilon:
            raise InputError(f"tests to append must have seen the same {self.n} values at the same level and epsilon")
        for f in self.FIELDS:
            setattr(self, f, np.concatenate([getattr(self, f), getattr(other, f)]))


class EpsilonTests(PairTestRows):
    """The two boundary tests of ``k`` pair streams (values z in [0, 1]) at level ``delta`` each."""

    FIELDS = ("total", "known", "sq", "log_ka", "log_kb", "rejected_a", "rejected_b", "total_v", "rest")

    def __init__(self, k: int, n_total: int, delta: float, epsilon: float, c: float = TEST_C) -> None:
        if not 0.0 < epsilon < 1.0:
            raise InputError(f"epsilon must lie in (0, 1), got {epsilon!r}")
        if not 0.0 < delta < 1.0 or not 0.0 < c < 1.0:
            raise InputError(f"delta and c must lie in (0, 1), got {delta!r}, {c!r}")
        self.n_total, self.delta, self.epsilon, self.c = int(n_total), float(delta), float(epsilon), float(c)
        self.n = 0
        self.remaining = 1.0
        self.total = np.zeros(k)
        self.known = np.zeros(k)
        self.sq = np.full(k, 0.25)  # 1/4 + sum (z_j - muhat_j)^2, as the betting streams' running variance
        self.log_ka = np.zeros(k)
        self.log_kb = np.zeros(k)
        self.rejected_a = np.zeros(k, dtype=bool)
        self.rejected_b = np.zeros(k, dtype=bool)
        self.total_v = np.zeros(k)  # running sum of the bet values (z itself without a control variate)
        self.rest = np.zeros(k)  # A: the predicted Σ w·a over the undrawn items (set by the caller before a look)

    def absorb(self, z: np.ndarray, w: np.ndarray, a: np.ndarray | None = None) -> None:
        """The next ``b`` values of every pair, ``(K, b)``, and the ``b`` items' weights; ``a``: their predictions
        (a control variate, fixed before the values were seen; :attr:`rest` set before the look)."""
        z, w = np.asarray(z, dtype=float), np.asarray(w, dtype=float).reshape(-1)
        if z.shape != (len(self), w.size):
            raise InputError(f"a block of values must be (pairs={len(self)}, items={w.size}), got {z.shape}")
        if a is not None:
            a = np.asarray(a, dtype=float)
            if a.shape != z.shape or (a < 0).any() or (a > 1).any():
                raise InputError(f"predictions must be in [0, 1] and shaped like the values {z.shape}, got {a.shape}")
        if self.n + w.size > self.n_total:
            raise InputError(f"more values than the bank holds ({self.n_total})")
        if w.size == 0:
            return
        if len(self) == 0:
            self.n += w.size
            self.remaining = max(self.remaining - float(w.sum()), 0.0)
            return
        per = max(1, _BLOCK_CELLS // len(self))
        for s in range(0, w.size, per):
            self._absorb_block(z[:, s:s + per], w[s:s + per], None if a is None else a[:, s:s + per])

    def _absorb_block(self, z: np.ndarray, w: np.ndarray, a: np.ndarray | None = None) -> None:
        k, b = z.shape
        i = self.n + 1 + np.arange(b, dtype=float)
        undrawn = np.maximum(self.remaining - np.concatenate([[0.0], np.cumsum(w)[:-1]]), w)  # U_i before draw i
        sums = self.total[:, None] + np.cumsum(z, axis=1)
        mean_before = (0.5 * PRIOR + sums - z) / (i - 1.0 + PRIOR)  # predictable running mean, shrunk to 1/2
        # the bet values: z, or (z - a + 1)/2 with a control variate (nu then has half the slope, offset 1/2, and
        # counts the predicted rest A_i before draw i)
        v = z if a is None else (z - a + 1.0) / 2.0
        sums_v = self.total_v[:, None] + np.cumsum(v, axis=1)
        dev2 = (v - (0.5 + sums_v) / (i + 1.0)) ** 2
        sq_before = self.sq[:, None] + np.concatenate([np.zeros((k, 1)), np.cumsum(dev2, axis=1)[:, :-1]], axis=1)
        var = np.maximum(sq_before / i, 1e-6)
        known_before = self.known[:, None] + np.concatenate([np.zeros((k, 1)), np.cumsum(z * w, axis=1)[:, :-1]],
                                                            axis=1)
        if a is None:
            slope, offset = 1.0 / undrawn, 0.0
        else:
            known_before = known_before + self.rest[:, None] - np.concatenate(
                [np.zeros((k, 1)), np.cumsum(a * w, axis=1)[:, :-1]], axis=1)
            slope, offset = 0.5 / undrawn, 0.5
        log_level = math.log(1.0 / self.delta)
        cap = self.c if a is None else max(self.c, CONTROLLED_TEST_C)
        with np.errstate(divide="ignore", invalid="ignore"):
            for side in ("a", "b"):
                if side == "a":
                    nu = (self.m_a - known_before) * slope + offset
                    gap, dev, room = mean_before - self.m_a, v - nu, nu  # factor 1 + lam (v - nu) >= 1 - lam nu
                else:
                    nu = (self.m_b - known_before) * slope + offset
                    gap, dev, room = self.m_b - mean_before, nu - v, 1.0 - nu  # factor 1 - lam (v - nu)
                drift = slope * np.maximum(gap, 0.0)  # E[z_i - nu_i] if the truth is the running mean
                lam = drift / (var + drift * drift)
                lam = np.where(room > 0, np.minimum(lam, cap / room), 0.0)  # room <= 0: settled by the bounds
                steps = np.log1p(np.where(lam > 0, lam * dev, 0.0))
                path = getattr(self, f"log_k{side}")[:, None] + np.cumsum(steps, axis=1)
                hit = (path >= log_level).any(axis=1)
                setattr(self, f"log_k{side}", path[:, -1])
                flag = getattr(self, f"rejected_{side}")
                flag |= hit
        self.sq = sq_before[:, -1] + dev2[:, -1]
        self.n += b
        self.total, self.total_v = sums[:, -1], sums_v[:, -1]
        if a is not None:
            self.rest = self.rest - a @ w
        self.known = self.known + z @ w
        self.remaining = max(self.remaining - float(w.sum()), 0.0)
        if self.n == self.n_total:
            self.remaining = 0.0
        self._reject_certain()

    def state(self) -> dict[str, Any]:
        return {"construction": "epsilon-tests", "n_total": self.n_total, "delta": self.delta,
                "epsilon": self.epsilon, "c": self.c, "n": self.n, "remaining": self.remaining,
                **{f: getattr(self, f).copy() for f in self.FIELDS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> EpsilonTests:
        obj = cls(0, int(state["n_total"]), float(state["delta"]), float(state["epsilon"]), float(state["c"]))
        obj.n, obj.remaining = int(state["n"]), float(state["remaining"])
        older = {"total_v": state["total"], "rest": np.zeros(len(state["total"]))}  # stored before the control variate
        for f in cls.FIELDS:
            v = np.asarray(state[f] if f in state else older[f])
            setattr(obj, f, v.astype(bool) if f.startswith("rejected_") else v.astype(float))
        return obj


def test_verdicts(rejected_a: np.ndarray, rejected_b: np.ndarray) -> np.ndarray:
    """Pair codes of :mod:`certeval.estimators.distribution.comparison` from the tests: H_A rejected certifies "a above b", H_B "b above a"."""
    from ..distribution.comparison import A_OVER_B, B_OVER_A, EITHER_ORDER, UNDECIDED

    codes = np.full(rejected_a.shape, UNDECIDED)
    codes[rejected_a] = A_OVER_B
    codes[rejected_b] = B_OVER_A
    codes[rejected_a & rejected_b] = EITHER_ORDER
    return codes
