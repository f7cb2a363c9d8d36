"""The history prior and the ``history`` method: exact, anytime-valid whatever the history is.

Independent references: the prior's posterior mean against a numerical minimisation of the same
penalised least-squares objective (scipy); the method's capital process re-implemented one draw at a
time with brute-force sums over the undrawn items; Monte-Carlo coverage with peeking at every look on
Bernoulli banks (informative, useless and adversarial history) and on real recorded banks, where a
deliberately miscalibrated variant (predictions that see the drawn item's own score) must fail.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import replace

import numpy as np
import pytest
from scipy.optimize import minimize
from scipy.stats import binom

from certeval.errors import InputError
from certeval.estimators import BankSpec, make_method
from certeval.estimators.groups import GroupRequest, HistoryPairGroup
from certeval.estimators.history.prior import HistoryPrior, fit_history_prior
from certeval.estimators.single.history import DrawLaw, HistoryMethod

DELTA = 0.1
REPS = 30
# the coverage checks' CS grid: a quarter of the default 4097 points (measured 2.5 times less work per run);
# intervals grow by at most one grid step (1/1024), far below their widths here; the leaky control still misses 30/30
GRID = 1025


def logistic_population(n_models: int, n_items: int, rng: np.random.Generator, rank: int = 2):
    """Scores of a population of models from a logistic factor model: P(x=1) = σ(u_mᵀ v_j + c_j)."""
    v = rng.normal(size=(n_items, rank))
    c = rng.normal(scale=1.5, size=n_items)
    u = rng.normal(size=(n_models, rank))
    p = 1.0 / (1.0 + np.exp(-(u @ v.T + c)))
    return (rng.random(p.shape) < p).astype(float)


# -- the prior ---------------------------------------------------------------------------------------


def test_posterior_mean_equals_the_penalised_least_squares_minimiser():
    rng = np.random.default_rng(0)
    hist = logistic_population(30, 80, rng)
    hist[rng.random(hist.shape) < 0.2] = np.nan  # missing cells are normal
    prior = fit_history_prior(hist, n_factors=3)
    items = rng.choice(80, size=25, replace=False)
    x = (rng.random(25) < 0.6).astype(float)
    phi = np.column_stack([np.ones(80), prior.factors])
    prec = 1.0 / np.concatenate([[prior.offset_var], prior.loading_var])

    def objective(theta):
        r = x - prior.item_mean[items] - phi[items] @ theta
        return r @ r / prior.noise_var + theta @ (prec * theta)

    theta = minimize(objective, np.zeros(phi.shape[1]), method="BFGS", options={"gtol": 1e-10}).x
    expected = np.clip(prior.item_mean + phi @ theta, 0, 1)
    np.testing.assert_allclose(prior.predict(items, x), expected, atol=1e-5)
    # no scores yet: the history's (shrunk) item means
    np.testing.assert_allclose(prior.predict(np.zeros(0, int), np.zeros(0)), np.clip(prior.item_mean, 0, 1))


def test_prior_learns_the_new_model_from_its_scores():
    rng = np.random.default_rng(1)
    scores = logistic_population(201, 400, rng)
    hist, new = scores[:200], scores[200]
    prior = fit_history_prior(hist, n_factors=4)
    seen = rng.choice(400, size=100, replace=False)
    rest = np.setdiff1d(np.arange(400), seen)
    a = prior.predict(seen, new[seen])
    mse_fit = np.mean((new[rest] - a[rest]) ** 2)
    mse_mean = np.mean((new[rest] - new[seen].mean()) ** 2)
    assert mse_fit < 0.8 * mse_mean, (mse_fit, mse_mean)


def test_prior_validation_and_state_round_trip():
    with pytest.raises(InputError, match="no models"):
        fit_history_prior(np.zeros((0, 5)))
    with pytest.raises(InputError, match="shares no item"):
        fit_history_prior(np.full((3, 5), np.nan))
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        fit_history_prior(np.array([[0.5, 2.0]]))
    with pytest.raises(InputError, match="n_factors"):
        fit_history_prior(np.ones((3, 4)) * 0.5, n_factors=-1)
    hist = np.array([[1.0, 0.0, np.nan], [1.0, 1.0, np.nan], [0.0, 1.0, np.nan]])
    prior = fit_history_prior(hist, models=("a", "b", "c"), sources=("x.parquet",))
    assert prior.items_matched == 2 and prior.n_models == 3
    grand = np.nanmean(hist)
    assert prior.item_mean[2] == pytest.approx(grand)  # an item no history model scored: the grand mean
    again = HistoryPrior.from_state(prior.to_state())
    np.testing.assert_array_equal(again.factors, prior.factors)
    assert again.describe() == prior.describe()
    with pytest.raises(InputError, match="history must describe"):
        BankSpec(4, history=prior)


# -- the method's martingale, re-implemented one draw at a time --------------------------------------


def _reference_capital(spec, prior, log, preds_per_batch, scores, grid, delta, mix_final, floor, c=0.8, warmup=50,
                       halfwidth=None, laws=None):
    """Brute-force log capital K⁺, K⁻ over ``grid`` for the estimand's CS, one logged draw at a time.

    ``laws`` says per batch which draw law the method chose ("active": Neyman mixed with ∝ w; "weight": ∝ w);
    the choice is the method's (a predictable one), the capital given it is what is re-implemented here."""
    w = spec.weights()
    n = spec.n_items
    log_bet = 2.0 * math.log(2.0 / delta)
    in_pop = np.ones(n, dtype=bool)
    known = 0.0
    kplus, kminus = np.zeros(grid.size), np.zeros(grid.size)
    resid_sq = pred_var = 0.0
    n_draws = 0
    t = 0
    for b, (batch_items, a) in enumerate(zip(log, preds_per_batch)):
        # what was fixed at the batch's draw time: predictions, sampling scores, calibration
        sig2 = np.maximum(a * (1 - a), floor)
        mean_pred = pred_var / n_draws if n_draws else 0.25
        kappa = (5.0 * mean_pred + resid_sq) / (5.0 * mean_pred + pred_var)
        r0 = np.flatnonzero(in_pop)
        mix = mix_final + (1 - mix_final) * warmup / (warmup + n_draws)  # all earlier draws are scored here
        s_all = np.zeros(n)
        sig_bar = (w[r0] @ np.sqrt(sig2[r0])) / w[r0].sum()
        s_all[r0] = w[r0] * ((1 - mix) * np.sqrt(sig2[r0]) / sig_bar + mix)
        if laws is not None and laws[b] == "weight":
            s_all[r0] = w[r0]
        m_a = max(w[j] * a[j] / s_all[j] for j in r0)
        m_b = max(w[j] * (1 - a[j]) / s_all[j] for j in r0)
        v_sum = sum(w[j] ** 2 * sig2[j] * kappa / s_all[j] for j in r0)
        for j in batch_items:
            r = np.flatnonzero(in_pop)
            u = w[r].sum()
            total = s_all[r].sum()
            pi = s_all[j] / total
            base = sum(w[i] * a[i] for i in r) / u
            y = base + w[j] / (u * pi) * (scores[j] - a[j])
            y_min, y_max = base - total / u * m_a, base + total / u * m_b
            var = total / u**2 * v_sum
            t += 1
            if halfwidth is None:  # WSR's all-times plug-in
                lam = math.sqrt(log_bet / (max(var, 1e-6) * t * math.log1p(t)))
            else:  # tuned to the goal: α ε / v with α = dν/dm = 1/u
                lam = halfwidth / u / max(var, 1e-6)
            nu = np.clip((grid - known) / u, y_min, y_max)
            with np.errstate(divide="ignore"):
                lp = np.minimum(lam, c / (nu - y_min))
                lm = np.minimum(lam, c / (y_max - nu))
            kplus += np.log1p(lp * (y - nu))
            kminus += np.log1p(-lm * (y - nu))
            known += w[j] * scores[j]
            in_pop[j] = False
            resid_sq += (scores[j] - a[j]) ** 2
            pred_var += max(a[j] * (1 - a[j]), floor)
            n_draws += 1
    return kplus, kminus


