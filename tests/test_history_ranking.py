"""rank --history vectorised over the pairs (estimators/history/ranking.py, wor_streams.ControlledStreams):
coverage with peeking at every look, family-wise over the pairs, and a broken control the same check catches;
exact at exhaustion; no model cap; ε-statements with history through the group estimator."""

from __future__ import annotations

import numpy as np
import pytest

from certeval.errors import InputError
from certeval.estimators.bank.ranking import BankRanking
from certeval.estimators.bank.wor_streams import ControlledBettingStreams, ControlledWorStreams, weighted_order
from certeval.estimators.history.prior import fit_history_prior
from certeval.estimators.history.ranking import HistoryRanking
from certeval.estimators.protocol import BankSpec


def _factor_bank(rng, models: int, items: int, factors: int = 3) -> np.ndarray:
    """Binary scores from a logistic factor model: history that really predicts."""
    u, v = rng.normal(size=(models, factors)), rng.normal(size=(items, factors))
    ability, ease = rng.normal(0.0, 0.7, size=models), rng.normal(0.0, 1.0, size=items)
    p = 1.0 / (1.0 + np.exp(-(ability[:, None] + ease[None, :] + u @ v.T)))
    return (rng.random(p.shape) < p).astype(float)


def _stream_misses(cls, rng, *, peek: bool, streams: int = 300, items: int = 60, delta: float = 0.2,
                   orders: int = 4) -> float:
    """Fraction of (stream, order) runs whose interval misses its exact weighted mean at some look."""
    misses = runs = 0
    w = np.full(items, 1.0 / items)
    for _ in range(orders):
        x = (rng.random((streams, items)) < rng.random((streams, 1))).astype(float) * 0.5 + 0.5 * (
            rng.random((streams, items)) < 0.5)  # values in {0, 0.5, 1}, as a pair's (x_a - x_b + 1)/2
        a = np.clip(0.5 + rng.normal(0, 0.2, size=x.shape), 0, 1)  # fixed before the run: predictable
        truth = x @ w
        s = cls(streams, items, delta)
        order = rng.permutation(items)
        missed = np.zeros(streams, dtype=bool)
        for lo in range(0, items - 1, 5):
            it = order[lo:lo + 5]
            s.rest = (a * np.where(np.isin(np.arange(items), order[:lo]), 0.0, w)).sum(axis=1)
            pred = x[:, it] if peek else a[:, it]  # broken: the 'prediction' is the item's own score
            s.absorb(x[:, it], w[it], pred)
            _, lower, upper = s.bounds()
            missed |= (truth < lower - 1e-9) | (truth > upper + 1e-9)
        misses += int(missed.sum())
        runs += streams
    return misses / runs


@pytest.mark.parametrize("cls", [ControlledBettingStreams, ControlledWorStreams])
def test_controlled_streams_cover_at_every_look_and_a_peeking_prediction_is_caught(cls):
    rng = np.random.default_rng(11)
    delta = 0.2
    ok = _stream_misses(cls, rng, peek=False, delta=delta)
    broken = _stream_misses(cls, rng, peek=True, delta=delta)
    runs = 1200
    assert ok <= delta + 3 * np.sqrt(delta * (1 - delta) / runs), ok
    assert broken > delta + 3 * np.sqrt(delta * (1 - delta) / runs), broken  # the same check catches it


def _ranking_misses(rng, reps: int, alpha: float, *, models: int = 5, items: int = 120, looks: int = 10,
                    peek: bool = False) -> float:
    """Family-wise: fraction of reps in which some pair's interval missed its exact difference at some look
    (``peek``: broken on purpose, each look's predictions are its own scores)."""
    bad = 0
    for _ in range(reps):
        x = _factor_bank(rng, 20 + models, items)
        prior = fit_history_prior(x[:20])
        ranked = x[20:]
        spec = BankSpec(n_items=items)
        rank = HistoryRanking([f"m{k}" for k in range(models)], [prior] * models, spec, alpha=alpha)
        rank.model_open[:] = True
        delta = (ranked @ spec.weights())[rank.pa] - (ranked @ spec.weights())[rank.pb]
        order = weighted_order(spec.weights(), rng)
        missed = False
        for lo in range(0, items, looks):
            it = order[lo:lo + looks]
            if peek:  # the look's own scores as its controls, no difference predicted elsewhere
                rank.control[:] = 0.5
                rank.control[:, it] = ranked[:, it]
            rank.update(it, ranked[:, it])
            missed |= bool(((rank.lower > delta + 1e-9) | (rank.upper < delta - 1e-9)).any())
            if not rank.model_open.any():
                break
        bad += missed
    return bad / reps


