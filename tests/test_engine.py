"""The one round engine (certeval.engine): the backtests' replay and the pipeline's rounds are the same steps.

The reference below is the replay loop as it stood before the engine existed (written out here); the engine
must reproduce its fixed-seed runs exactly — estimates, decisions and the curve of looks — for every
single-model method, goal kind and budget.
"""

from __future__ import annotations

import numpy as np
import pytest

from certeval.backtest.single import replay_once
from certeval.engine import SingleModelRounds, draw_budget, lookup, run_until_decided
from certeval.estimators import BankSpec, make_method, method_for_goal, parse_goal


def _reference_replay(method_name, spec, row, goal, batch_size, max_items, rng):
    # the method as every run builds it: bets tuned to the goal's half-width or the item budget
    method = method_for_goal(method_name, goal, max_items).start(spec)
    budget = draw_budget(method, spec.n_items, max_items)
    curve, looked = [], False
    while True:
        est = method.result()
        if looked:
            curve.append((est.n_scored, est.mean, est.lower, est.upper))
        decision = goal.decide(est, budget_left=budget - est.n_scored)
        if decision.done:
            return est, decision, curve
        prop = method.propose(min(batch_size, budget - est.n_scored), rng)
        if len(prop) == 0:
            return est, goal.decide(est, budget_left=0), curve
        method.update(prop.items, row[prop.items])
        looked = True


def _bank(seed: int, n: int = 240):
    rng = np.random.default_rng(seed)
    subsets = np.sort(rng.integers(0, 3, n))
    spec = BankSpec(n_items=n, subsets=subsets, subset_names=("a", "b", "c"), features=rng.standard_normal((n, 4)))
    row = (rng.random(n) < rng.beta(2, 2, n)).astype(float)
    return spec, row


@pytest.mark.parametrize("method", ["uniform", "static", "seq", "cer-eval", "adaptive"])
@pytest.mark.parametrize("goal,max_items", [("halfwidth:0.12", None), ("above:0.5", None), ("halfwidth:0.01", 70)])
def test_engine_replay_reproduces_the_old_loop_exactly(method, goal, max_items):
    for seed in range(3):
        spec, row = _bank(seed)
        g = parse_goal(goal)
        ref_est, ref_dec, ref_curve = _reference_replay(method, spec, row, g, 25, max_items,
                                                        np.random.default_rng([seed, 1]))
        curve = []
        est, dec = replay_once(method, {}, spec, row, g, 25, max_items, np.random.default_rng([seed, 1]),
                               on_look=lambda e: curve.append((e.n_scored, e.mean, e.lower, e.upper)))
        assert est == ref_est and curve == ref_curve
        assert (dec.done, dec.rule, dec.reached, dec.verdict, dec.detail) == (
            ref_dec.done, ref_dec.rule, ref_dec.reached, ref_dec.verdict, ref_dec.detail)
        if max_items is not None:
            assert est.n_scored == max_items and dec.rule == "budget"


def test_several_models_one_round_each_and_a_model_with_nothing_left_is_decided_in_select():
    spec, row = _bank(7, n=60)
    methods = {name: make_method("uniform").start(spec) for name in ("a", "b")}
    rounds = SingleModelRounds(methods, parse_goal("halfwidth:0.001"), n_items=60, batch_size=25, max_items=None)
    looks = []
    decisions = run_until_decided(rounds, lookup({"a": row, "b": 1 - row}), lambda _label: np.random.default_rng(1),
                                  on_look=lambda look, proposals: looks.append((look, sorted(proposals))))
    assert looks == [(1, ["a", "b"]), (2, ["a", "b"]), (3, ["a", "b"])]  # 25 + 25 + 10 items
    assert {k: (d.rule, d.reached, d.look) for k, d in decisions.items()} == {
        "a": ("precision", True, 3), "b": ("precision", True, 3)}  # exact at exhaustion: width 0
    assert methods["a"].result().mean == pytest.approx(spec.weights() @ row) and rounds.active == []
    # a model whose budget is spent before it proposes gets its decision from select, and no proposal
    spent = SingleModelRounds({"c": make_method("uniform").start(spec)}, parse_goal("halfwidth:0.1"), n_items=60,
                              batch_size=10, max_items=1)
    spent.update("c", np.array([0]), row[:1])
    assert spent.select(lambda _label: np.random.default_rng(0), look=2) == {}
    assert spent.decisions["c"].rule == "budget" and spent.active == []


def test_faq_replay_records_every_look_and_ends_at_its_estimate():
    """FAQ runs in backtests only (a live certify refuses it): there its look log is the rep's curve, recorded by
    the engine at every look; the last look is the estimate the rep returns, with its asymptotic validity."""
    from certeval.backtest.ray_fanout import replay_one, uninformative_factors

    spec, row = _bank(3, n=200)
    spec = BankSpec(n_items=200)  # FAQ's estimand here: the plain bank mean
    params = {"ci": "anytime", "budget": 400, **uninformative_factors(200, "mean")}
    res = replay_one("faq", params, spec, row, parse_goal("halfwidth:0.1"), 20, np.random.default_rng(4),
                     max_items=2000, record_curve=True)
    assert len(res.curve) == res.looks >= 2
    assert res.curve[-1] == (res.n_scored, res.mean, res.lower, res.upper)
    assert [c[0] for c in res.curve] == sorted(c[0] for c in res.curve)
