"""``adaptive`` with feature strata (k-means on item features, fixed before any score) and the joint
control-variate betting CS: coverage with peeking, an unbiasedness identity checked by enumeration,
zero width at exhaustion, state round trips, scores never shaping strata, and ``backtest --features``."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import binom

from certeval.cli import main
from certeval.errors import InputError
from certeval.estimators import BankSpec, make_method, method_from_state
from certeval.estimators.bank.wor_streams import weighted_order
from certeval.estimators.single.adaptive import AdaptiveMethod, ControlVariateCS, Stratification
from certeval.estimators.single.strata import DrawRows, feature_strata

DELTA = 0.1
# 30 reps, as the miscalibrated controls below: the check fails at 10+ misses (binom.ppf(0.999, 30, 0.1) = 9), so
# a miss rate of 0.4 fails with probability 0.82 and one of 0.5 with 0.98; a valid 0.1 passes with 0.999
REPS = 30


def grouped_bank(rng, n=600, informative=True, contrast=False):
    """Three groups with loss means 0.15 / 0.5 / 0.85; features separate them (or are pure noise).

    ``contrast``: groups of very different variance instead (all 0 / all 0 / Bernoulli(0.5)), where
    Neyman allocation draws mostly from the last group.
    """
    groups = rng.integers(0, 3, size=n)
    if contrast:
        x = np.where(groups == 2, (rng.random(n) < 0.5).astype(float), 0.0)
    else:
        x = np.clip(rng.normal(np.array([0.15, 0.5, 0.85])[groups], 0.15), 0.0, 1.0)
    features = rng.normal(size=(n, 3))
    if informative:
        features[:, 0] += 4.0 * groups
    return x, features


def _features_method(**kw):
    return make_method("adaptive", confidence=1 - DELTA, strata="features", **kw)


class UnweightedDraws(AdaptiveMethod):
    """Deliberately miscalibrated: treats the Neyman-allocated draws as a uniform sample (no q, no control)."""

    name = "adaptive-unweighted-test-only"

    def _observe_group(self, cs, group, w_group, draws):
        u_g = draws.u[:, group].sum(axis=1)
        keep = u_g > 0
        ones = np.ones(int(keep.sum()))
        cs.observe_many(np.where(group[draws.h], draws.x, 0.5)[keep], 0.0 * ones, ones, (w_group / u_g)[keep],
                        (-draws.known[:, group].sum(axis=1) / u_g)[keep], (draws.q * draws.v).sum(axis=1)[keep])


def miscoverage(make, informative: bool, reps: int, seed: int, contrast: bool = False, n: int = 600) -> int:
    misses = 0
    for r in range(reps):
        rng = np.random.default_rng([seed, r])
        x, features = grouped_bank(rng, n=n, informative=informative, contrast=contrast)
        truth = x.mean()
        method = make().start(BankSpec(x.size, features=features))
        for _ in range(n // 20):  # peek after every batch of 10, up to half the bank
            prop = method.propose(10, rng)
            method.update(prop.items, x[prop.items])
            est = method.result()
            if not (est.lower - 1e-12 <= truth <= est.upper + 1e-12):
                misses += 1
                break
    return misses


@pytest.mark.parametrize("informative,contrast", [(True, False), (False, False), (True, True)])
def test_feature_strata_cover_with_peeking(informative, contrast):
    misses = miscoverage(_features_method, informative, REPS, seed=11 + informative + 2 * contrast, contrast=contrast)
    assert misses <= binom.ppf(0.999, REPS, DELTA), f"missed in {misses}/{REPS}"


def test_treating_allocated_draws_as_uniform_is_caught():
    def make():
        return UnweightedDraws(confidence=1 - DELTA, stratification=Stratification("features"))

    misses = miscoverage(make, True, 30, seed=13, contrast=True, n=1200)
    assert misses > binom.ppf(0.999, 30, DELTA), f"the miscalibrated variant slipped through ({misses}/30)"


@pytest.mark.parametrize("rule", ["narrowest", "neyman"])
def test_statistic_is_unbiased_by_enumeration(rule):
    """E[Y | past] = (W m − K)/U, computed by enumerating every (stratum, item) draw with its probability, for the
    law the draw rule picks and for the Neyman mix (the rule of runs begun before the choice between laws)."""
    rng = np.random.default_rng(3)
    x, features = grouped_bank(rng, n=200)
    method = _features_method(min_stratum_size=40).start(BankSpec(200, features=features))
    method.draw_rule_ = rule
    for _ in range(4):
        prop = method.propose(10, rng)
        method.update(prop.items, x[prop.items])
    a, var = method._controls()
    left = method.left_.copy()
    q = method._draw_probabilities(left, var, a, int((method.log_batch_ >= 0).sum()) + 1)
    w_item = method.item_weight_in_stratum_
    u = left * w_item
    seen = []

    class Recorder:
        def observe_many(self, y, y_min, y_max, alpha, beta, v):
            seen.extend(zip(y, y_min, y_max, alpha, beta))

    expected = 0.0
    undrawn = np.flatnonzero(~method.in_log_)
    for j in undrawn:
        h = int(method.strata_[j])
        seen.clear()
        draw = DrawRows(u[None], method.known_[None], q[None], a[None], var[None], np.array([h]),
                        np.array([float(x[j])]))
        method._observe_group(Recorder(), method.groups_[0], 1.0, draw)
        y, y_min, y_max, alpha, beta = seen[0]
        assert y_min - 1e-12 <= y <= y_max + 1e-12
        expected += q[h] / left[h] * y
    known = float(method.known_.sum())
    assert alpha * x.mean() + beta == pytest.approx((x.mean() - known) / u.sum())
    assert expected == pytest.approx((x.mean() - known) / u.sum(), rel=1e-10)


@pytest.mark.parametrize("halfwidth", [None, 0.05])
def test_capital_matches_a_direct_computation(halfwidth):
    """The all-times plug-in (WSR 2024) and the bets tuned to a half-width ε (λ = α ε / v), truncated at c."""
    rng = np.random.default_rng(5)
    steps = [(rng.uniform(-0.5, 1.5), -0.5, 1.5, 1.0 + 0.1 * i, -0.05 * i, 0.2) for i in range(40)]
    cs = ControlVariateCS(0.05, grid_size=65, bet_halfwidth=halfwidth)
    for s in steps:
        cs.observe(*s)
    assert cs.c == 0.8
    for j in range(0, 65, 8):
        m = cs.grid[j]
        kp = km = 0.0
        for i, (y, lo, hi, alpha, beta, v) in enumerate(steps, start=1):
            lam = (math.sqrt(2 * math.log(2 / 0.05) / (v * i * math.log(1 + i))) if halfwidth is None
                   else alpha * halfwidth / v)
            nu = min(max(alpha * m + beta, lo), hi)
            lp = lam if nu == lo else min(lam, 0.8 / (nu - lo))
            lm = lam if nu == hi else min(lam, 0.8 / (hi - nu))
            kp += math.log1p(lp * (y - nu))
            km += math.log1p(-lm * (y - nu))
        if not cs.rejected[j]:
            assert cs.log_kplus[j] == pytest.approx(kp, abs=1e-9)
            assert cs.log_kminus[j] == pytest.approx(km, abs=1e-9)


def test_a_sequence_fed_at_once_in_pieces_or_one_at_a_time_gives_the_same_cs():
    """observe_many is how every method feeds its CS: however the sequence is cut, the rejections are the same and
    each candidate's capital is the same, frozen where it crossed 1/δ (checked against a direct computation)."""
    rng = np.random.default_rng(21)
    n = 300
    steps = np.column_stack([(rng.random(n) < 0.6).astype(float), np.zeros(n), np.ones(n), np.ones(n), np.zeros(n),
                             np.full(n, 0.24)])
    whole, pieces, single = (ControlVariateCS(0.05, grid_size=257) for _ in range(3))
    whole.observe_many(*steps.T)
    for s in range(0, n, 7):
        pieces.observe_many(*steps[s:s + 7].T)
    for row in steps:
        single.observe(*row)
    assert 0 < whole.rejected.sum() < whole.rejected.size - 10
    for other in (pieces, single):
        np.testing.assert_array_equal(other.rejected, whole.rejected)
        np.testing.assert_allclose(other.log_kplus, whole.log_kplus, rtol=0, atol=1e-12)
        np.testing.assert_allclose(other.log_kminus, whole.log_kminus, rtol=0, atol=1e-12)
    log_threshold = math.log(1 / 0.05)
    for j in (0, 40, 128, 200, 256):
        m, kp, km, crossed = whole.grid[j], 0.0, 0.0, False
        for i, (y, lo, hi, alpha, beta, v) in enumerate(steps, start=1):
            lam = math.sqrt(2 * math.log(2 / 0.05) / (v * i * math.log(1 + i)))
            nu = min(max(alpha * m + beta, lo), hi)
            lp = lam if nu == lo else min(lam, 0.8 / (nu - lo))
            lm = lam if nu == hi else min(lam, 0.8 / (hi - nu))
            kp += math.log1p(lp * (y - nu))
            km += math.log1p(-lm * (y - nu))
            if np.logaddexp(kp, km) - math.log(2) >= log_threshold:
                crossed = True
                break
        assert bool(whole.rejected[j]) == crossed, j
        assert whole.log_kplus[j] == pytest.approx(kp, abs=1e-9) and whole.log_kminus[j] == pytest.approx(km, abs=1e-9)