def test_history_ranking_family_wise_coverage_with_peeking():
    rng = np.random.default_rng(5)
    alpha, reps = 0.1, 60
    rate = _ranking_misses(rng, reps, alpha)
    broken = _ranking_misses(rng, reps, alpha, peek=True)
    limit = alpha + 3 * np.sqrt(alpha * (1 - alpha) / reps)
    assert rate <= limit < broken, (rate, broken)  # the same check catches predictions that peek


def test_history_ranking_is_exact_at_exhaustion_and_has_no_model_cap():
    rng = np.random.default_rng(2)
    items, models = 80, 40  # above the former 30-model cap
    x = _factor_bank(rng, 10 + models, items)
    prior = fit_history_prior(x[:10])
    spec = BankSpec(n_items=items)
    rank = HistoryRanking([f"m{k}" for k in range(models)], [prior] * models, spec, alpha=0.05, margin=0.0)
    rank.update(np.arange(items), x[10:])
    mu = x[10:].mean(axis=1)
    np.testing.assert_allclose(rank.diff, mu[rank.pa] - mu[rank.pb], atol=1e-9)
    np.testing.assert_allclose(rank.lower, rank.upper, atol=1e-9)
    res = rank.result()
    assert len(res.models) == models and "history prediction" in res.guarantee
    with pytest.raises(InputError):
        rank.update(np.arange(1), x[10:, :1])  # the shared order never repeats an item


def test_history_ranking_epsilon_statements_and_the_same_order_as_without_history():
    rng = np.random.default_rng(3)
    items, models = 150, 6
    x = _factor_bank(rng, 20 + models, items)
    spec = BankSpec(n_items=items)
    names = [f"m{k}" for k in range(models)]
    hist = HistoryRanking(names, [fit_history_prior(x[:20])] * models, spec, alpha=0.05, epsilon=0.1)
    plain = BankRanking(names, alpha=0.05, epsilon=0.1).start(spec.weights())
    order = weighted_order(spec.weights(), rng)
    for lo in range(0, items, 25):
        for r in (hist, plain):
            if r.model_open.any():
                r.update(order[lo:lo + 25], x[20:, order[lo:lo + 25]])
    res = hist.result()
    assert res.epsilon == 0.1 and "epsilon-statements" in res.guarantee
    mu = x[20:].mean(axis=1)
    # every listing certified: a higher group's models are at least the lower groups' minus epsilon
    for g, group in enumerate(res.tie_groups):
        for lower_group in res.tie_groups[g + 1:]:
            for a in group:
                for b in lower_group:
                    assert mu[names.index(a)] >= mu[names.index(b)] - 0.1 - 1e-9


def test_group_estimator_builds_rank_history_with_epsilon():
    from certeval.estimators.groups import GroupRequest, make_group

    rng = np.random.default_rng(4)
    x = _factor_bank(rng, 12, 40)
    prior = fit_history_prior(x[:10])
    req = GroupRequest(kind="rank", labels=("a", "b"), target="bank", epsilon=0.1, history={"a": prior, "b": prior})
    group = make_group(req).start(BankSpec(n_items=40), np.arange(40))
    assert isinstance(group.estimator_, HistoryRanking) and group.estimator_.epsilon == 0.1


def test_with_epsilon_the_reported_intervals_never_change_a_decision():
    """With ε the boundary tests decide; the reported pair intervals are the O(1) empirical-Bernstein CSs. The same
    run with the betting CSs (the construction without ε) reports narrower intervals and decides exactly the same."""
    from certeval.estimators.bank.wor_streams import make_controlled_streams

    rng = np.random.default_rng(8)
    items, models = 240, 8
    x = _factor_bank(rng, 20 + models, items)
    spec = BankSpec(n_items=items)
    names = [f"m{k}" for k in range(models)]
    prior = fit_history_prior(x[:20])
    order = weighted_order(spec.weights(), rng)
    runs = []
    for betting in (False, True):
        rank = HistoryRanking(names, [prior] * models, spec, alpha=0.05, epsilon=0.05)
        assert isinstance(rank.pairs, ControlledWorStreams)
        if betting:
            p = len(rank.pa)
            rank.pairs = make_controlled_streams(p, items, rank.alpha / p)
            assert isinstance(rank.pairs, ControlledBettingStreams)
        for lo in range(0, items, 20):
            if rank.model_open.any():
                rank.update(order[lo:lo + 20], x[20:, order[lo:lo + 20]])
        runs.append(rank)
    eb, bet = runs
    assert (eb.verdict == bet.verdict).all() and (eb.model_used == bet.model_used).all()
    assert eb.result().tie_groups == bet.result().tie_groups
    assert 0 < eb.model_used.min() < items  # models left early: the tests decided before exhaustion
    assert np.mean(bet.upper - bet.lower) < np.mean(eb.upper - eb.lower)


