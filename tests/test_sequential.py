"""Per-model sequential test: stopping rules, the GST mean's repeated CI, mean-of-means variance."""

from __future__ import annotations

import math

import numpy as np
import pytest

from certeval.errors import InputError
from certeval.estimators import BankSpec, Estimate
from certeval.estimators.distribution.sequential import GroupSequentialMean, mean_of_means
from certeval.estimators.goals import (
    Budget,
    DiminishingReturns,
    Futility,
    Look,
    Precision,
    SequentialTest,
    StoppingRule,
    Threshold,
    first_decision,
)


def _est(mean, half, n=100, exhausted=False):
    return Estimate("x", mean, mean - half, mean + half, n, 0.95, False, exhausted=exhausted)


def _history(*pairs):
    return [Look(k + 1, 100 * (k + 1), _est(m, h, 100 * (k + 1))) for k, (m, h) in enumerate(pairs)]


def test_rules_fire_with_rule_name_and_look():
    h = _history((0.5, 0.2), (0.6, 0.09), (0.62, 0.04))
    assert Precision(0.045).check(h).rule == "precision" and Precision(0.045).check(h).look == 3
    assert Precision(0.01).check(h) is None
    d = Threshold(0.5, "above").check(h)
    assert d.verdict == "above" and d.reached and d.look == 3
    assert Futility(0.7, "above").check(h).rule == "futility"
    assert Futility(0.6, "above").check(h) is None
    dr = DiminishingReturns(0.06).check(h)
    assert dr.rule == "diminishing-returns"  # gain 0.05 < 0.06
    assert DiminishingReturns(0.04).check(h) is None
    assert Budget(300).check(h).rule == "budget"
    combined = first_decision([Precision(0.01), Threshold(0.9, "above", stop_on_other=False), DiminishingReturns(0.06)], h)
    assert combined.rule == "diminishing-returns" and combined.look == 3
    assert isinstance(Precision(0.1), StoppingRule)


def test_mean_of_means_formula():
    x = np.array([1, 0, 1, 1, 0, 0, 1, 0.0])
    s = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    mean, var = mean_of_means(x, s, 2, var_floor=False)
    m0, m1 = 0.75, 0.25
    assert mean == pytest.approx((m0 + m1) / 2)
    expected = (np.var(x[:4], ddof=1) / 4 + np.var(x[4:], ddof=1) / 4) / 4
    assert var == pytest.approx(expected)
    nan_mean, nan_var = mean_of_means(x[:5], s[:5], 2)
    assert math.isnan(nan_var)


def test_gst_mean_repeated_ci_coverage_and_a_naive_variant_fails():
    rng = np.random.default_rng(3)
    bank = (rng.random(1000) < rng.beta(2, 5, 1000)).astype(float)
    truth = bank.mean()
    spec = BankSpec(1000)
    reps, miss, naive_miss = 400, 0, 0
    for r in range(reps):
        method = GroupSequentialMean(confidence=0.95, spending="pocock", look_size=50).start(spec)
        g = np.random.default_rng(r)
        bad_naive = False
        missed = False
        for _ in range(10):  # 10 looks of 50 (half the bank)
            prop = method.propose(50, g)
            method.update(prop.items, bank[prop.items])
            est = method.result()
            missed |= not (est.lower <= truth <= est.upper)
            sc = method.scores_[method.order_]
            half = 1.96 * sc.std(ddof=1) / math.sqrt(len(sc))
            bad_naive |= not (sc.mean() - half <= truth <= sc.mean() + half)
        miss += missed
        naive_miss += bad_naive
    tol = 3 * math.sqrt(0.05 * 0.95 / reps)
    assert miss / reps <= 0.05 + tol
    assert naive_miss / reps > 0.05 + tol


