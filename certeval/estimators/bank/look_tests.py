"""The ε-listing tests of many pairs with bets fixed per look: betting test supermartingales whose update needs only
a few sums of a pair's look, so thousands of models' pairs cost a few passes over the scores.

Same statements as :mod:`.epsilon_tests` (on the scale of ``z = (x_a − x_b + 1)/2``, estimand ``m = (1 + Δ)/2``):

    H_A: m ≤ m_A = (1 − ε)/2   (its rejection certifies "a above b": Δ ≥ −ε),
    H_B: m ≥ m_B = (1 + ε)/2   (its rejection certifies "b above a": Δ ≤ ε),

on the shared order drawn ∝ weight, where draw i has conditional mean ``μ_i = ν_i(m) = (m − K_{i−1})/U_i``
(:mod:`.wor_streams`). With a bet ``λ`` and a centre ``c ∈ (0, 1)`` fixed for look k from the looks before it
(``1 − λc ≥ 0``), each draw of the look contributes the factor

    F_i = (1 + λ (z_i − c)) · exp(−λ (ν_i(m_A) − c)).

Since ``1 + x ≤ e^x``, ``E[F_i | past] = (1 + λ(μ_i − c)) e^{−λ(ν_i(m_A) − c)} ≤ e^{λ(μ_i − ν_i(m_A))} ≤ 1`` whenever
H_A holds (``μ_i = ν_i(m) ≤ ν_i(m_A)``, ν increasing in m): ``∏ F_i`` is a nonnegative supermartingale, and by
Ville's inequality it ever reaches ``1/δ`` with probability at most δ. It is read at the end of each look (a subset
of the times: still valid). H_B is the mirror image: ``(1 − λ(z_i − c)) · exp(λ(ν_i(m_B) − c))``. The two nulls are
disjoint, so each test may run at the pair's whole δ. The deterministic bounds ``K ≤ m ≤ K + U`` reject a null that
has become impossible. With ``c`` near the conditional mean the compensator costs only ``λ²(μ − c)²/2`` per draw
against the betting test ``∏(1 + λ(z_i − ν_i(m_A)))`` of :mod:`.epsilon_tests` (whose ν changes within a look, so
it needs every draw in turn).

Why per-look bets: with λ and c constant over a look, the look's log-factor is

    Σ_i log(1 + λ(z_i − c)) − λ (Σ_i ν_i(m_A) − b c),    Σ_i ν_i(m) = m R − K_start R − Σ_i g_i z_i

(``R = Σ_i 1/U_i``, ``g_i = w_i Σ_{i' after i} 1/U_{i'}``, ``K_{i−1} = K_start + Σ_{j<i} w_j z_j``). On a look of 0/1
scores z takes three values, so the first sum is exact from the counts ``n_1 = #{z = 1}``, ``n_0 = #{z = 0}`` —
``S_a − C_ab`` and ``S_b − C_ab`` with ``C_ab = Σ x_a x_b``; on other scores it is bounded below by
``λΣ(z − c) + Σ(z − c)² (log(1 − aλ) + aλ)/a²`` with ``a = c`` (``log(1 + x) − x ≥ x²(log(1 − u) + u)/u²`` for
``x ≥ −u``: the ratio is increasing in x), a smaller factor than F_i draw by draw, so the product stays below the
supermartingale. Either way the look needs only per-model sums and the cross product ``C_ab`` — one dot product
of two score rows, bit-counted on 0/1 looks — instead of ~40 passes per draw and pair. Any predictable λ and c keep
the guarantee; these aim at the boundary: ``λ = d/(v + d²)`` (WSR's aGRAPA) with ``d = (m̂ − m_A) / U_1`` the drift per
draw if the truth were the running mean ``m̂`` (shrunk towards ½ by :data:`PRIOR` pseudo-draws) and ``v`` the
running variance, truncated so every factor stays ≥ 1 − :data:`TEST_C`; ``c`` the running mean. The drift per draw
uses ``1/U_1`` (the undrawn weight before the look) in place of ``R/b``: ``R`` holds the weights of the look's own
draws, which with unequal weights are data of the look, and a bet must be fixed before the look (the compensator
does use ``R`` and the ``g_i``: they are the exact ``Σ ν_i``, not a choice).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from certeval.errors import InputError

from .epsilon_tests import PairTestRows

PRIOR = 30.0  # pseudo-draws at 1/2 in the running mean that sets the bet, as the betting tests
TEST_C = 0.5  # truncation: every factor 1 ± λ(z − c) >= 1 - TEST_C, as the betting tests
CENTRE_CLIP = 0.02  # the centre c stays in [0.02, 0.98] (the truncation divides by c and 1 - c)


def look_coefficients(w: np.ndarray, remaining: float) -> tuple[np.ndarray, np.ndarray, float]:
    """For a look's draws (weights ``w`` in draw order) with undrawn weight ``remaining`` before the look: the
    undrawn weight ``U_i`` before each draw, ``g_i = w_i Σ_{i' > i} 1/U_{i'}`` and ``R = Σ_i 1/U_i``."""
    w = np.asarray(w, dtype=float)
    undrawn = np.maximum(remaining - np.concatenate([[0.0], np.cumsum(w)[:-1]]), w)
    inv = 1.0 / undrawn
    after = np.concatenate([np.cumsum(inv[::-1])[::-1][1:], [0.0]])  # Σ_{i' > i} 1/U_{i'}
    return undrawn, w * after, float(inv.sum())


class LookTests(PairTestRows):
    """The two boundary tests of ``k`` pairs at level ``delta`` each, updated once per look from the look's sums
    (:meth:`absorb_sums`). Every pair of one object has seen the same looks of the shared order."""

    FIELDS = ("total", "total2", "known", "log_ka", "log_kb", "rejected_a", "rejected_b")

    def __init__(self, k: int, n_total: int, delta: float, epsilon: float) -> None:
        if not 0.0 < epsilon < 1.0:
            raise InputError(f"epsilon must lie in (0, 1), got {epsilon!r}")
        if not 0.0 < delta < 1.0:
            raise InputError(f"delta must lie in (0, 1), got {delta!r}")
        self.n_total, self.delta, self.epsilon = int(n_total), float(delta), float(epsilon)
        self.n = 0
        self.remaining = 1.0
        self.total = np.zeros(k)  # Σ z
        self.total2 = np.zeros(k)  # Σ z²
        self.known = np.zeros(k)  # Σ w z (K)
        self.log_ka = np.zeros(k)
        self.log_kb = np.zeros(k)
        self.rejected_a = np.zeros(k, dtype=bool)
        self.rejected_b = np.zeros(k, dtype=bool)

    def absorb_sums(self, w: np.ndarray, sz: np.ndarray, sz2: np.ndarray, sgz: np.ndarray, swz: np.ndarray,
                    n1: np.ndarray | None = None, n0: np.ndarray | None = None) -> None:
        """One look: its draws' weights ``w`` (draw order) and per pair Σz, Σz², Σ g z, Σ w z over the look
        (``g`` from :func:`look_coefficients`); on a look of 0/1 scores also the counts of z = 1 and z = 0."""
        w = np.asarray(w, dtype=float).reshape(-1)
        b = w.size
        if self.n + b > self.n_total:
            raise InputError(f"more values than the bank holds ({self.n_total})")
        if b == 0:
            return
        _, _, r = look_coefficients(w, self.remaining)
        k_start = self.known
        if len(self):
            n = self.n
            c = np.clip((0.5 * PRIOR + self.total) / (n + PRIOR), CENTRE_CLIP, 1.0 - CENTRE_CLIP)  # m̂, shrunk
            var = np.maximum((0.25 + self.total2 - self.total ** 2 / max(n, 1)) / (n + 1.0), 1e-6)
            nu_rest = -k_start * r - sgz  # Σ ν_i(m) = m R + nu_rest
            # the bet's drift scale 1/U_1 (the undrawn weight before the look): R / b would read the look's own
            # draws' weights (U_i for i > 1), which are not known before the look
            per = 1.0 / max(self.remaining, 1e-12)
            with np.errstate(divide="ignore", invalid="ignore"):
                for side in ("a", "b"):
                    if side == "a":  # factor (1 + λ(z − c)) e^{−λ(ν(m_A) − c)}
                        d = per * np.maximum(c - self.m_a, 0.0)
                        lam = np.minimum(d / (var + d * d), TEST_C / c)
                        comp = -lam * (self.m_a * r + nu_rest - b * c)
                        up, mid, down, lo_range = 1.0 - c, 0.5 - c, -c, c  # z − c at z = 1, 1/2, 0; −min(z − c)
                        lin = sz - b * c
                    else:  # factor (1 − λ(z − c)) e^{λ(ν(m_B) − c)}
                        d = per * np.maximum(self.m_b - c, 0.0)
                        lam = np.minimum(d / (var + d * d), TEST_C / (1.0 - c))
                        comp = lam * (self.m_b * r + nu_rest - b * c)
                        up, mid, down, lo_range = -(1.0 - c), -(0.5 - c), c, 1.0 - c
                        lin = b * c - sz
                    if n1 is not None:  # exact: z takes the values 1, 1/2, 0
                        nmid = b - n1 - n0
                        logs = n1 * np.log1p(lam * up) + nmid * np.log1p(lam * mid) + n0 * np.log1p(lam * down)
                    else:  # log(1 + x) >= x + x²(log(1 − u) + u)/u² for x >= −u, u = λ·(the lower range)
                        dev2 = sz2 - 2.0 * c * sz + b * c * c  # Σ (z − c)²
                        u = lam * lo_range
                        quad = np.where(u > 0, (np.log1p(-u) + u) / (lo_range * lo_range), 0.0)
                        logs = lam * lin + dev2 * quad
                    step = np.where(lam > 0, logs + comp, 0.0)
                    log_k = getattr(self, f"log_k{side}") + step
                    setattr(self, f"log_k{side}", log_k)
                    getattr(self, f"rejected_{side}")[:] |= log_k >= math.log(1.0 / self.delta)
        self.n += b
        self.total = self.total + sz
        self.total2 = self.total2 + sz2
        self.known = k_start + swz
        self.remaining = 0.0 if self.n == self.n_total else max(self.remaining - float(w.sum()), 0.0)
        self._reject_certain()

    def state(self) -> dict[str, Any]:
        return {"construction": "look-tests", "n_total": self.n_total, "delta": self.delta, "epsilon": self.epsilon,
                "n": self.n, "remaining": self.remaining, **{f: getattr(self, f).copy() for f in self.FIELDS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LookTests:
        obj = cls(0, int(state["n_total"]), float(state["delta"]), float(state["epsilon"]))
        obj.n, obj.remaining = int(state["n"]), float(state["remaining"])
        for f in cls.FIELDS:
            v = np.asarray(state[f])
            setattr(obj, f, v.astype(bool) if f.startswith("rejected_") else v.astype(float))
        return obj
