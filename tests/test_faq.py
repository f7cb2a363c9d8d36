"""FAQ (Wu et al. 2026, arXiv:2601.20251): Laplace update, hybrid policy, PAI unbiasedness and intervals, the round protocol."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats
from scipy.special import expit

from certeval.errors import InputError
from certeval.estimators import BankSpec, make_method, method_from_state
from certeval.estimators.faq.factor_model import FactorModel, factor_prior
from certeval.estimators.faq.querying import (
    FactorPrior,
    Schedule,
    active_learning_scores,
    draw_items,
    hybrid_policy,
    laplace_update,
    pai_interval,
)
from certeval.estimators.faq.simulation import simulate_faq, terms_from_simulation


# ----------------------------------------------------------------------------------------------
# fixtures: a synthetic bank drawn from the published MMLU-Pro factors, and a small low-rank one
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mmlu_bank(data_dir):
    with np.load(data_dir / "faq_mmlu_pro.factors.npz", allow_pickle=False) as d:
        u_all, v_all = d["model_factors"].astype(float), d["item_factors"].astype(float)
    rng = np.random.default_rng(2024)
    items = rng.choice(v_all.shape[0], 300, replace=False)
    v = v_all[items]
    mean, cov = factor_prior(u_all[:1100])
    z = (rng.random(300) < expit(v @ u_all[1124])).astype(float)  # a model outside the prior cohort (rows < 1100), accuracy ~0.5
    return v, mean, cov, z


def _small_bank(n=300, k=4, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.normal(0.4, 1.0, (200, k))
    v = rng.normal(0.0, 1.0, (n, k))
    truth = (rng.random(n) < expit(v @ rng.normal(0.4, 1.0, k))).astype(float)
    mean, cov = factor_prior(u)
    return v, mean, cov, truth


# ----------------------------------------------------------------------------------------------
# posterior
# ----------------------------------------------------------------------------------------------
def test_laplace_update_equals_one_direct_newton_step():
    rng = np.random.default_rng(0)
    k = 4
    a = rng.normal(size=(k, k))
    cov = a @ a.T + 0.5 * np.eye(k)
    mu, v = rng.normal(size=k), rng.normal(size=k)
    for z in (0.0, 1.0):
        # Newton step on log N(u; μ, Σ) + log Bern(z | σ(uᵀv)) from u = μ, by explicit matrix inverses
        p = expit(mu @ v)
        grad = (z - p) * v
        hess = -np.linalg.inv(cov) - p * (1 - p) * np.outer(v, v)
        newton_mean = mu - np.linalg.solve(hess, grad)
        newton_cov = np.linalg.inv(-hess)
        m1, c1 = laplace_update(mu[None], cov[None], v[None], np.array([z]))
        np.testing.assert_allclose(m1[0], newton_mean, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(c1[0], newton_cov, rtol=1e-10, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# policy
# ----------------------------------------------------------------------------------------------
def test_oracle_policy_mixes_sqrt_p1mp_with_tau_uniform_and_is_bounded_below():
    rng = np.random.default_rng(1)
    p = rng.uniform(0.01, 0.99, (3, 50))
    w = np.full(50, 1 / 50)
    q = hybrid_policy(p, None, np.zeros((50, 2)), w, step=0, schedule=Schedule(0.2))
    h = np.sqrt(p * (1 - p))
    np.testing.assert_allclose(q, 0.8 * h / h.sum(axis=1, keepdims=True) + 0.2 / 50)
    np.testing.assert_allclose(q.sum(axis=1), 1.0)
    assert q.min() >= 0.2 / 50 - 1e-15


def test_active_learning_score_matches_the_closed_form_item_by_item():
    rng = np.random.default_rng(2)
    n, k = 12, 3
    v = rng.normal(size=(n, k))
    a = rng.normal(size=(k, k))
    cov = a @ a.T + np.eye(k)
    p = rng.uniform(0.1, 0.9, (1, n))
    w = p[0] * (1 - p[0])
    g = (w / n) @ v
    d = np.array([w[j] * (v[j] @ cov @ g) ** 2 / (1 + w[j] * v[j] @ cov @ v[j]) for j in range(n)])
    got = active_learning_scores(p, cov[None], v, np.full(n, 1 / n))
    np.testing.assert_allclose(got[0], d / d.sum(), rtol=1e-10)
    # schedules: ρ > 0 mixes it in early; α = 0 once s+1 ≥ ρ n_b
    q_early = hybrid_policy(p, cov[None], v, np.full(n, 1 / n), step=0, schedule=Schedule(0.1, 10, rho=1.0))
    q_late = hybrid_policy(p, cov[None], v, np.full(n, 1 / n), step=9, schedule=Schedule(0.1, 10, rho=1.0))
    q_oracle = hybrid_policy(p, cov[None], v, np.full(n, 1 / n), step=0, schedule=Schedule(0.1, 10))
    np.testing.assert_allclose(q_late, q_oracle)
    assert not np.allclose(q_early, q_oracle)


def test_draws_follow_the_policy():
    q = np.array([[0.5, 0.25, 0.125, 0.125]])
    idx = draw_items(np.repeat(q, 4, axis=0), np.random.default_rng(3).random((4, 5000)))
    counts = np.bincount(idx.ravel(), minlength=4)
    assert stats.chisquare(counts, q[0] * counts.sum()).pvalue > 1e-3
    wrong = np.full(4, 0.25) * counts.sum()  # a uniform sampler would be rejected by the same check
    assert stats.chisquare(counts, wrong).pvalue < 1e-6


# ----------------------------------------------------------------------------------------------
# PAI: unbiased, intervals
# ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mmlu_runs(mmlu_bank):
    v, mean, cov, z = mmlu_bank
    reps, n = 2000, 30
    sim = simulate_faq(np.tile(z, (reps, 1)), FactorPrior(v, mean, cov), n, np.random.default_rng(7))
    return sim, z.mean(), n


def test_pai_is_unbiased_over_2000_seeds_on_a_bank_from_the_mmlu_pro_factors(mmlu_runs):
    sim, theta, _ = mmlu_runs
    est, _, _, _ = pai_interval(terms_from_simulation(sim))
    se = est.std(ddof=1) / np.sqrt(est.size)
    assert abs(est.mean() - theta) < 3.5 * se
    # the plug-in alone (no inverse-probability correction) is biased: the same check catches it
    plug = sim["plug_in"][:, -1]
    assert abs(plug.mean() - theta) > 5 * plug.std(ddof=1) / np.sqrt(plug.size) + 0.005
    # and FAQ beats uniform sampling with replacement at the same budget here
    assert est.var() < theta * (1 - theta) / sim["z"].shape[1]


def test_default_interval_covers_while_the_papers_collapses_and_a_halved_one_fails(mmlu_runs):
    sim, theta, n = mmlu_runs
    terms = terms_from_simulation(sim)
    cover = {}
    for kind in ("default", "paper", "anytime"):
        est, lo, hi, _ = pai_interval(terms, 0.95, kind, planned_n=n)
        cover[kind] = np.mean((lo <= theta) & (theta <= hi))
        if kind == "default":
            half = (hi - lo) / 2
            cover["halved"] = np.mean(np.abs(est - theta) <= half / 2)
    mc = np.sqrt(0.05 * 0.95 / 2000)
    assert cover["default"] >= 0.95 - 3 * mc
    assert cover["anytime"] >= cover["default"]
    assert cover["paper"] < cover["default"]
    assert cover["halved"] < 0.95 - 5 * mc  # a deliberately miscalibrated interval fails the check


def test_anytime_interval_survives_peeking_while_the_fixed_budget_interval_does_not():
    v, mean, cov, z = _small_bank()
    theta = z.mean()
    reps, n = 1000, 200
    sim = simulate_faq(np.tile(z, (reps, 1)), FactorPrior(v, mean, cov), n, np.random.default_rng(11))
    terms = terms_from_simulation(sim)
    looks = np.arange(10, n + 1, 10) - 1  # peek after every 10 draws
    missed = {}
    for kind in ("anytime", "default"):
        _, lo, hi, _ = pai_interval(terms, 0.95, kind, planned_n=n, path=True)
        excluded = (lo[:, looks] > theta) | (hi[:, looks] < theta)
        missed[kind] = excluded.any(axis=1).mean()  # stop at the first look that excludes θ
    assert missed["anytime"] <= 0.05
    assert missed["default"] > 0.05 + 3 * np.sqrt(0.05 * 0.95 / reps)


def test_sparse_history_still_valid_and_no_worse_than_uniform():
    rng = np.random.default_rng(5)
    m, n, k = 150, 300, 3
    u = rng.normal(0.3, 1.0, (m + 1, k))
    v_true = rng.normal(0.0, 1.2, (n, k))
    full = (rng.random((m + 1, n)) < expit(u @ v_true.T)).astype(float)
    history = np.where(rng.random((m, n)) < 0.99, np.nan, full[:m])  # 99 % missing
    fm = FactorModel(factor_grid=(1, 2), penalty_grid=(1.0, 10.0), n_folds=2).fit(history, rng=np.random.default_rng(0))
    mean, cov = fm.prior()
    truth = full[m]
    theta, reps, budget = truth.mean(), 1000, 30
    sim = simulate_faq(np.tile(truth, (reps, 1)), FactorPrior(fm.item_factors_, mean, cov), budget,
                       np.random.default_rng(9))
    est, lo, hi, _ = pai_interval(terms_from_simulation(sim), 0.95, "default")
    coverage = np.mean((lo <= theta) & (theta <= hi))
    assert coverage >= 0.95 - 3 * np.sqrt(0.05 * 0.95 / reps)
    mse = np.mean((est - theta) ** 2)
    uniform_var = truth.var() / budget  # uniform sampling with replacement, exact
    assert mse <= uniform_var * (1 + 3 * np.sqrt(2 / reps))


# ----------------------------------------------------------------------------------------------
# the round protocol
# ----------------------------------------------------------------------------------------------
def _method(v, mean, cov, **kw):
    return make_method("faq", item_factors=v, prior_mean=mean, prior_cov=cov, **kw).start(BankSpec(v.shape[0]))


@pytest.mark.parametrize("batch", [1, 3])
def test_method_matches_the_vectorised_simulation_draw_for_draw(batch):
    v, mean, cov, z = _small_bank(n=80)
    method = _method(v, mean, cov, tau=0.2)
    rng = np.random.default_rng(4)
    items = []
    for _ in range(12):
        prop = method.propose(batch, rng)
        items += prop.items.tolist()
        method.update(prop.items, z[prop.items])
    sim = simulate_faq(z[None], FactorPrior(v, mean, cov), 12 * batch, np.random.default_rng(4), schedule=Schedule(0.2),
                       batch_size=batch)
    assert items == sim["item"][0].tolist()
    est = method.result()
    ref, lo, hi, _ = pai_interval(terms_from_simulation(sim))
    assert est.mean == pytest.approx(float(ref[0]), abs=1e-12)
    assert est.ci() == pytest.approx((float(lo[0]), float(hi[0])), abs=1e-12)
    assert est.n_scored == 12 * batch and not est.anytime_valid


def test_state_round_trip_through_json_continues_identically():
    v, mean, cov, z = _small_bank(n=60)
    a = _method(v, mean, cov, ci="anytime", budget=40)
    rng = np.random.default_rng(8)
    for _ in range(5):
        prop = a.propose(4, rng)
        a.update(prop.items, z[prop.items])
    pending = a.propose(2, rng)  # in flight when the state is saved
    b = method_from_state(json.loads(json.dumps(a.state())))
    for m in (a, b):
        m.update(pending.items, z[pending.items])
    r1, r2 = np.random.default_rng(1), np.random.default_rng(1)
    np.testing.assert_array_equal(a.propose(3, r1).items, b.propose(3, r2).items)
    assert a.result().to_dict() == b.result().to_dict()
    est = a.result()
    assert est.anytime_valid and "anytime-valid" in est.guarantee


def test_anytime_interval_without_budget_is_tuned_once_at_the_bank_size():
    """A confidence sequence re-tuned at every look is not time-uniform: without a budget the tuning
    point must be fixed before the data (the bank size), the same at every look."""
    v, mean, cov, z = _small_bank(n=60)
    m = _method(v, mean, cov, ci="anytime")
    rng = np.random.default_rng(2)
    for look in range(1, 9):
        prop = m.propose(25, rng)  # 200 draws in all: past N = 60, where max(n, 100) would re-tune
        m.update(prop.items, z[prop.items])
        est = m.result()
        pseudo = 0.25 * 60 * float(np.sum(np.full(60, 1 / 60) ** 2))
        _, lo, hi, _ = pai_interval(m.terms(), 0.95, "anytime", planned_n=60, pseudo_var=pseudo)
        assert est.ci() == pytest.approx((float(lo), float(hi)), abs=1e-12), look


def test_repeats_are_legal_unproposed_items_are_refused_and_empty_is_trivial():
    v, mean, cov, z = _small_bank(n=5)
    m = _method(v, mean, cov, tau=0.5)
    est = m.result()
    assert np.isnan(est.mean) and est.ci() == (0.0, 1.0)
    prop = m.propose(40, np.random.default_rng(0))
    assert len(np.unique(prop.items)) < 40  # with replacement on 5 items
    twin = method_from_state(json.loads(json.dumps(m.state())))
    m.update(prop.items, z[prop.items])
    twin.update(prop.items[::-1], z[prop.items[::-1]])  # scores may come back in any order
    assert m.result().n_scored == 40
    assert twin.result().mean == pytest.approx(m.result().mean, abs=1e-12)
    with pytest.raises(InputError, match="not proposed"):
        m.update([0], [1.0])
    with pytest.raises(InputError, match="ci must be one of"):
        make_method("faq", item_factors=v, prior_mean=mean, prior_cov=cov, ci="bogus").start(BankSpec(5))
    with pytest.raises(InputError, match="budget must be given"):
        make_method("faq", item_factors=v, prior_mean=mean, prior_cov=cov, rho=0.5).start(BankSpec(5))
    with pytest.raises(InputError, match="one row per bank item"):
        make_method("faq", item_factors=v, prior_mean=mean, prior_cov=cov).start(BankSpec(6))


@pytest.mark.parametrize("ci", ["default", "paper", "anytime"])
def test_every_faq_interval_is_labelled_asymptotic_in_the_result_type(ci):
    """FAQ's intervals rest on a martingale CLT: the result says so, its anytime CS included, so code can tell
    them from the exact intervals of the other methods (which say "exact")."""
    v, mean, cov, z = _small_bank(n=60)
    method = _method(v, mean, cov, ci=ci)
    rng = np.random.default_rng(1)
    for _ in range(3):
        prop = method.propose(5, rng)
        method.update(prop.items, z[prop.items])
    est = method.result()
    assert est.validity == "asymptotic" and est.to_dict()["validity"] == "asymptotic"
    assert est.anytime_valid == (ci == "anytime")
    exact = make_method("uniform", confidence=0.9).start(BankSpec(60))
    prop = exact.propose(10, rng)
    exact.update(prop.items, z[prop.items])
    assert exact.result().validity == "exact"