def test_sequential_test_wraps_a_method_and_reports_rule_and_look():
    rng = np.random.default_rng(0)
    bank = (rng.random(2000) < 0.8).astype(float)
    test = SequentialTest(GroupSequentialMean(spending="ld-pocock"), [Threshold(0.6, "above"), Precision(0.01)])
    test.start(BankSpec(2000))
    decision = None
    for _ in range(20):
        prop = test.propose(100, rng)
        decision = test.update(prop.items, bank[prop.items])
        if decision.done:
            break
    assert decision.done and decision.rule == "threshold" and decision.verdict == "above"
    assert decision.look == len(test.history) and decision.look <= 3
    state = test.method.state()
    again = GroupSequentialMean.from_state(state)
    assert again.result().mean == pytest.approx(test.result().mean)


def test_exhausted_bank_gives_exact_mean_and_stops():
    bank = np.array([1.0, 0, 1, 1, 0, 1, 1, 1, 0, 1])
    test = SequentialTest(GroupSequentialMean(spending="ld-obf", look_size=5), [Precision(0.0001)])
    test.start(BankSpec(10))
    rng = np.random.default_rng(1)
    for _ in range(2):
        prop = test.propose(5, rng)
        d = test.update(prop.items, bank[prop.items])
    est = test.result()
    assert est.exhausted and est.lower == est.upper == pytest.approx(0.7)
    assert d.done and d.rule in ("precision", "exhausted")
    # a Wald interval per look (estimated variance): asymptotic on both targets, whatever the look
    assert est.validity == "asymptotic" and est.guarantee.startswith("asymptotic")


def test_bad_rules_and_parameters():
    with pytest.raises(InputError, match="check"):
        SequentialTest(GroupSequentialMean(), [object()])
    with pytest.raises(InputError, match="spending"):
        GroupSequentialMean(spending="bogus").start(BankSpec(10))


def _goal_reference(kind, value, est, look, budget_left):
    """The goal logic as it stood before goals were made of the stopping rules, written out (the reference)."""
    from certeval.estimators import Decision

    if est.n_scored > 0:
        if kind == "halfwidth" and est.halfwidth <= value:
            return Decision(True, "precision", look, True, "precise", f"half-width {est.halfwidth:.4g} <= {value:g}")
        if kind in ("above", "below"):
            verdict = "above" if est.lower > value else "below" if est.upper < value else None
            if verdict is not None:
                return Decision(True, "threshold", look, True, verdict,
                                f"interval [{est.lower:.4g}, {est.upper:.4g}] is {verdict} {value:g}"
                                + ("" if verdict == kind else f" (asked: {kind})"))
    if est.exhausted:
        return Decision(True, "exhausted", look, False, None, "every item of the bank was scored")
    if budget_left is not None and budget_left <= 0:
        return Decision(True, "budget", look, False, None, "the item budget (--max-items) was spent")
    return Decision(False, None, look, False, None, "")


def test_goals_are_rule_sets_and_decide_as_before_on_many_random_looks():
    """One stopping-rule system: a CLI goal is Precision / Threshold + Exhausted + Budget, and decides exactly as
    the goal logic it replaced, over 3,000 random looks (all kinds, edges, empty, exhausted, budgets)."""
    from certeval.estimators import parse_goal

    rng = np.random.default_rng(2026)
    fired = set()
    for _ in range(3000):
        kind = rng.choice(["halfwidth", "above", "below"])
        value = float(rng.choice([0.05, 0.1, 0.3, 0.5, 0.7])) if kind != "halfwidth" else float(rng.choice([0.02, 0.1]))
        goal = parse_goal(f"{kind}:{value}")
        assert [type(r).__name__ for r in goal.rules(max_items=5)][-2:] == ["Exhausted", "Budget"]
        mean, half = float(rng.random()), float(rng.choice([0.0, 0.01, 0.05, 0.2]))
        n = int(rng.choice([0, 1, 50]))
        est = _est(mean, half, n=n, exhausted=bool(rng.random() < 0.2))
        look = int(rng.integers(1, 9)) if rng.random() < 0.7 else None
        budget_left = None if rng.random() < 0.4 else int(rng.integers(-2, 3))
        got = goal.decide(est, look=look, budget_left=budget_left)
        assert got == _goal_reference(kind, value, est, look, budget_left)
        fired.add(got.rule)
    assert fired == {"precision", "threshold", "exhausted", "budget", None}  # every branch was exercised