def test_each_models_interval_learns_from_its_prediction_and_covers():
    """rank --history's per-model intervals (reported beside the ranking) are certify --history-like controlled CSs:
    on factor-model boards they cover the exact means at every look and are narrower than the plain ranking's."""
    rng = np.random.default_rng(12)
    items, models, alpha = 300, 6, 0.2
    narrower = []
    misses = 0
    for _rep in range(20):
        x = _factor_bank(rng, 30 + models, items)
        spec = BankSpec(n_items=items)
        names = [f"m{k}" for k in range(models)]
        hist = HistoryRanking(names, [fit_history_prior(x[:30])] * models, spec, alpha=alpha, margin=0.0)
        plain = BankRanking(names, alpha=alpha, margin=0.0).start(spec.weights())
        order = weighted_order(spec.weights(), rng)
        exact = x[30:].mean(axis=1)
        missed = False
        for lo in range(0, 150, 25):  # half the bank: no model is exact yet
            for r in (hist, plain):
                r.update(order[lo:lo + 25], x[30:, order[lo:lo + 25]])
            missed |= bool(((hist.model_lower > exact + 1e-9) | (hist.model_upper < exact - 1e-9)).any())
        misses += missed
        narrower.append(np.mean(hist.model_upper - hist.model_lower) / np.mean(plain.model_upper - plain.model_lower))
    # the controlled streams' own coverage check, with a broken control: test_controlled_streams_cover_at_every_look_*
    from scipy.stats import binom

    assert misses <= binom.ppf(0.999, 20, alpha) and np.mean(narrower) < 0.95, (misses, narrower)


class _TrustingRanking(HistoryRanking):
    """The weighting switched off (broken on purpose for the cost check): the history is followed fully."""

    def _measure_trust(self, live, items, y):
        self.trust = 1.0


def _rank_cells(rng, reps: int, *, models: int = 6, items: int = 300, look: int = 30) -> dict[str, list[float]]:
    """Fraction of cells per rep of rank --history (ε = 0.1) with informative history, with it item-permuted, with it
    permuted and trusted fully, and of the plain all-pairs ranking, all on the same order; and the final trusts."""
    out: dict[str, list[float]] = {k: [] for k in ("history", "permuted", "trusting", "plain", "trust_h", "trust_p")}
    names = [f"m{k}" for k in range(models)]
    spec = BankSpec(n_items=items)
    for r in range(reps):
        x = _factor_bank(rng, 30 + models, items)
        prior = fit_history_prior(x[:30])
        # each model's own shuffle of the items: its predicted differences are noise (one shared shuffle would cancel
        # in every pair's difference)
        permuted = [prior.permuted(np.random.default_rng([1, r, k])) for k in range(models)]
        order = weighted_order(spec.weights(), rng)
        runs = {"history": HistoryRanking(names, [prior] * models, spec, alpha=0.05, epsilon=0.1),
                "permuted": HistoryRanking(names, permuted, spec, alpha=0.05, epsilon=0.1),
                "trusting": _TrustingRanking(names, permuted, spec, alpha=0.05, epsilon=0.1),
                "plain": BankRanking(names, alpha=0.05, epsilon=0.1).start(spec.weights())}
        runs["trusting"].trust = 1.0
        runs["trusting"].control = runs["trusting"]._controls()
        for label, rank in runs.items():
            for lo in range(0, items, look):
                if rank.model_open.any():
                    rank.update(order[lo:lo + look], x[30:, order[lo:lo + look]])
            out[label].append(rank.model_used.sum() / (models * items))
        out["trust_h"].append(runs["history"].trust)
        out["trust_p"].append(runs["permuted"].trust)
    return out


def test_rank_history_weighs_history_by_its_trust():
    """One trust for every model and pair, as compare --history: item-permuted history falls to trust 0 and costs at
    most 5% more cells than the plain ranking on the same orders; informative history keeps its trust and saves
    cells; the same useless history trusted fully costs more than 5% (the check can fail)."""
    out = _rank_cells(np.random.default_rng(3), reps=8)
    plain = np.mean(out["plain"])
    ratio = {k: np.mean(out[k]) / plain for k in ("history", "permuted", "trusting")}
    assert ratio["permuted"] <= 1.05 < ratio["trusting"], ratio
    assert ratio["history"] < 1.0, ratio
    assert np.median(out["trust_p"]) == 0.0 and np.median(out["trust_h"]) > 0.5, out