def test_zero_width_when_all_scored_with_subsets():
    rng = np.random.default_rng(7)
    x, features = grouped_bank(rng, n=500)
    subsets = (np.arange(500) % 2).astype(np.int64)
    truth = np.mean([x[subsets == s].mean() for s in (0, 1)])
    method = make_method("adaptive", strata="features").start(
        BankSpec(500, subsets=subsets, subset_names=("a", "b"), features=features))
    while not method.exhausted:
        prop = method.propose(37, rng)
        method.update(prop.items, x[prop.items])
    est = method.result()
    assert dict(est.extra)["strata"] == "features" and dict(est.extra)["n_strata"] > 2
    assert est.halfwidth == 0.0 and est.mean == pytest.approx(truth)
    for sub, s in zip(est.subsets, (0, 1)):
        assert sub.upper - sub.lower == pytest.approx(0.0, abs=1e-12)
        assert sub.mean == pytest.approx(x[subsets == s].mean())


def test_state_round_trip_with_a_batch_in_flight():
    rng = np.random.default_rng(9)
    x, features = grouped_bank(rng, n=400)
    subsets = (np.arange(400) % 3).astype(np.int64)
    spec = BankSpec(400, subsets=subsets, subset_names=("a", "b", "c"), features=features)
    method = make_method("adaptive", confidence=0.9, strata="features", min_stratum_size=40).start(spec)
    for _ in range(8):
        prop = method.propose(10, rng)
        method.update(prop.items, x[prop.items])
    in_flight = method.propose(10, rng).items  # never scored before the state is taken
    blob = json.loads(json.dumps(method.state()))
    again = method_from_state(blob)
    assert again.result().to_dict() == method.result().to_dict()
    assert np.array_equal(again.strata_, method.strata_)
    # the restored method owes the in-flight draws first (they are in its draw log)
    redo = again.propose(10, np.random.default_rng(0)).items
    assert set(redo) == set(in_flight)
    for m in (method, again):
        m.update(in_flight, x[in_flight])
    assert again.result().to_dict() == method.result().to_dict()


