"""The one round engine (certeval.engine): the backtests' replay and the pipeline's rounds are the same steps.

The reference below is the replay loop as it stood before the engine existed (written out here); the engine
must reproduce its fixed-seed runs exactly — estimates, decisions and the curve of looks — for every
single-model method, goal kind and budget.
"""

from __future__ import annotations

import numpy as np
import pytest

from certeval.engine import Replay, SingleModelRounds, draw_budget, lookup, replay_once, run_until_decided
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
        est, dec = replay_once(Replay(method, {}, g, 25, max_items), spec, row, np.random.default_rng([seed, 1]),
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
    from certeval.backtests.cells import replay_one, uninformative_factors

    spec, row = _bank(3, n=200)
    spec = BankSpec(n_items=200)  # FAQ's estimand here: the plain bank mean
    params = {"ci": "anytime", "budget": 400, **uninformative_factors(200, "mean")}
    res = replay_one(Replay("faq", params, parse_goal("halfwidth:0.1"), 20, 2000), spec, row,
                     np.random.default_rng(4), record_curve=True)
    assert len(res.curve) == res.looks >= 2
    assert res.curve[-1] == (res.n_scored, res.mean, res.lower, res.upper)
    assert [c[0] for c in res.curve] == sorted(c[0] for c in res.curve)


def test_a_goal_with_diminishing_returns_stops_where_the_interval_stalls_and_says_the_goal_was_not_met():
    """Arviv et al.'s diminishing-returns rule from a CLI goal: ``halfwidth:E+diminishing:G`` (the engine keeps each
    model's recent looks for it) stops once the half-width shrinks by less than G a look, goal not reached;
    the same run without it goes on to the half-width."""
    spec, row = _bank(3, n=2000)
    plain = parse_goal("halfwidth:0.03")
    stalled = parse_goal("halfwidth:0.03+diminishing:0.003")
    assert str(stalled) == "halfwidth:0.03+diminishing:0.003" and parse_goal(str(stalled)) == stalled
    widths = []
    est, decision = replay_once(Replay("uniform", {}, plain, 50), spec, row, np.random.default_rng(0),
                                on_look=lambda e: widths.append(e.halfwidth))
    assert decision.rule == "precision" and decision.reached
    early, decision = replay_once(Replay("uniform", {}, stalled, 50), spec, row, np.random.default_rng(0))
    assert decision.rule == "diminishing-returns" and not decision.reached and early.halfwidth > 0.03
    k = early.n_scored // 50 - 1  # the rule fired at look k: the gain over the last two looks was below 0.003
    assert (widths[k - 2] - widths[k]) / 2 < 0.003 <= (widths[k - 3] - widths[k - 1]) / 2
    assert early.n_scored < est.n_scored


@pytest.mark.parametrize("text", ["halfwidth:0.1+futility", "halfwidth:0.1+diminishing:x", "above:0.5+diminishing:-1",
                                  "halfwidth:0.1+diminishing:0.01+diminishing:0.02", "halfwidth:0.1+"])
def test_bad_added_rules_are_refused_by_name(text):
    from certeval.errors import InputError

    with pytest.raises(InputError, match="diminishing"):
        parse_goal(text)
