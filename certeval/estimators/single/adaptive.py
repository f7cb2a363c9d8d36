"""``adaptive``: certeval's default — an anytime-valid, variance-adaptive interval for the bank's mean.

Construction
------------
1. **Strata.** One stratum per sub-dataset when the estimand is the mean-of-means
   (seed 004, eq. 1), else the whole bank. Items inside a stratum carry equal
   weight, so the estimand is ``Σ_h W_h μ_h``.
2. **Per-stratum confidence sequence.** Items are drawn uniformly without
   replacement inside a stratum and the stratum mean ``μ_h`` gets the hedged
   betting confidence sequence of Waudby-Smith & Ramdas, "Confidence sequences
   for sampling without replacement" (NeurIPS 2020, §3): capital
   ``K_t(m) = ½∏(1 + λ⁺_i (X_i − μ_i(m))) + ½∏(1 − λ⁻_i (X_i − μ_i(m)))`` with
   ``μ_i(m) = (N_h m − Σ_{j<i} X_j)/(N_h − i + 1)`` the mean of the items not yet
   drawn, predictable plug-in bets (variance-adaptive: the bet grows as the
   running variance shrinks), and rejection when ``K_t(m) ≥ H/δ``. Intersected
   with the deterministic bounds of the stratum, the width is exactly 0 once
   the stratum is fully scored. ``target='distribution'`` uses ``μ_i(m) = m``
   (i.i.d. betting CS, Waudby-Smith & Ramdas, JRSS-B 2024) and no finite-
   population shrinkage. See :class:`~certeval.estimators.single.bounds.BettingCS`.
3. **Combination.** Union bound: every stratum sequence holds at level ``δ/H``,
   so with probability ≥ 1 − δ all hold at every time simultaneously, and so
   does ``[Σ W_h lo_h, Σ W_h hi_h]`` (and the per-subset intervals).
4. **Allocation (Cer-Eval's idea, seed 000 Alg. 1 line 18).** A batch of k items
   is allocated greedily, one slot at a time, to the stratum with the largest
   reduction of ``W_h r_h(n_h)``, where ``r_h(n) = (sqrt(2 v̂_h L/n) + L/n)
   sqrt(1 − n/N_h)`` is an empirical-Bernstein proxy of the stratum's radius
   (``v̂_h`` shrunk running variance, ``L = ln(2H/δ)``, finite-population
   factor); items inside the stratum are then drawn uniformly without
   replacement. Allocation only uses past scores (predictable), which keeps the
   per-stratum martingales valid. k = 1 is the one-at-a-time rule.

Guarantee
---------
P(∃ t: Σ_i w_i x_i ∉ [lower_t, upper_t]) ≤ δ for the bank's estimand, at every
look, under any data-dependent stopping rule (Ville's inequality per stratum +
union bound). With a single stratum ``adaptive`` and ``uniform`` coincide; the
partition-on-embeddings route of Cer-Eval is ``cer-eval``'s (adaptive strata
re-fitted on scores would break the per-stratum martingale argument).
"""

from __future__ import annotations

import math

import numpy as np

from ..protocol import register
from .uniform import BettingStrataMethod


def bernstein_proxy(n: np.ndarray, size: np.ndarray, var: np.ndarray, log_term: float) -> np.ndarray:
    """Empirical-Bernstein-shaped radius proxy with finite-population factor; ∞ at n = 0, 0 at n = size.

    ∞ at n = 0 makes every stratum get a first item before any gets a second.
    """
    n = np.asarray(n, dtype=float)
    safe = np.maximum(n, 1.0)
    r = (np.sqrt(2.0 * var * log_term / safe) + log_term / safe) * np.sqrt(np.clip(1.0 - n / size, 0.0, 1.0))
    return np.where(n > 0, r, np.inf)


def greedy_allocation(k: int, gain_fn, counts: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """Allocate k slots one at a time to the stratum with the largest marginal gain.

    ``gain_fn(c)`` gives, elementwise, the gain of one more item in a stratum that
    already has ``c`` (any array shape); the gains of the next k slots of every
    stratum are computed at once, then picked greedily.
    """
    steps = counts[:, None] + np.arange(k)[None, :]
    gains = np.asarray(gain_fn(steps), dtype=float)
    gains = np.where(np.arange(k)[None, :] < capacity[:, None], gains, -np.inf)
    alloc = np.zeros(counts.size, dtype=np.int64)
    rows = np.arange(counts.size)
    for _ in range(k):
        current = gains[rows, np.minimum(alloc, k - 1)]
        current = np.where(alloc < k, current, -np.inf)
        h = int(np.argmax(current))
        if current[h] == -np.inf:
            break
        alloc[h] += 1
    return alloc


@register
class AdaptiveMethod(BettingStrataMethod):
    """Stratified without-replacement betting CS with variance-adaptive allocation (see module docstring)."""

    name = "adaptive"
    guarantee_text = (
        "anytime-valid: per-stratum without-replacement betting confidence sequences "
        "(Waudby-Smith & Ramdas 2020) at δ/H, union bound"
    )

    def _choose(self, k: int, rng: np.random.Generator):
        avail = self.available()
        if self._live_strata.size <= 1:
            return rng.choice(avail, size=k, replace=False), None
        strata_avail = self.strata_[avail]
        capacity = np.bincount(strata_avail, minlength=self.n_strata)
        pending = np.bincount(self.strata_[self.pending_], minlength=self.n_strata)
        counts = self.stratum_n_ + pending
        n = np.maximum(self.stratum_n_, 1)
        mean = self.stratum_sum_ / n
        var = (0.25 + np.maximum(self.stratum_sumsq_ - self.stratum_n_ * mean**2, 0.0)) / (self.stratum_n_ + 1)
        size = np.maximum(self.stratum_size_, 1)[:, None]
        var = var[:, None]
        log_term = math.log(2.0 / self._stratum_delta)
        weight = self.stratum_weight_[:, None]

        def gain(c):
            r0 = bernstein_proxy(c, size, var, log_term)
            return weight * np.where(np.isinf(r0), np.inf, r0 - bernstein_proxy(c + 1, size, var, log_term))

        alloc = greedy_allocation(k, gain, counts, capacity)
        chosen, probs = [], []
        for h in np.flatnonzero(alloc):
            pool = avail[strata_avail == h]
            chosen.append(rng.choice(pool, size=int(alloc[h]), replace=False))
            probs.append(np.full(int(alloc[h]), 1.0 / pool.size))
        return np.concatenate(chosen), np.concatenate(probs)