def test_strata_depend_on_features_only():
    rng = np.random.default_rng(2)
    _, features = grouped_bank(rng, n=300)
    strata = []
    for seed in (0, 1):
        scores = np.random.default_rng(seed).random(300)
        method = _features_method().start(BankSpec(300, features=features))
        r = np.random.default_rng(seed)
        for _ in range(5):
            prop = method.propose(20, r)
            method.update(prop.items, scores[prop.items])
        strata.append(method.strata_.copy())
    assert np.array_equal(strata[0], strata[1])
    assert np.array_equal(strata[0], feature_strata(features, np.zeros(300, dtype=np.int64), 4, 50, 0))
    assert len(np.unique(strata[0])) >= 2


def test_auto_rule_and_validation():
    rng = np.random.default_rng(4)
    _, features = grouped_bank(rng, n=600)
    extra = lambda m: dict(m.result().extra) if m.n_scored else (m.strata_mode_, m.combine_)  # noqa: E731
    assert extra(make_method("adaptive").start(BankSpec(600, features=features))) == ("features", "joint")
    assert extra(make_method("adaptive").start(BankSpec(600))) == ("subsets", "union")
    assert extra(make_method("adaptive", target="distribution").start(BankSpec(600, features=features))) \
        == ("subsets", "union")
    assert extra(make_method("adaptive").start(BankSpec(60, features=features[:60]))) == ("subsets", "union")
    halves = (np.arange(600) % 2).astype(np.int64)
    with_subsets = BankSpec(600, subsets=halves, subset_names=("a", "b"), features=features)
    assert extra(make_method("adaptive").start(with_subsets)) == ("subsets", "joint")  # no union bound
    assert extra(make_method("adaptive", combine="union").start(with_subsets)) == ("subsets", "union")
    assert extra(make_method("uniform").start(with_subsets)) == ("subsets", "joint")
    assert extra(make_method("uniform").start(BankSpec(600, features=features))) == ("subsets", "union")
    assert extra(make_method("adaptive", strata="features").start(with_subsets)) == ("features", "joint")
    with pytest.raises(InputError, match="features"):
        make_method("adaptive", strata="features").start(BankSpec(600))
    with pytest.raises(InputError, match="target"):
        make_method("adaptive", strata="features", target="distribution").start(BankSpec(600, features=features))
    with pytest.raises(InputError, match="strata"):
        make_method("adaptive", strata="kmeans").start(BankSpec(600))


