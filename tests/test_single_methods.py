"""Unit checks of the single-model methods: exact endpoints, an independent capital computation,
state round trips, batching, sub-datasets (mean-of-means) and validation."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import hypergeom

from certeval.errors import InputError
from certeval.estimators import BankSpec, make_method, method_from_state
from certeval.estimators.single.bounds import BettingCS, cereval_radius, seq_radius

METHODS = ["static", "seq", "cer-eval", "uniform", "adaptive"]


def brute_force_log_capital(x, m, n_population, delta, c=0.5):
    """Independent re-implementation of the hedged WoR betting capital (WSR 2020 §3), one step at a time."""
    log_kp = log_km = 0.0
    s, sq = 0.0, 0.25
    for i, xi in enumerate(x, start=1):
        lam = math.sqrt(2 * math.log(2 / delta) / ((sq / i) * i * math.log(1 + i)))
        mu = m if n_population is None else (n_population * m - s) / (n_population - i + 1)
        mu = min(max(mu, 0.0), 1.0)
        lp = lam if mu == 0 else min(lam, c / mu)
        lm = lam if mu == 1 else min(lam, c / (1 - mu))
        log_kp += math.log(1 + lp * (xi - mu))
        log_km += math.log(1 - lm * (xi - mu))
        s += xi
        sq += (xi - (0.5 + s) / (i + 1)) ** 2
    return math.log(0.5 * math.exp(log_kp) + 0.5 * math.exp(log_km))


def run_to(method, x, n, rng, batch=10):
    while method.n_scored < n and not method.exhausted:
        prop = method.propose(min(batch, n - method.n_scored), rng)
        method.update(prop.items, x[prop.items])
    return method.result()


@pytest.mark.parametrize("population", [None, 400])
def test_betting_cs_matches_brute_force_capital(population):
    rng = np.random.default_rng(3)
    x = np.clip(rng.beta(2, 5, size=120), 0, 1)
    cs = BettingCS(delta=0.05, n_population=population, grid_size=257)
    for chunk in np.array_split(x, 7):
        cs.update(chunk)
    a, b = cs._window
    lo, hi = cs.interval()
    threshold = math.log(1 / 0.05)
    for j in range(a, b, 8):  # capital agrees wherever it is still tracked
        m = cs.grid[j]
        ref = brute_force_log_capital(x, m, population, 0.05)
        got = np.logaddexp(cs.log_kplus[j], cs.log_kminus[j]) - math.log(2)
        assert got == pytest.approx(ref, rel=1e-9, abs=1e-9)
    # endpoints: two grid steps outside the interval the brute-force capital crossed 1/δ at some look;
    # at the sample mean it never did
    looks = np.cumsum([len(c) for c in np.array_split(x, 7)])

    def peak(m):
        return max(brute_force_log_capital(x[:t], m, population, 0.05) for t in looks)

    for m in (lo - 2 * cs.step, hi + 2 * cs.step):
        if 0 < m < 1:
            assert peak(m) >= threshold
    assert peak(x.mean()) < threshold
    assert lo <= x.mean() <= hi


def test_adaptive_zero_width_when_all_scored_and_inside_hypergeometric_envelope():
    rng = np.random.default_rng(5)
    n_items, k_ones = 300, 87
    x = np.zeros(n_items)
    x[rng.choice(n_items, k_ones, replace=False)] = 1.0
    method = make_method("adaptive", confidence=0.95).start(BankSpec(n_items))
    est = run_to(method, x, 100, rng)
    # sanity envelope: exact (Clopper-Pearson-type) hypergeometric bounds at a *fixed* n are narrower
    # than an anytime-valid interval, which must contain them
    drawn = int(round(est.n_scored * method.stratum_sum_[0] / method.stratum_n_[0]))
    feasible = np.arange(drawn, n_items - (est.n_scored - drawn) + 1)
    cdf = hypergeom.cdf(drawn, n_items, feasible, est.n_scored)
    sf = hypergeom.sf(drawn - 1, n_items, feasible, est.n_scored)
    kept = feasible[(cdf > 0.025) & (sf > 0.025)] / n_items
    assert est.lower <= kept.min() + 1e-12 and kept.max() <= est.upper + 1e-12
    assert est.lower <= k_ones / n_items <= est.upper
    est = run_to(method, x, n_items, rng)
    assert est.exhausted and est.halfwidth == 0.0
    assert est.mean == pytest.approx(k_ones / n_items)


def test_adaptive_distribution_target_keeps_width_when_all_scored():
    rng = np.random.default_rng(1)
    x = (rng.random(400) < 0.4).astype(float)
    est = run_to(make_method("adaptive", target="distribution").start(BankSpec(400)), x, 400, rng)
    assert est.target == "distribution" and est.halfwidth > 0.02
    assert est.lower <= x.mean() <= est.upper


@pytest.mark.parametrize("name", METHODS)
def test_state_round_trip(name):
    rng = np.random.default_rng(11)
    n = 600
    subsets = rng.integers(0, 3, size=n)
    features = rng.normal(size=(n, 3))
    x = (rng.random(n) < 0.3 + 0.2 * subsets).astype(float)
    method = make_method(name, confidence=0.9).start(
        BankSpec(n, subsets=subsets, subset_names=("a", "b", "c"), features=features))
    run_to(method, x, 230, rng)
    blob = json.loads(json.dumps(method.state()))
    again = method_from_state(blob)
    assert again.result().to_dict() == method.result().to_dict()
    # both continue identically with the same random stream
    r1, r2 = np.random.default_rng(4), np.random.default_rng(4)
    p1, p2 = method.propose(10, r1), again.propose(10, r2)
    assert np.array_equal(p1.items, p2.items)


@pytest.mark.parametrize("name", ["seq", "cer-eval", "uniform", "adaptive"])
def test_batch_of_one_and_batches_agree(name):
    rng = np.random.default_rng(8)
    n = 600
    x = np.clip(rng.normal(0.3, 0.15, size=n), 0, 1)
    features = np.c_[x + rng.normal(0, 0.05, n), rng.normal(size=n)]
    used = {}
    for k in (1, 25):
        ns = []
        for rep in range(3):
            r = np.random.default_rng([k, rep])
            method = make_method(name).start(BankSpec(n, features=features))
            while True:
                est = method.result()
                if est.n_scored and est.halfwidth <= 0.08 or est.exhausted:
                    break
                prop = method.propose(k, r)
                assert len(prop) == min(k, n - method.n_scored)
                method.update(prop.items, x[prop.items])
            assert est.lower <= x.mean() <= est.upper
            ns.append(est.n_scored)
        used[k] = np.mean(ns)
    # a batch overshoots the one-at-a-time stopping point by less than one batch (plus noise)
    assert abs(used[25] - used[1]) <= 25 + 0.25 * used[1]


def test_subsets_mean_of_means():
    rng = np.random.default_rng(2)
    sizes = (40, 200, 360)
    subsets = np.repeat(np.arange(3), sizes)
    p = np.array([0.9, 0.5, 0.1])[subsets]
    x = (rng.random(subsets.size) < p).astype(float)
    truth = np.mean([x[subsets == s].mean() for s in range(3)])
    assert truth != pytest.approx(x.mean(), abs=0.01)  # the estimands differ
    spec = BankSpec(subsets.size, subsets=subsets, subset_names=("s0", "s1", "s2"),
                    features=rng.normal(size=(subsets.size, 2)))
    for name in METHODS:
        method = make_method(name).start(spec)
        est = run_to(method, x, 300, rng)
        assert len(est.subsets) == 3
        if name != "static":
            assert est.lower - 1e-12 <= truth <= est.upper + 1e-12, name
            for sub, s in zip(est.subsets, range(3)):
                assert sub.lower - 1e-12 <= x[subsets == s].mean() <= sub.upper + 1e-12
        est = run_to(method, x, subsets.size, rng)
        assert est.exhausted and est.mean == pytest.approx(truth)
        assert est.halfwidth == pytest.approx(0.0, abs=1e-12)
    # adaptive puts more of its items where the variance is (the 0.5 subset), per unit of weight
    method = make_method("adaptive").start(spec)
    run_to(method, x, 150, rng)
    per_weight = method.stratum_n_ / method.stratum_weight_
    assert per_weight[1] > per_weight[0] and per_weight[1] > per_weight[2]


def test_radii_match_the_printed_formulas():
    # Alg. 3 line 3 and Alg. 1 lines 10-11 of Wang et al. 2025, arXiv:2505.03814, evaluated by hand
    n, delta = 100, 0.05
    assert seq_radius(n, delta) == pytest.approx(math.sqrt((2 * math.log(math.log(100) + 1) + math.log(80)) / 100))
    eta = math.sqrt((2 * math.log(math.log(100) + 1) + math.log(16 * 3 / delta)) / 100)
    ref = 2 * eta**2 / 3 + 2 * math.sqrt((0.04 + eta + eta**2) * eta**2)
    assert cereval_radius(100, 0.04, 3, delta) == pytest.approx(ref)
    # the floor docs/results_single.md derives: at n = 5000 and zero variance the radius stays near 0.02-0.03
    assert 0.02 < cereval_radius(5000, 0.0, 1, delta) < 0.035


def test_cer_eval_needs_features_and_validates_params():
    with pytest.raises(InputError, match="features"):
        make_method("cer-eval").start(BankSpec(10))
    with pytest.raises(InputError, match="beta"):
        make_method("cer-eval", beta=1.0).start(BankSpec(10, features=np.zeros((10, 1))))
    with pytest.raises(InputError, match="confidence"):
        make_method("adaptive", confidence=1.0).start(BankSpec(10))
    with pytest.raises(InputError, match="target"):
        make_method("seq", target="population").start(BankSpec(10))


def test_cer_eval_stores_partition_labels():
    rng = np.random.default_rng(0)
    n = 800
    g = rng.integers(0, 2, n)
    features = np.c_[5.0 * g + rng.normal(size=n), rng.normal(size=n)]
    x = np.where(g == 1, 1.0, 0.0)  # zero variance inside each true group
    method = make_method("cer-eval", warm_start=50).start(BankSpec(n, features=features))
    est = run_to(method, x, 200, rng)
    labels = np.asarray(method.state()["extra"]["labels"])
    assert labels.shape == (n,) and dict(est.extra)["partition_refits"] >= 1
    assert dict(est.extra)["n_strata"] == 2  # the 1-NN partition recovers the two groups
    assert est.lower <= x.mean() <= est.upper


@pytest.mark.parametrize("seed", range(6))
def test_incremental_nearest_equals_brute_force(seed):
    """update_nearest fed in batches == a brute-force 1-NN over every scored point (scipy cdist)."""
    from scipy.spatial.distance import cdist

    from certeval.estimators.single.partition import update_nearest

    rng = np.random.default_rng(seed)
    features = rng.normal(size=(600, 3))
    order = rng.permutation(600)[:250]
    nearest = dist = None
    for lo, hi in [(0, 7), (7, 60), (60, 61), (61, 250)]:
        nearest, dist = update_nearest(features, order[lo:hi], nearest, dist)
        seen = order[:hi]
        d = cdist(features, features[seen])
        assert np.array_equal(nearest, seen[d.argmin(axis=1)])
        np.testing.assert_allclose(dist, d.min(axis=1), atol=1e-12)
        assert np.array_equal(nearest[seen], seen)


def test_cer_eval_incremental_partition_matches_full_refit():
    """The kept nearest neighbours give the same strata as re-running the 1-NN search from scratch."""
    from certeval.estimators.single.partition import nn_partition

    rng = np.random.default_rng(3)
    n = 900
    features = rng.normal(size=(n, 4))
    x = (rng.random(n) < 1 / (1 + np.exp(-2 * features[:, 0]))).astype(float)
    method = make_method("cer-eval", warm_start=40).start(BankSpec(n, features=features))
    run_to(method, x, 400, rng)
    assert method.refits_ >= 5 and method.nn_seen_ == method.n_scored  # last re-fit saw every score
    full = nn_partition(method.features_, method.scored_, method.scores_, method.base_codes_,
                        method.item_weights_, method.delta)
    assert np.array_equal(full, method.labels_)
    again = method_from_state(json.loads(json.dumps(method.state())))
    assert np.array_equal(again.labels_, method.labels_)


def test_empty_result_is_not_confident():
    est = make_method("adaptive").start(BankSpec(20)).result()
    assert math.isnan(est.mean) and est.ci() == (0.0, 1.0)
