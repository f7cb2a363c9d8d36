"""Pair intervals at n = 100 against a without-replacement betting CS written here, independently of the package.

The reference follows Waudby-Smith & Ramdas (2020, §3; JRSS-B 2024) line by line, one candidate grid per pair and
one item at a time: hedged capital ``½∏(1 + λ⁺(z − ν)) + ½∏(1 − λ⁻(z − ν))``, the predictable plug-in bet
``sqrt(2 ln(2/δ) / (σ̂² i ln(1 + i)))`` truncated at ``½/ν`` and ``½/(1 − ν)``, and for the order drawn ∝ weight
the conditional mean ``ν_i(m) = (m − K_{i−1}) / U_i`` (the equal-weight case is WSR's ``(N m − S)/(N − i + 1)``).
The streams paired runs use must come within 1.1× of it on real banks (the mean of sub-dataset means on
helm_mmlu, the plain mean on vlm_ocrbench), and the empirical-Bernstein streams the project used before must fail
the same check.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from certeval.estimators.bank.wor_streams import BettingStreams, WorStreams, weighted_order
from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

N_ITEMS = 100
MODELS = 8
ALPHA = 0.05
REF_GRID = 4001


def reference_halfwidths(z: np.ndarray, w: np.ndarray, delta: float) -> np.ndarray:
    """Half-widths on the [0, 1] scale of each row's WoR hedged betting CS after all of ``z``'s columns, drawn in
    that order ∝ ``w`` (``w`` the drawn items' weights; the whole bank's weights sum to 1)."""
    m = np.linspace(0.0, 1.0, REF_GRID)
    out = []
    for row in z:
        log_kp = np.zeros(m.size)
        log_km = np.zeros(m.size)
        alive = np.ones(m.size, dtype=bool)
        undrawn, known, total, sq = 1.0, 0.0, 0.0, 0.25
        for i, (zi, wi) in enumerate(zip(row, w), start=1):
            var = sq / i  # WSR's running variance around the shrunk running mean, through draw i − 1
            lam = math.sqrt(2.0 * math.log(2.0 / delta) / (var * i * math.log1p(i)))
            nu = np.clip((m - known) / max(undrawn, wi), 0.0, 1.0)
            with np.errstate(divide="ignore"):
                lam_p = np.minimum(lam, 0.5 / nu)
                lam_m = np.minimum(lam, 0.5 / (1.0 - nu))
            log_kp += np.log1p(lam_p * (zi - nu))
            log_km += np.log1p(-lam_m * (zi - nu))
            alive &= np.logaddexp(log_kp, log_km) - math.log(2.0) < math.log(1.0 / delta)
            total += zi
            sq += (zi - (0.5 + total) / (i + 1)) ** 2
            known += wi * zi
            undrawn -= wi
        kept = m[alive & (m >= known) & (m <= known + undrawn)]
        out.append(0.5 * (kept.max() - kept.min()) if kept.size else 0.0)
    return np.asarray(out)


def bank_pairs(name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Paired differences on the [0, 1] scale, ``(x_a − x_b + 1)/2``, of every pair of ``MODELS`` seeded models,
    and the estimand's item weights (mean of sub-dataset means where the bank has sub-datasets)."""
    frame = load_scores(f"bundled:{name}")
    bank = bank_from_scores(frame)
    models = sorted(frame["model"].unique())
    picks = [models[i] for i in np.random.default_rng(seed).choice(len(models), MODELS, replace=False)]
    x = score_matrix(frame, picks, bank)
    keep = ~np.isnan(x).any(axis=0)
    x = x[:, keep]
    w = bank.spec().weights()[keep]
    w = w / w.sum()
    a, b = np.triu_indices(MODELS, 1)
    return (x[a] - x[b] + 1.0) / 2.0, w


@pytest.mark.parametrize("name", ["helm_mmlu", "vlm_ocrbench"])
def test_pair_streams_are_within_ten_percent_of_an_independent_wor_betting_cs(name):
    z, w = bank_pairs(name, seed=3)
    delta = ALPHA / len(z)  # a ranking's Bonferroni level over the pairs
    ratios = {"betting": [], "betting-horizon": [], "empirical-bernstein": []}
    for rep in range(2):
        order = weighted_order(w, np.random.default_rng([17, rep]))[:N_ITEMS]
        ref = reference_halfwidths(z[:, order], w[order], delta)
        for label, streams in (("betting", BettingStreams(len(z), w.size, delta)),
                               ("betting-horizon", BettingStreams(len(z), w.size, delta, bet_horizon=N_ITEMS)),
                               ("empirical-bernstein", WorStreams(len(z), w.size, delta))):
            for start in range(0, N_ITEMS, 10):  # looks every 10 items, as a live run makes them
                cols = order[start:start + 10]
                streams.absorb(z[:, cols], w[cols])
            _, lo, up = streams.bounds()
            ratios[label].extend((0.5 * (up - lo) / ref).tolist())
    median = {k: float(np.median(v)) for k, v in ratios.items()}
    assert median["betting"] <= 1.1 and median["betting-horizon"] <= 1.1, median
    # the same math, written twice: the two must agree (the grid steps differ), not merely be close to 1.1
    assert median["betting"] >= 0.95, median
    # the control: the empirical-Bernstein streams paired runs used before fail the same check
    assert median["empirical-bernstein"] > 1.1, median
