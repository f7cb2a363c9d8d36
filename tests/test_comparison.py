"""Paired sequential comparisons: type-I error under H0, power, the confidence sequence, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from certeval.errors import InputError
from certeval.estimators.distribution.comparison import (
    A_GT_B,
    B_GT_A,
    ComparisonDesign,
    PairedComparison,
    run_sequential_pairs,
    wor_confidence_sequence,
)

REPS, N = 1000, 1000
LOOKS = list(range(100, N + 1, 100))
ALPHA = 0.05
TOL = 3 * math.sqrt(ALPHA * (1 - ALPHA) / REPS)  # binomial tolerance over 1000 reps


def _null_pairs(seed=20261101, shift=0.0):
    """Two models with the same per-item success probabilities (H0), fresh bank per rep."""
    rng = np.random.default_rng(seed)
    p = rng.beta(2, 2, size=(REPS, N))
    a = (rng.random((REPS, N)) < p).astype(float)
    b = (rng.random((REPS, N)) < np.clip(p - shift, 0, 1)).astype(float)
    return a, b


def _rejection_rate(res):
    return float(np.isin(res["verdict"], (A_GT_B, B_GT_A)).mean())


@pytest.mark.parametrize("spending", ["pocock", "ld-obf", "hsd:1"])
def test_type_one_error_paired_group_sequential(spending):
    a, b = _null_pairs()
    res = run_sequential_pairs(a, b, LOOKS, ComparisonDesign(alpha=ALPHA, spending=spending))
    assert _rejection_rate(res) <= ALPHA + TOL


def test_unadjusted_fixed_sample_z_at_every_look_fails_the_same_check():
    a, b = _null_pairs()
    d = a - b
    z = np.stack([d[:, :n].mean(1) / np.sqrt(d[:, :n].var(1, ddof=1) / n) for n in LOOKS], axis=1)
    unadjusted = float((np.abs(z) >= 1.959964).any(axis=1).mean())
    assert unadjusted > ALPHA + TOL  # ~0.19 with 10 looks


def test_unpaired_statistic_is_valid_but_conservative_and_less_powerful():
    a, b = _null_pairs()
    res = run_sequential_pairs(a, b, LOOKS, ComparisonDesign(alpha=ALPHA, statistic="unpaired"))
    assert _rejection_rate(res) <= ALPHA + TOL
    a, b = _null_pairs(seed=3, shift=0.06)
    paired = run_sequential_pairs(a, b, LOOKS, ComparisonDesign(alpha=ALPHA))
    unpaired = run_sequential_pairs(a, b, LOOKS, ComparisonDesign(alpha=ALPHA, statistic="unpaired"))
    assert (paired["verdict"] == A_GT_B).mean() > (unpaired["verdict"] == A_GT_B).mean()
    assert paired["used"].mean() < unpaired["used"].mean()


def test_power_sanity_and_items_saved():
    a, b = _null_pairs(seed=5, shift=0.1)
    res = run_sequential_pairs(a, b, LOOKS, ComparisonDesign(alpha=ALPHA))
    assert (res["verdict"] == A_GT_B).mean() > 0.99
    assert (res["verdict"] == B_GT_A).mean() == 0
    assert res["used"].mean() < 0.5 * N  # large effects stop early


def test_repeated_ci_covers_true_difference_simultaneously():
    a, b = _null_pairs(seed=11, shift=0.05)
    # E[a - b] = 0.05 - E[max(0.05 - p, 0)] for p ~ Beta(2, 2): clipping costs < 2e-5
    true = 0.05
    design = ComparisonDesign(alpha=ALPHA)
    miss = np.zeros(REPS, bool)
    for k, n in enumerate(LOOKS[:-1]):
        diff, lo, up = design.interval(a[:, :n], b[:, :n], LOOKS[: k + 1], N)
        miss |= (lo > true + 0.002) | (up < true - 0.002)
    assert miss.mean() <= ALPHA + TOL


def test_confidence_sequence_covers_bank_difference_at_all_times():
    rng = np.random.default_rng(2)
    a = (rng.random(600) < 0.7).astype(float)
    b = (rng.random(600) < 0.62).astype(float)
    d = a - b
    orders = np.argsort(rng.random((500, 600)), axis=1)
    seqs = d[orders]
    lo, up = wor_confidence_sequence(seqs, 600, ALPHA)
    truth = d.mean()
    miss = ((lo > truth + 1e-12) | (up < truth - 1e-12)).any(axis=1).mean()
    assert miss <= ALPHA
    assert np.allclose(lo[:, -1], truth) and np.allclose(up[:, -1], truth)  # exact at exhaustion
    # a deliberately miscalibrated running interval (CLT Wald at every n) fails the same check
    n = np.arange(1, 601)
    mean = np.cumsum(seqs, axis=1) / n
    var = np.maximum(np.cumsum(seqs**2, axis=1) / n - mean**2, 1e-12)
    half = 1.96 * np.sqrt(var / n) * np.sqrt(np.maximum(1 - (n - 1) / 599, 0))
    wald_miss = ((mean - half > truth + 1e-12) | (mean + half < truth - 1e-12))[:, 20:-1].any(axis=1).mean()
    assert wald_miss > ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / 500)


def test_anytime_guarantee_type_one_error_on_a_bank_with_zero_difference():
    a, _ = _null_pairs()
    rng = np.random.default_rng(9)
    b = np.take_along_axis(a, np.argsort(rng.random(a.shape), axis=1), axis=1)  # same bank mean
    res = run_sequential_pairs(a[:300], b[:300], LOOKS, ComparisonDesign(alpha=ALPHA, guarantee="anytime"))
    assert _rejection_rate(res) <= ALPHA


def test_equivalence_and_minimum_improvement_goals():
    rng = np.random.default_rng(4)
    p = rng.beta(2, 2, size=(200, 4000))
    a = (rng.random(p.shape) < p).astype(float)
    b = (rng.random(p.shape) < p).astype(float)
    looks = list(range(500, 4001, 500))
    eq = run_sequential_pairs(a, b, looks, ComparisonDesign(alpha=ALPHA, margin=0.05))
    assert (eq["verdict"] == 3).mean() > 0.9  # equivalent within 0.05
    # one-sided "A beats B by >= 0.02" when A truly beats B by 0.1: decided as improvement
    b2 = (rng.random(p.shape) < np.clip(p - 0.1, 0, 1)).astype(float)
    imp = run_sequential_pairs(a, b2, looks, ComparisonDesign(alpha=ALPHA, goal="improvement", margin=0.02))
    assert (imp["verdict"] == 4).mean() > 0.95
    # and futility when A is no better than B
    fut = run_sequential_pairs(a, b, looks, ComparisonDesign(alpha=ALPHA, goal="improvement", margin=0.02))
    assert (fut["verdict"] == 4).mean() <= ALPHA
    assert (fut["verdict"] == 5).mean() > 0.3  # futility stops a good share early


def test_minimum_improvement_type_one_error_at_the_margin():
    rng = np.random.default_rng(8)
    p = rng.beta(2, 2, size=(REPS, N))
    a = (rng.random(p.shape) < np.clip(p + 0.03, 0, 1)).astype(float)
    b = (rng.random(p.shape) < p).astype(float)
    margin = float((np.clip(p + 0.03, 0, 1) - p).mean())  # true improvement = margin (boundary of H0)
    res = run_sequential_pairs(a, b, LOOKS, ComparisonDesign(alpha=ALPHA, goal="improvement", margin=margin))
    assert (res["verdict"] == 4).mean() <= ALPHA + TOL


def test_mean_of_means_statistic_with_subsets():
    rng = np.random.default_rng(6)
    subsets = np.repeat([0, 1, 2], [100, 300, 600])
    p = np.where(subsets == 0, 0.3, 0.7)
    a = (rng.random((REPS, 1000)) < p).astype(float)
    b = (rng.random((REPS, 1000)) < p).astype(float)
    order = rng.permutation(1000)
    res = run_sequential_pairs(a[:, order], b[:, order], LOOKS, ComparisonDesign(alpha=ALPHA), subsets=subsets[order],
                               n_subsets=3)
    assert _rejection_rate(res) <= ALPHA + TOL


def test_paired_comparison_round_protocol_and_result():
    rng = np.random.default_rng(1)
    a = (rng.random(800) < 0.8).astype(float)
    b = (rng.random(800) < 0.55).astype(float)
    comp = PairedComparison("A", "B", confidence=0.95).start(800)
    order = rng.permutation(800)
    for k in range(8):
        items = order[k * 100:(k + 1) * 100]
        res = comp.update(items, a[items], b[items])
        if res.done:
            break
    assert res.verdict == "a>b" and res.rule == "efficacy" and res.look == 1
    d = res.to_dict()
    assert d["model_a"] == "A" and d["lower"] > 0 and "group-sequential" in d["guarantee"]
    assert res.decision.verdict == "a>b"
    empty = PairedComparison().start(10).result()
    assert math.isnan(empty.diff) and empty.ci() == (-1.0, 1.0) and not empty.done


@pytest.mark.parametrize("kwargs,match", [
    (dict(alpha=1.0), "alpha"),
    (dict(goal="bigger"), "goal"),
    (dict(statistic="welch"), "statistic"),
    (dict(spending="nope"), "spending"),
    (dict(margin=-0.1), "margin"),
    (dict(guarantee="anytime", statistic="unpaired"), "paired"),
])
def test_design_bad_input(kwargs, match):
    with pytest.raises(InputError, match=match):
        ComparisonDesign(**kwargs)
