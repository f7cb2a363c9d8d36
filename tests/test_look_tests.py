"""The per-look ε-listing tests (``estimators/bank/look_tests.py``), the pair tests of large neighbour rankings: a true
null is rejected with probability at most its level whenever the tests are looked at (Monte Carlo over many finite
lists whose mean sits exactly on the boundary, the least favourable case; the exact three-value update of 0/1
looks and the quadratic bound of other looks), a fixed-n test read at every look — the same data, the same check —
is caught. Unequal weights, items drawn ∝ weight without replacement: lists whose *weighted* mean sits on the
boundary are rejected within δ, and the same tests told the weights are equal — on lists whose unweighted mean sits
on the boundary, so their own null is true — are caught. Power: with the same data the tests settle a clear gap.

Power of the check: with K = 3,000 lists and a bound at the 0.999 quantile of Binomial(K, δ = 0.1) (352), a test
whose true error rate is 0.14 exceeds it with probability > 0.999 (its mean, 420, is 3.6 sd above)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from certeval.estimators.bank.look_tests import LookTests, look_coefficients

EPS, DELTA, N, K, LOOK = 0.1, 0.1, 120, 3000, 10


def _boundary_lists(seed: int, mean: float, three_valued: bool) -> np.ndarray:
    """K finite lists of N values whose mean is exactly ``mean``, each in a uniformly random order: values in
    {0, 1/2, 1} (a pair of 0/1 scores; the number of ties varies from list to list), or spread over [0, 1]."""
    rng = np.random.default_rng(seed)
    out = np.empty((K, N))
    for k in range(K):
        if three_valued:
            total = int(round(mean * 2 * N))
            halves = int(rng.integers(0, N // 2)) * 2 + (total % 2)
            halves = min(halves, total, 2 * N - total)
            ones = (total - halves) // 2
            row = np.r_[np.zeros(N - ones - halves), np.full(halves, 0.5), np.ones(ones)]
        else:  # a Beta list moved to the exact mean, clipped into [0, 1] and fixed up
            spread = rng.uniform(0.5, 5.0)
            row = rng.beta(spread * mean, spread * (1 - mean), N)
            for _ in range(50):
                row = np.clip(row + (mean - row.mean()), 0.0, 1.0)
            row[0] += mean * N - row.sum()
        assert abs(row.mean() - mean) < 1e-12
        out[k] = rng.permutation(row)
    return out


def _run(z: np.ndarray, three_valued: bool) -> LookTests:
    tests = LookTests(K, N, DELTA, EPS)
    w = np.full(N, 1.0 / N)
    for start in range(0, N - 1, LOOK):
        stop = min(start + LOOK, N - 1)  # the last item would make the verdict certain
        zz, ww = z[:, start:stop], w[start:stop]
        _, g, _ = look_coefficients(ww, tests.remaining)
        sums = (zz.sum(axis=1), (zz * zz).sum(axis=1), zz @ g, zz @ ww)
        counts = ((zz == 1).sum(axis=1).astype(float), (zz == 0).sum(axis=1).astype(float)) if three_valued else ()
        tests.absorb_sums(ww, *sums, *counts)
    return tests


def _peeked_fixed_n_rejections(z: np.ndarray, side: str) -> int:
    m0 = (1 - EPS) / 2 if side == "a" else (1 + EPS) / 2
    crit = stats.norm.ppf(1 - DELTA)
    hit = np.zeros(K, dtype=bool)
    for n in range(LOOK, N, LOOK):
        mean, sd = z[:, :n].mean(axis=1), np.maximum(z[:, :n].std(axis=1, ddof=1), 1e-9)
        t = (mean - m0) / (sd / np.sqrt(n) * np.sqrt((N - n) / (N - 1)))
        hit |= (t > crit) if side == "a" else (t < -crit)
    return int(hit.sum())


@pytest.mark.parametrize("three_valued", [True, False])
@pytest.mark.parametrize("side", ["a", "b"])
def test_a_true_boundary_null_is_rejected_at_most_delta_with_peeking_and_the_controls_are_caught(side, three_valued):
    mean = (1 - EPS) / 2 if side == "a" else (1 + EPS) / 2
    z = _boundary_lists(11 + (side == "b") + 2 * three_valued, mean, three_valued)
    tests = _run(z, three_valued)
    wrong = int((tests.rejected_a if side == "a" else tests.rejected_b).sum())
    bound = stats.binom.ppf(0.999, K, DELTA)
    assert wrong <= bound < _peeked_fixed_n_rejections(z, side), (wrong, bound)


def test_power_on_a_clear_gap_and_no_wrong_certificate():
    z = _boundary_lists(9, 0.7, True)  # Δ = 0.4: "a above b" true and soon certified; "b above a" false
    tests = _run(z, True)
    assert tests.rejected_a.mean() > 0.9 and not tests.rejected_b.any()


def _weighted_lists(seed: int, k: int, mean: float, weighted: bool) -> tuple[np.ndarray, np.ndarray]:
    """``k`` lists of N values in [0, 1] with weights in [0.2, 1.8]/N (normalised), the values rising with the weight;
    the weighted mean (or, ``weighted=False``, the plain mean) is exactly ``mean``."""
    rng = np.random.default_rng(seed)
    ws, zs = np.empty((k, N)), np.empty((k, N))
    for r in range(k):
        w = rng.uniform(0.2, 1.8, N)
        w /= w.sum()
        p = w if weighted else np.full(N, 1.0 / N)
        z = np.clip(rng.beta(2, 2, N) - 0.5 + mean + 0.3 * (w * N - 1), 0.0, 1.0)
        for _ in range(100):
            z = np.clip(z + (mean - p @ z), 0.0, 1.0)
        j = int(np.argmax(p * np.minimum(z, 1 - z)))
        z[j] += (mean - p @ z) / p[j]
        assert 0.0 <= z[j] <= 1.0 and abs(p @ z - mean) < 1e-12
        ws[r], zs[r] = w, z
    return ws, zs


def _weighted_rejections(ws: np.ndarray, zs: np.ndarray, seed: int, told_equal: bool) -> int:
    """Each list drawn ∝ weight without replacement (Efraimidis–Spirakis keys), a look every LOOK items up to the
    last but one, H_A tested on the weights (or on equal weights when ``told_equal``); lists whose H_A was rejected."""
    rng = np.random.default_rng(seed)
    rejected = 0
    for w, z in zip(ws, zs):
        order = np.argsort(np.log(rng.random(N)) / w)[::-1]
        w, z = (np.full(N, 1.0 / N) if told_equal else w[order]), z[order]
        tests = LookTests(1, N, DELTA, EPS)
        for start in range(0, N - 1, LOOK):
            stop = min(start + LOOK, N - 1)
            zz, ww = z[None, start:stop], w[start:stop]
            _, g, _ = look_coefficients(ww, tests.remaining)
            tests.absorb_sums(ww, zz.sum(axis=1), (zz * zz).sum(axis=1), zz @ g, zz @ ww)
        rejected += int(tests.rejected_a[0])
    return rejected


def test_unequal_weights_drawn_by_weight_hold_the_level_and_ignoring_the_weights_is_caught():
    """1,000 lists each way (bound 130 at 1 in 1,000): on the weighted boundary 11 rejections were measured; the
    tests told the weights are equal, on lists whose plain mean is on the boundary (heavy items score higher, so the
    draws ∝ weight come in high), rejected 512."""
    k, m_a = 1000, (1 - EPS) / 2
    bound = stats.binom.ppf(0.999, k, DELTA)
    valid = _weighted_rejections(*_weighted_lists(5, k, m_a, weighted=True), seed=1, told_equal=False)
    control = _weighted_rejections(*_weighted_lists(6, k, m_a, weighted=False), seed=2, told_equal=True)
    assert valid <= bound < control, (valid, bound, control)