@pytest.mark.parametrize("halfwidth", [None, 0.1])
def test_capital_equals_a_draw_by_draw_reimplementation(halfwidth):
    rng = np.random.default_rng(3)
    pop = logistic_population(21, 36, rng)
    prior = fit_history_prior(pop[:20], n_factors=2)
    x = pop[20]
    spec = BankSpec(36, history=prior)
    method = HistoryMethod(confidence=0.9, grid_size=257, draw_law=DrawLaw(uniform_mix=0.3), bet_halfwidth=halfwidth).start(spec)
    log, preds = [], []
    for _ in range(4):
        preds.append(method.predictions().copy())
        prop = method.propose(6, rng)
        log.append(prop.items.copy())
        # scores arrive in a shuffled order: the martingale still takes them in draw order
        back = rng.permutation(prop.items.size)
        method.update(prop.items[back], x[prop.items][back])
    cs = method.cs_[0]
    w = spec.weights()
    laws = ["weight" if np.allclose(method.log_s_[b * 6:(b + 1) * 6], w[items]) else "active"
            for b, items in enumerate(log)]
    kplus, kminus = _reference_capital(spec, prior, log, preds, x, cs.grid, 0.1, 0.3, 0.01, halfwidth=halfwidth,
                                       laws=laws)
    live = np.flatnonzero(~cs.rejected)  # rejected candidates stop being updated
    np.testing.assert_allclose(cs.log_kplus[live], kplus[live], rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(cs.log_kminus[live], kminus[live], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("tuning, law", [({"bet_horizon": 1500}, "active"), ({"bet_halfwidth": 0.01}, "active"),
                                         ({"bet_horizon": 30}, "weight"), ({"bet_halfwidth": 0.2}, "weight")])
def test_draws_favour_spread_items_only_where_that_is_predicted_to_narrow_the_interval(tuning, law):
    """Half the items are predicted near-certain: Neyman draws halve their share. That lowers Y's variance but the
    importance weights widen its range, which the truncated bets pay for when they are large (a short horizon,
    a wide goal): there the draws stay ∝ weight; with small bets (a long horizon, a narrow goal) they go active."""
    rng = np.random.default_rng(0)
    n = 2000
    certain = np.arange(n) >= n // 2
    hist = (rng.random((20, n)) < np.where(certain, 0.99, 0.5)).astype(float)
    # trust_start=1: the first batch follows the history fully, so its predictions are the ones the law weighs
    method = HistoryMethod(draw_law=DrawLaw(warmup=0), trust_start=1.0, **tuning).start(
        BankSpec(n, history=fit_history_prior(hist, n_factors=2)))
    prop = method.propose(50, np.random.default_rng(1))
    probs = np.asarray(prop.probs)
    if law == "weight":  # successive sampling ∝ 1/N: draw i has probability 1/(N − i + 1)
        np.testing.assert_allclose(probs, 1.0 / (n - np.arange(50)))
    else:
        assert certain[prop.items].mean() < 0.35 and probs.max() > 1.2 / (n - 49)


def test_update_order_within_a_batch_does_not_matter():
    rng = np.random.default_rng(4)
    pop = logistic_population(31, 120, rng)
    spec = BankSpec(120, subsets=np.arange(120) % 3, subset_names=("a", "b", "c"),
                    history=fit_history_prior(pop[:30]))
    results = []
    for shuffle in (False, True):
        r = np.random.default_rng(9)
        method = HistoryMethod(confidence=0.9).start(spec)
        for _ in range(5):
            prop = method.propose(12, r)
            order = np.random.default_rng(1).permutation(12) if shuffle else np.arange(12)
            half = order[:5], order[5:]
            for part in half:  # in two pieces, out of draw order
                method.update(prop.items[part], pop[30][prop.items[part]])
        results.append(method.result())
    assert results[0] == results[1]


# -- validity ----------------------------------------------------------------------------------------


class LeakyHistory(HistoryMethod):
    """Deliberately invalid (not registered): the drawn item's prediction is its own true score."""

    name = "history-leaky-test-only"
    truth_row: np.ndarray

    def _log(self, items, a, s, totals, batch, *predictions):
        if batch >= 0:
            a = self.truth_row[items]
        super()._log(items, a, s, totals, batch, *predictions)


def _history_kind(kind: str, pop: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    hist = pop[:-1]
    if kind == "useless":
        return hist[:, rng.permutation(hist.shape[1])]
    if kind == "adversarial":  # the new model's own scores, flipped, as every history model
        return np.tile(1.0 - pop[-1], (5, 1))
    return hist


def miscoverage_history(kind: str, n_items: int, batch: int, horizon: int, seed: int, leaky: bool = False,
                        subsets: int = 1, reps: int = REPS, grid_size: int = GRID, **tuning) -> int:
    misses = 0
    for r in range(reps):
        rng = np.random.default_rng([seed, r])
        pop = logistic_population(41, n_items, rng)
        x = pop[-1]
        codes = np.arange(n_items) % subsets if subsets > 1 else None
        names = tuple(f"s{i}" for i in range(subsets)) if subsets > 1 else ()
        prior = fit_history_prior(_history_kind(kind, pop, rng), n_factors=3)
        if kind == "biased":  # confidently wrong: every prediction pushed towards 1
            prior = replace(prior, item_mean=np.clip(prior.item_mean + 0.4, 0, 1))
        spec = BankSpec(n_items, subsets=codes, subset_names=names, history=prior)
        truth = float(spec.weights() @ x)
        method = (LeakyHistory if leaky else HistoryMethod)(confidence=1 - DELTA, grid_size=grid_size, **tuning)
        if leaky:
            method.truth_row = x
        method.start(spec)
        while method.n_scored < horizon:
            prop = method.propose(batch, rng)
            method.update(prop.items, x[prop.items])
            est = method.result()
            if not (est.lower - 1e-12 <= truth <= est.upper + 1e-12):
                misses += 1
                break
    return misses


def tolerance(reps: int) -> int:
    return int(binom.ppf(0.999, reps, DELTA))


# bets: WSR's all-times plug-in, and tuned to a goal's half-width, to an item budget, or to the smaller of an
# unreachable goal's horizon and the budget (what `--goal halfwidth:0.001 --max-items 40` runs)
TUNINGS = {"plug-in": {}, "halfwidth": {"bet_halfwidth": 0.1}, "horizon": {"bet_horizon": 40},
           "goal+budget": {"bet_halfwidth": 0.001, "bet_horizon": 40}}


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@pytest.mark.parametrize("kind", ["informative", "useless", "adversarial", "biased"])
@pytest.mark.parametrize("n_items,subsets", [(60, 1), (600, 3)])
def test_miscoverage_with_peeking_whatever_the_history(kind, n_items, subsets, tuning):
    batch, horizon = (5, 60) if n_items == 60 else (20, 400)
    misses = miscoverage_history(kind, n_items, batch, horizon, zlib.crc32(f"{kind}-{n_items}-{tuning}".encode()),
                                 subsets=subsets, **TUNINGS[tuning])
    assert misses <= tolerance(REPS), f"history={kind}: missed in {misses}/{REPS} runs"


@pytest.mark.parametrize("tuning", ["plug-in", "halfwidth", "goal+budget"])
def test_leaky_predictions_are_caught_by_the_same_check(tuning):
    misses = miscoverage_history("biased", 600, 20, 400, seed=11, leaky=True, **TUNINGS[tuning])
    assert misses > tolerance(REPS), f"the leaky variant slipped through ({misses}/{REPS})"


@pytest.mark.parametrize("tuning", ["plug-in", "halfwidth"])
@pytest.mark.parametrize("dataset", ["helm_mmlu", "openllm_arc"])
def test_miscoverage_with_peeking_on_real_banks(dataset, tuning):
    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

    frame = load_scores(f"bundled:{dataset}")
    bank = bank_from_scores(frame)
    models = sorted(frame["model"].unique())
    matrix = score_matrix(frame, models, bank)
    rng = np.random.default_rng(zlib.crc32(f"{dataset}-{tuning}".encode()))
    misses = 0
    for _rep in range(REPS):
        order = rng.permutation(len(models))
        held = order[0]
        hist = matrix[order[1:][: max(2, len(models) // 2)]]
        spec = bank.spec(features=None)
        spec = replace(spec, history=fit_history_prior(hist))
        x = matrix[held]
        truth = float(spec.weights() @ x)
        method = HistoryMethod(confidence=1 - DELTA, grid_size=GRID, **TUNINGS[tuning]).start(spec)
        while not method.exhausted and method.n_scored < spec.n_items // 2:
            prop = method.propose(20, rng)
            method.update(prop.items, x[prop.items])
            est = method.result()
            if not (est.lower - 1e-12 <= truth <= est.upper + 1e-12):
                misses += 1
                break
    assert misses <= tolerance(REPS), f"{dataset}: missed in {misses}/{REPS} runs"


# -- exhaustion, state, errors -----------------------------------------------------------------------


def test_zero_width_at_the_exact_mean_when_exhausted_even_with_adversarial_history():
    rng = np.random.default_rng(5)
    pop = logistic_population(11, 50, rng)
    x = pop[-1]
    spec = BankSpec(50, subsets=np.arange(50) % 2, subset_names=("a", "b"),
                    history=fit_history_prior(np.tile(1 - x, (3, 1))))
    method = HistoryMethod(confidence=0.95).start(spec)
    while not method.exhausted:
        prop = method.propose(7, rng)
        method.update(prop.items, x[prop.items])
    est = method.result()
    truth = float(spec.weights() @ x)
    assert est.lower == pytest.approx(truth, abs=1e-12) and est.upper == pytest.approx(truth, abs=1e-12)
    assert est.mean == pytest.approx(truth, abs=1e-12)
    for sub in est.subsets:
        assert sub.upper - sub.lower == pytest.approx(0.0, abs=1e-12)


def test_state_round_trip_mid_run_continues_identically():
    rng = np.random.default_rng(6)
    pop = logistic_population(21, 90, rng)
    x = pop[-1]
    spec = BankSpec(90, subsets=np.arange(90) % 3, subset_names=("a", "b", "c"),
                    history=fit_history_prior(pop[:-1]))
    method = make_method("history", confidence=0.9).start(spec)
    r = np.random.default_rng(1)
    for _ in range(3):
        prop = method.propose(8, r)
        method.update(prop.items, x[prop.items])
    pending = method.propose(8, r)  # in flight when the state is written
    import json

    again = HistoryMethod.from_state(json.loads(json.dumps(method.state())))
    assert again.result() == method.result()
    for m in (method, again):
        m.update(pending.items, x[pending.items])
    assert again.result() == method.result()
    r1, r2 = np.random.default_rng(2), np.random.default_rng(2)
    p1, p2 = method.propose(8, r1), again.propose(8, r2)
    np.testing.assert_array_equal(p1.items, p2.items)
    np.testing.assert_allclose(p1.probs, p2.probs)


def test_bad_inputs_name_the_problem():
    with pytest.raises(InputError, match="needs history"):
        HistoryMethod().start(BankSpec(10))
    prior = fit_history_prior(np.full((3, 10), 0.5))
    with pytest.raises(InputError, match="target must be 'bank'"):
        HistoryMethod(target="distribution").start(BankSpec(10, history=prior))
    with pytest.raises(InputError, match="uniform_mix"):
        HistoryMethod(draw_law=DrawLaw(uniform_mix=0.0)).start(BankSpec(10, history=prior))
    method = HistoryMethod().start(BankSpec(10, history=prior))
    est = method.result()
    assert math.isnan(est.mean) and (est.lower, est.upper) == (0.0, 1.0)  # no data: no confident number


# -- the paired difference (compare --history) ---------------------------------------------------------


@pytest.mark.parametrize("kind", ["informative", "adversarial"])
def test_paired_difference_covers_with_peeking_on_the_shared_uniform_order(kind):
    from certeval.estimators.history.paired import PairDifferenceMethod, PairPrior, bank_comparison

    misses = 0
    for r in range(REPS):
        rng = np.random.default_rng([31, r, kind == "adversarial"])
        pop = logistic_population(42, 300, rng)
        xa, xb = pop[-1], pop[-2]
        if kind == "adversarial":  # each model's history predicts the other's scores
            pa, pb = fit_history_prior(np.tile(xb, (3, 1))), fit_history_prior(np.tile(xa, (3, 1)))
        else:
            pa = pb = fit_history_prior(pop[:-2], n_factors=3)
        spec = BankSpec(300, subsets=np.arange(300) % 3, subset_names=("a", "b", "c"), history=PairPrior(pa, pb))
        truth = float(spec.weights() @ (xa - xb))
        pair = PairDifferenceMethod(confidence=1 - DELTA, subset_intervals=False).start(spec)
        order = rng.permutation(300)
        for look, start in enumerate(range(0, 300, 25)):
            chunk = order[start:start + 25]
            pair.propose_shared_order(chunk)
            pair.update_pair(chunk, xa[chunk], xb[chunk])
            comp = bank_comparison(pair, "a", "b", 0.0, look + 1)
            if not (comp.lower - 1e-12 <= truth <= comp.upper + 1e-12):
                misses += 1
                break
        else:
            assert comp.exact and comp.lower == pytest.approx(truth, abs=1e-12) == comp.upper
    assert misses <= tolerance(REPS), f"history={kind}: paired difference missed in {misses}/{REPS} runs"


class LeakyTrustPairGroup(HistoryPairGroup):
    """Broken control: ρ measured after the pair absorbed the block, then used for the models' draws of it."""

    def _absorb(self, start, stop, block):
        pair, pos = self.estimator_, self.order_[start:stop]
        pair.propose_shared_order(pos)
        pair.update_pair(pos, block[0], block[1])
        self._share_trust()
        for method, x in zip(self.models_, block):
            method.propose_shared_order(pos)
            method.update(pos, x)


def _compare_history_controls(group_cls, xa, xb, spec, order, flip_block=None):
    """compare --history's draw-time control variates (pair, A, B) and its last ρ, block by block of 25."""
    request = GroupRequest("compare", ("a", "b"), history={"a": spec.history, "b": spec.history})
    group = group_cls(request).start(spec, order)
    for k, start in enumerate(range(0, order.size, 25)):
        pos = order[start:start + 25]
        block = np.vstack([xa[pos], xb[pos]])
        group.update(start, start + pos.size, 1.0 - block if k == flip_block else block)
    methods = [group.estimator_, *group.models_]
    return [m.log_a_.copy() for m in methods], group.estimator_.trust_override_


def test_compare_history_shares_one_predictable_trust():
    """compare --history: the pair and both models use one ρ, measured before each block, so (1) the pair's
    control variate is (a_A − a_B + 1)/2 at every draw (the models' means differ by the pair's difference) and
    (2) a block's draw-time control variates do not move when that block's scores change; the broken control
    (ρ measured after the pair saw the block) is caught by the same check."""
    rng = np.random.default_rng(5)
    pop = logistic_population(30, 200, rng)
    spec = BankSpec(200, history=fit_history_prior(pop[:-2], n_factors=2))
    order = rng.permutation(200)
    flip, seen = 4, 25 * 5  # the draws up to and including the flipped block's
    (pair, a, b), rho = _compare_history_controls(HistoryPairGroup, pop[-1], pop[-2], spec, order)
    assert pair == pytest.approx((a - b + 1.0) / 2.0, abs=1e-12)
    assert 0.0 < rho < 1.0 and rho != 0.5  # measured, not the starting value, and not clipped
    flipped, _ = _compare_history_controls(HistoryPairGroup, pop[-1], pop[-2], spec, order, flip_block=flip)
    for before, after in zip((pair, a, b), flipped):
        np.testing.assert_array_equal(before[:seen], after[:seen])
    (_, la, _), _ = _compare_history_controls(LeakyTrustPairGroup, pop[-1], pop[-2], spec, order)
    (_, la_flipped, _), _ = _compare_history_controls(LeakyTrustPairGroup, pop[-1], pop[-2], spec, order,
                                                      flip_block=flip)
    assert not np.array_equal(la[:seen], la_flipped[:seen])
