"""The boundary tests that certify ε-listings (``estimators/bank/epsilon_tests.py``): a true null is rejected with
probability at most its level, whenever the tests are looked at (Monte Carlo over many finite lists whose mean
sits exactly on the boundary, the least favourable case), and a fixed-n test read at every look — the same data,
the same check — is caught. Through the ranking: state round trip, and fewer cells than certifying from the
pair intervals on the same orders."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from certeval.estimators.bank.epsilon_tests import EpsilonTests
from certeval.estimators.bank.ranking import BankRanking
from certeval.storage import dumps

EPS, DELTA, N, K, LOOK = 0.1, 0.1, 120, 3000, 10


def _boundary_lists(seed: int, mean: float) -> np.ndarray:
    """K finite lists of N values in {0, 1/2, 1} whose mean is exactly ``mean`` (multiple of 1/(2N)), each in
    its own uniformly random order: ``(K, N)``. Ties (1/2) vary from list to list, so the variances differ."""
    rng = np.random.default_rng(seed)
    total = int(round(mean * 2 * N))  # sum of 2z over the list
    out = np.empty((K, N))
    for k in range(K):
        halves = int(rng.integers(0, N // 2)) * 2 if total % 2 == 0 else int(rng.integers(0, N // 2)) * 2 + 1
        halves = min(halves, total, 2 * N - total)
        ones = (total - halves) // 2
        zeros = N - ones - halves
        row = np.r_[np.zeros(zeros), np.full(halves, 0.5), np.ones(ones)]
        assert row.size == N and row.sum() * 2 == total
        out[k] = rng.permutation(row)
    return out


def _bound() -> float:
    return stats.binom.ppf(0.999, K, DELTA)  # a calibrated level-DELTA test gives more at 1 in 1,000


def _tests_on(z: np.ndarray) -> EpsilonTests:
    tests = EpsilonTests(K, N, DELTA, EPS)
    w = np.full(N, 1.0 / N)
    for start in range(0, N - 1, LOOK):  # every look (the tests themselves check after every item)
        stop = min(start + LOOK, N - 1)  # the last item would make the verdict certain
        tests.absorb(z[:, start:stop], w[start:stop])
    return tests


def _peeked_fixed_n_rejections(z: np.ndarray, side: str) -> int:
    """The control: the one-sided fixed-n normal test (finite-population corrected) at level DELTA, read at every
    look — not anytime-valid."""
    m0 = (1 - EPS) / 2 if side == "a" else (1 + EPS) / 2
    crit = stats.norm.ppf(1 - DELTA)
    hit = np.zeros(K, dtype=bool)
    for n in range(LOOK, N, LOOK):
        mean, sd = z[:, :n].mean(axis=1), np.maximum(z[:, :n].std(axis=1, ddof=1), 1e-9)
        t = (mean - m0) / (sd / np.sqrt(n) * np.sqrt((N - n) / (N - 1)))
        hit |= (t > crit) if side == "a" else (t < -crit)
    return int(hit.sum())


@pytest.mark.parametrize("side", ["a", "b"])
def test_a_true_boundary_null_is_rejected_at_most_delta_with_peeking_and_the_peeked_fixed_n_test_is_caught(side):
    mean = (1 - EPS) / 2 if side == "a" else (1 + EPS) / 2  # exactly on the boundary: the null holds
    z = _boundary_lists(7 if side == "a" else 8, mean)
    tests = _tests_on(z)
    wrong = int((tests.rejected_a if side == "a" else tests.rejected_b).sum())
    bad = _peeked_fixed_n_rejections(z, side)
    assert wrong <= _bound() < bad, (wrong, _bound(), bad)


def test_the_tests_have_power_away_from_the_boundary_and_never_certify_both_wrongly():
    z = _boundary_lists(9, 0.5 + 0.04)  # Δ = 0.08: "a above b" holds, "b above a" holds too (|Δ| < ε)
    tests = _tests_on(z)
    assert tests.rejected_a.mean() > 0.5  # both listings are true here: certifying either is correct
    # a clear gap: Δ = 0.4 is certified for a by the data, for b never (H_B: Δ >= ε is true only when Δ >= 0.1)
    z = _boundary_lists(10, 0.7)
    tests = _tests_on(z)
    assert tests.rejected_a.all() and not tests.rejected_b.any()


def _board(seed: int, m: int = 12, n: int = 400) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = 0.4 + 0.02 * np.arange(m)
    return (rng.random((m, n)) < p[:, None]).astype(float)


def _run(x: np.ndarray, method: str, order: np.ndarray, save_at: int | None = None) -> BankRanking:
    m, n = x.shape
    r = BankRanking([f"m{k}" for k in range(m)], epsilon=0.05, epsilon_method=method).start(np.full(n, 1 / n))
    for start in range(0, n, 25):
        if save_at is not None and start == save_at:  # through JSON, as a run's state file
            r = BankRanking.from_state(json.loads(dumps(r.state())))
        it = order[start:start + 25]
        r.update(it, np.where(r.model_open[:, None], x[:, it], np.nan))
        if not r.model_open.any():
            break
    return r


def test_state_round_trip_resumes_the_tests_exactly():
    x = _board(3)
    order = np.random.default_rng(4).permutation(x.shape[1])
    whole, resumed = _run(x, "tests", order), _run(x, "tests", order, save_at=100)
    assert np.array_equal(whole.verdict, resumed.verdict) and np.array_equal(whole.model_used, resumed.model_used)
    assert whole.result().tie_groups == resumed.result().tie_groups
    assert "one-sided" in whole.guarantee() and "one-sided" not in _run(x, "intervals", order).guarantee()


def test_tests_use_fewer_cells_than_certifying_from_the_intervals_on_the_same_orders():
    cells = {"tests": 0.0, "intervals": 0.0}
    for seed in range(3):
        x = _board(seed)
        order = np.random.default_rng(100 + seed).permutation(x.shape[1])
        for method in cells:
            cells[method] += _run(x, method, order).model_used.mean()
    assert cells["tests"] < cells["intervals"], cells


def test_bad_arguments():
    with pytest.raises(Exception, match="epsilon"):
        EpsilonTests(2, 10, 0.1, 0.0)
    with pytest.raises(Exception, match="epsilon_method"):
        BankRanking(["a", "b"], epsilon=0.1, epsilon_method="grid")


def test_settled_pairs_keep_testing_so_tie_groups_stay_as_fine_as_the_interval_rule():
    """A pair settled by one test while both its models are still sampled keeps testing (no extra cells): without
    that, one-sided certifications against the mean order merged vlm_hallusionbench's 170 models (ε = 0.1) into
    about 80 tie groups, where the interval rule gives about 166."""

    from certeval.backtests.comparative import load_matrix
    from certeval.estimators.bank.wor_streams import weighted_order

    matrix, models, spec = load_matrix("bundled:vlm_hallusionbench")
    w, x = spec.weights(), np.asarray(matrix, dtype=float)
    order = weighted_order(w, np.random.default_rng(0))
    out = {}
    for method in ("tests", "intervals"):
        r = BankRanking(models, epsilon=0.1, epsilon_method=method).start(w)
        for start in range(0, x.shape[1], 50):
            it = order[start:start + 50]
            r.update(it, x[:, it])
            if not r.model_open.any():
                break
        out[method] = (len(r.result().tie_groups), r.model_used.mean())
    assert out["tests"][0] >= out["intervals"][0] and out["tests"][1] < out["intervals"][1], out


def _controlled_tests_on(z: np.ndarray, a: np.ndarray, peek: bool) -> EpsilonTests:
    """The tests with a control variate: predictions ``a`` fixed before the run, the predicted rest from them
    (``peek``: broken on purpose — each drawn item's 'prediction' is its own value, the rest still from ``a``)."""
    tests = EpsilonTests(K, N, DELTA, EPS)
    w = np.full(N, 1.0 / N)
    for start in range(0, N - 1, LOOK):
        stop = min(start + LOOK, N - 1)
        tests.rest = a[:, start:] @ w[start:]  # Σ w·a over the undrawn items, set before the look
        tests.absorb(z[:, start:stop], w[start:stop], z[:, start:stop] if peek else a[:, start:stop])
    return tests


@pytest.mark.parametrize("side", ["a", "b"])
def test_with_a_control_variate_a_true_boundary_null_is_rejected_at_most_delta_and_peeking_is_caught(side):
    """rank --history's tests: predictions that track the values (fixed before the run) keep the level and
    reject more true boundaries of their own kind than without them never; predictions that peek are caught."""
    mean = (1 - EPS) / 2 if side == "a" else (1 + EPS) / 2
    z = _boundary_lists(17 if side == "a" else 18, mean)
    rng = np.random.default_rng(5)
    a = np.clip(z + rng.normal(0.0, 0.3, size=z.shape), 0.0, 1.0)  # informative, fixed before any draw
    flag = "rejected_a" if side == "a" else "rejected_b"
    wrong = int(getattr(_controlled_tests_on(z, a, peek=False), flag).sum())
    broken = int(getattr(_controlled_tests_on(z, a, peek=True), flag).sum())
    assert wrong <= _bound() < broken, (wrong, _bound(), broken)


def test_a_control_variate_that_predicts_well_certifies_with_fewer_items():
    """Two equal models (Δ = 0, both listings true): good predictions reject Δ <= -ε after fewer items than none
    (the drift against the boundary is small, so the variance the predictions remove decides)."""
    z = _boundary_lists(19, 0.5)[:300]
    rng = np.random.default_rng(6)
    a = np.clip(z + rng.normal(0.0, 0.15, size=z.shape), 0.0, 1.0)
    w = np.full(N, 1.0 / N)

    def first_rejection(pred: np.ndarray | None) -> float:
        tests, when = EpsilonTests(len(z), N, DELTA, EPS), np.full(len(z), N)
        for start in range(0, N, LOOK):
            stop = min(start + LOOK, N)
            if pred is not None:
                tests.rest = pred[:, start:] @ w[start:]
            tests.absorb(z[:, start:stop], w[start:stop], None if pred is None else pred[:, start:stop])
            when = np.where(tests.rejected_a & (when == N), stop, when)
        return float(when.mean())

    assert first_rejection(a) < 0.8 * first_rejection(None)