def test_backtest_features_factors(capsys):
    argv = ["backtest", "--scores", "bundled:helm_mmlu", "--model", "openai_text-davinci-003", "--reps", "2",
            "--goal", "halfwidth:0.1", "--features", "factors", "--json"]
    for method in ("cer-eval", "adaptive"):
        assert main(argv + ["--method", method]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["features"] == "factors" and out["models"][0]["coverage"] == 1.0
    assert main(argv + ["--method", "adaptive", "--strata", "features"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method_params"] == {"strata": "features"} and out["models"][0]["coverage"] == 1.0
    assert main(argv[:-3] + ["--features", "none", "--method", "cer-eval"]) == 2
    assert "needs item features" in capsys.readouterr().err
    assert main(argv + ["--method", "uniform", "--strata", "features"]) == 2
    assert "--strata" in capsys.readouterr().err


# -- banks with sub-datasets: one joint CS for the mean of sub-dataset means ----------------------------------


def subset_bank(rng, sizes=(60, 300, 140), means=(0.2, 0.55, 0.9)):
    """Sub-datasets of unequal size and mean; the estimand is the mean of their means (Arviv et al. 2026, eq. 1)."""
    codes = np.repeat(np.arange(len(sizes)), sizes)
    x = (rng.random(codes.size) < np.asarray(means)[codes]).astype(float)
    spec = BankSpec(codes.size, subsets=codes, subset_names=tuple(f"s{i}" for i in range(len(sizes))))
    return x, spec, float(spec.weights() @ x)


def feed_batch(method, x, order, k: int, size: int, shared_order: bool, rng) -> None:
    """Batch k: the method's own draws, or (``shared_order``) the caller's order drawn ∝ weight through
    ``propose_shared_order``, as a paired run feeds each model's method; then the scores."""
    if shared_order:
        items = order[size * k:size * (k + 1)]
        method.propose_shared_order(items)
    else:
        items = method.propose(size, rng).items
    method.update(items, x[items])


def subset_miscoverage(make, reps: int, seed: int, shared_order: bool = False, **bank) -> int:
    """Reps in which the overall interval misses at some look (every batch of 10, up to 60% of the bank).
    ``shared_order``: the caller draws an order ∝ the estimand's weights first and feeds it (a paired run's
    per-model method), through ``propose_shared_order``."""
    misses = 0
    for r in range(reps):
        rng = np.random.default_rng([seed, r])
        x, spec, truth = subset_bank(rng, **bank)
        method = make().start(spec)
        order = weighted_order(spec.weights(), rng)
        for k in range(int(0.6 * spec.n_items) // 10):
            feed_batch(method, x, order, k, 10, shared_order, rng)
            est = method.result()
            if not (est.lower - 1e-12 <= truth <= est.upper + 1e-12):
                misses += 1
                break
    return misses


@pytest.mark.parametrize("name,shared_order", [("uniform", False), ("adaptive", False), ("adaptive", True)])
def test_joint_cs_on_sub_datasets_covers_with_peeking(name, shared_order):
    def make():
        return make_method(name, confidence=1 - DELTA)

    misses = subset_miscoverage(make, REPS, seed=21 + shared_order, shared_order=shared_order)
    assert misses <= binom.ppf(0.999, REPS, DELTA), f"missed in {misses}/{REPS}"


def test_a_shared_order_fed_without_its_draw_law_is_caught():
    """The same control as above on sub-datasets: Neyman draws scored as if uniform (no importance weights)
    miss the mean of means far more often than δ (a sub-dataset of 1s is rarely drawn and under-counted)."""
    def make():
        return UnweightedDraws(confidence=1 - DELTA, combine="joint")

    misses = subset_miscoverage(make, 30, seed=23, sizes=(200, 200, 200), means=(0.5, 0.5, 1.0))
    assert misses > binom.ppf(0.999, 30, DELTA), f"the miscalibrated variant slipped through ({misses}/30)"


def test_joint_cs_is_narrower_than_the_union_bound_on_sub_datasets():
    """The point of the joint CS: on the same draws, narrower than per-sub-dataset CSs at δ/H (union bound)."""
    rng = np.random.default_rng(5)
    x, spec, _ = subset_bank(rng, sizes=(150,) * 6, means=(0.2, 0.35, 0.5, 0.6, 0.75, 0.9))
    joint, union = (make_method("uniform", combine=c).start(spec) for c in ("joint", "union"))
    order = rng.permutation(spec.n_items)[:300]
    for m in (joint, union):
        m.propose_shared_order(order)
        m.update(order, x[order])
    (jl, jh), (ul, uh) = ((m.result().lower, m.result().upper) for m in (joint, union))
    assert jh - jl < 0.8 * (uh - ul), (jh - jl, uh - ul)


def test_a_state_written_with_the_union_bound_is_refused_in_one_line_not_misread():
    """A run stored when ``uniform`` combined sub-datasets by the union bound cannot resume as the joint CS (its
    grids are per sub-dataset): refused with the reason, never silently re-interpreted."""
    rng = np.random.default_rng(8)
    _, spec, _ = subset_bank(rng)
    old = make_method("uniform", combine="union").start(spec)
    prop = old.propose(30, rng)
    old.update(prop.items, np.ones(len(prop.items)))
    state = old.state()
    state["params"]["combine"] = "auto"  # what that state says under today's default
    with pytest.raises(InputError, match="other way of combining"):
        method_from_state(state)
    assert method_from_state(old.state()).result() == old.result()  # with its own setting it still loads


@pytest.mark.parametrize("name,shared_order", [("uniform", False), ("adaptive", False), ("adaptive", True)])
def test_joint_state_stores_batches_not_rows_and_resumes_identically(name, shared_order):
    """A joint state keeps each batch's controls, not a row per draw (57 sub-datasets × 567 draws made states of
    megabytes); the laws are recomputed on load, so the resumed method is the one that ran: the same laws, draws,
    rejections and interval, and the same capital (fed in one sequence on load, batch by batch live: the same
    sums in the same order, compared to 1e-12 so that no vector-unit rounding can fail it)."""
    rng = np.random.default_rng(12)
    x, spec, _ = subset_bank(rng, sizes=(40,) * 12, means=tuple(np.linspace(0.1, 0.9, 12)))
    method = make_method(name, bet_halfwidth=0.05).start(spec)
    order = rng.permutation(spec.n_items)
    for k in range(8):
        feed_batch(method, x, order, k, 15, shared_order, rng)
    state = method.state()
    assert "log_q" not in state["extra"] and len(state["extra"]["batch_a"]) == 8
    back = method_from_state(json.loads(json.dumps(state)))
    assert back.result() == method.result()
    np.testing.assert_array_equal(back.log_q_, method.log_q_)
    for cs_a, cs_b in zip(back.cs_groups_, method.cs_groups_):
        np.testing.assert_array_equal(cs_a.rejected, cs_b.rejected)
        np.testing.assert_allclose(cs_a.log_kplus, cs_b.log_kplus, rtol=0, atol=1e-12)
        np.testing.assert_allclose(cs_a.log_kminus, cs_b.log_kminus, rtol=0, atol=1e-12)
    items = back.propose(15, np.random.default_rng(1)).items  # both continue the same way
    assert np.array_equal(items, method.propose(15, np.random.default_rng(1)).items)


def test_a_state_drawn_before_the_choice_between_laws_recomputes_its_own_laws():
    """States written before ``adaptive`` chose between the Neyman mix and proportional draws carry no draw rule:
    their laws are recomputed with the Neyman mix that drew them (read with today's rule they would differ, and
    the martingale would be fed the wrong importance weights); an unknown rule is refused."""
    rng = np.random.default_rng(12)
    x, spec, _ = subset_bank(rng, sizes=(40,) * 12, means=tuple(np.linspace(0.1, 0.9, 12)))
    method = make_method("adaptive", bet_horizon=400).start(spec)
    method.draw_rule_ = "neyman"  # what every run did before the choice
    order = rng.permutation(spec.n_items)
    for k in range(8):
        feed_batch(method, x, order, k, 15, False, rng)
    state = json.loads(json.dumps(method.state()))
    del state["extra"]["draw_rule"]  # as that version wrote it
    back = method_from_state(state)
    assert back.draw_rule_ == "neyman" and back.result() == method.result()
    np.testing.assert_array_equal(back.log_q_, method.log_q_)
    misread = method_from_state({**state, "extra": {**state["extra"], "draw_rule": "narrowest"}})
    assert not np.array_equal(misread.log_q_, method.log_q_)
    with pytest.raises(InputError, match="draw rule"):
        method_from_state({**state, "extra": {**state["extra"], "draw_rule": "oracle"}})
