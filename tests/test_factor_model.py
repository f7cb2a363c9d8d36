"""Logistic factor model (002 §3.1): loss/gradient, fit, 1-SE cross-validation, npz persistence, embeddings."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit

from certeval.backtests.factor_files import load_factor_model, save_factor_model
from certeval.errors import InputError
from certeval.estimators.faq.factor_model import (
    FactorModel,
    factor_loss_and_grad,
    factor_prior,
    heldout_log_loss,
    item_embeddings,
    matrix_from_long,
    one_se_choice,
)


def _low_rank_bank(m=40, n=60, k=2, seed=0):
    rng = np.random.default_rng(seed)
    u = rng.normal(0.3, 1.0, (m, k))
    v = rng.normal(0.0, 1.2, (n, k))
    prob = expit(u @ v.T)
    return (rng.random((m, n)) < prob).astype(float), prob


def test_loss_matches_direct_bernoulli_likelihood_and_gradient_matches_finite_differences():
    rng = np.random.default_rng(1)
    u, v = rng.normal(size=(5, 3)), rng.normal(size=(7, 3))
    z = rng.random((5, 7))  # fractional targets are allowed
    mask = rng.random((5, 7)) < 0.7
    lam = 0.7
    loss, gu, gv = factor_loss_and_grad(u, v, z, mask, lam)
    # independent reference: log-likelihood written with logs of σ, masked by explicit loop
    ref = 0.0
    for i in range(5):
        for j in range(7):
            if mask[i, j]:
                p = expit(u[i] @ v[j])
                ref -= z[i, j] * np.log(p) + (1 - z[i, j]) * np.log1p(-p)
    ref += 0.5 * lam * (np.sum(u**2) + np.sum(v**2))
    assert loss == pytest.approx(ref, rel=1e-12)
    eps = 1e-6
    for arr, grad in ((u, gu), (v, gv)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            old = arr[idx]
            arr[idx] = old + eps
            up = factor_loss_and_grad(u, v, z, mask, lam)[0]
            arr[idx] = old - eps
            down = factor_loss_and_grad(u, v, z, mask, lam)[0]
            arr[idx] = old
            num[idx] = (up - down) / (2 * eps)
        assert np.max(np.abs(num - grad)) < 1e-6
        # a wrong gradient (penalty forgotten) is caught by the same check
        assert np.max(np.abs(num - (grad - lam * arr))) > 1e-3


def test_fit_is_deterministic_given_rng_and_beats_a_constant_predictor_out_of_sample():
    z, _ = _low_rank_bank()
    rng = np.random.default_rng(5)
    held = rng.random(z.shape) < 0.2
    train = np.where(held, np.nan, z)
    a = FactorModel(n_factors=2, penalty=1.0).fit(train, rng=np.random.default_rng(3))
    b = FactorModel(n_factors=2, penalty=1.0).fit(train, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(a.item_factors_, b.item_factors_)
    rows, cols = np.nonzero(held)
    fitted = heldout_log_loss(a.model_factors_, a.item_factors_, rows, cols, z[rows, cols])
    pbar = np.nanmean(train)
    constant = float(np.mean(-(z[rows, cols] * np.log(pbar) + (1 - z[rows, cols]) * np.log(1 - pbar))))
    assert fitted < constant - 0.05


def test_one_se_rule_picks_the_simplest_setting_within_one_standard_error():
    ks, lams = (2, 4, 8), (0.3, 1.0, 3.0)
    mean = np.array([[0.60, 0.59, 0.58], [0.55, 0.54, 0.56], [0.50, 0.53, 0.505]])
    se = np.full((3, 3), 0.01)
    # best 0.50 at (8, 0.3); threshold 0.51; within: (8, 0.3) 0.50 and (8, 3.0) 0.505 -> smallest K, largest λ
    assert one_se_choice(ks, lams, mean, se) == (8, 3.0)
    se_big = np.full((3, 3), 0.05)  # threshold 0.55 admits (4, 1.0) 0.54 and (4, 0.3) 0.55: K=4, λ=1
    assert one_se_choice(ks, lams, mean, se_big) == (4, 1.0)


def test_cross_validation_runs_on_a_small_grid_and_records_its_table():
    z, _ = _low_rank_bank(m=30, n=40, k=2)
    fm = FactorModel(factor_grid=(1, 2), penalty_grid=(1.0, 3.0), n_folds=2).fit(z, rng=np.random.default_rng(0))
    assert fm.cv_ is not None and fm.cv_.mean_loss.shape == (2, 2)
    assert (fm.n_factors_, fm.penalty_) in {(k, lam) for k in (1, 2) for lam in (1.0, 3.0)}
    assert fm.item_factors_.shape == (40, fm.n_factors_)


def test_npz_round_trip_without_pickle_and_item_embeddings(tmp_path):
    z, _ = _low_rank_bank(m=10, n=12)
    fm = FactorModel(n_factors=2, penalty=1.0).fit(z, rng=np.random.default_rng(0))
    ids = [f"item{j}" for j in range(12)]
    path = tmp_path / "factors.npz"
    save_factor_model(path, fm, ids, [f"m{i}" for i in range(10)])
    with np.load(path, allow_pickle=False) as data:  # readable with pickling disabled
        assert set(data.files) >= {"model_factors", "item_factors", "item_ids"}
    back, items, models = load_factor_model(path)
    np.testing.assert_array_equal(back.item_factors_, fm.item_factors_)
    assert items == ids and models[0] == "m0"
    emb = item_embeddings(back.item_factors_, items, ["item3", "new", "item0"])
    np.testing.assert_array_equal(emb[0], fm.item_factors_[3])
    np.testing.assert_array_equal(emb[1], 0.0)
    assert emb.shape == (3, 2)
    with pytest.raises(InputError, match="shares no item"):
        item_embeddings(back.item_factors_, items, ["x", "y"])


def test_prior_and_bad_input():
    u = np.random.default_rng(0).normal(size=(50, 3))
    mean, cov = factor_prior(u)
    np.testing.assert_allclose(mean, u.mean(axis=0))
    np.testing.assert_allclose(cov, np.cov(u.T), atol=1e-5)
    with pytest.raises(InputError, match="at least 2"):
        factor_prior(u[:1])
    with pytest.raises(InputError, match="at least 2 models"):
        FactorModel(n_factors=2, penalty=1.0).fit(np.ones((1, 5)))
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        FactorModel(n_factors=2, penalty=1.0).fit(np.full((3, 4), 2.0))
    m = matrix_from_long(["a", "b", "a"], ["x", "y", "y"], [1.0, 0.0, 0.0], ["a", "b"], ["x", "y", "z"])
    np.testing.assert_array_equal(np.isnan(m), [[False, False, True], [True, False, True]])
