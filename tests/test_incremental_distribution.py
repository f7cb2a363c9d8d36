"""The distribution target's incremental estimators give, look by look, exactly what a replay of every look
from the first gives: :class:`SequentialRanking` against ``rank_models(path="pairs")`` (per-pair score rows,
an independent computation of the same statistic), :class:`SequentialSelection` against a from-scratch
replay written out here (mean of sub-dataset means over each look's prefix, Arviv et al. 2026 eq. 1), over many
seeds, with and without sub-datasets, in both selection modes; its default betting construction against one
single-model :class:`~certeval.estimators.single.bounds.BettingCS` per model (i.i.d., a separate implementation: a
Python loop for the bets, a rejected set instead of a window) fed one item at a time, and with sub-datasets against
i.i.d. streams fed one item at a time with the importance weights counted item by item in the test."""

from __future__ import annotations

import numpy as np
import pytest

from certeval.errors import InputError
from certeval.estimators.distribution.comparison import ComparisonDesign
from certeval.estimators.distribution.ranking import RankingOptions, SequentialRanking, rank_models
from certeval.estimators.distribution.selection import (
    SelectionIntervals,
    SelectionRule,
    SequentialSelection,
    select_models,
)
from certeval.estimators.distribution.sequential import boundary_multiplier
from certeval.estimators.single.bounds import BettingCS


def _case(seed: int):
    rng = np.random.default_rng(seed)
    m, n = int(rng.integers(2, 9)), int(rng.integers(40, 300))
    x = (rng.random((m, n)) < rng.uniform(0.2, 0.9, m)[:, None]).astype(float)
    sub = None
    if seed % 2 == 0:
        sub = rng.integers(0, 3, n)
        sub[:6] = [0, 0, 1, 1, 2, 2]
    looks = sorted(set(rng.integers(10, n, 4).tolist() + [n]))
    return x, sub, looks, [f"m{i}" for i in range(m)]


@pytest.mark.parametrize("seed", range(24))
def test_sequential_ranking_matches_a_replay_at_every_look(seed):
    x, sub, looks, names = _case(seed)
    kw = dict(options=RankingOptions(0.05, 0.02, ComparisonDesign(alpha=0.05, margin=0.02, look_size=25)),
              subsets=sub, n_subsets=None if sub is None else 3)
    inc = SequentialRanking(names, n_total=x.shape[1], **kw)
    prev = 0
    for k, n_k in enumerate(looks):
        got = inc.update(x[:, prev:n_k])
        prev = n_k
        ref = rank_models(x, names, looks[: k + 1], path="pairs", **kw)
        assert got.models == ref.models and got.tie_groups == ref.tie_groups
        assert got.items_used == ref.items_used
        np.testing.assert_allclose(got.means, ref.means, atol=1e-12)
        assert np.array_equal(got.pairs.verdict, ref.pairs.verdict)
        assert np.array_equal(got.pairs.look, ref.pairs.look)
        np.testing.assert_allclose(got.pairs.lower, ref.pairs.lower, atol=1e-10)
        np.testing.assert_allclose(got.pairs.upper, ref.pairs.upper, atol=1e-10)


def _replay_selection(x, sub, looks, threshold, halfwidth, mode, alpha=0.05, look_size=25):
    """select_models' rule, every look recomputed from the prefix (the former implementation's approach)."""
    m, n = x.shape
    status, mean = ["running"] * m, np.full(m, np.nan)
    lower, upper = np.zeros(m), np.ones(m)
    for k, n_k in enumerate(looks):
        idx = [j for j in range(m) if status[j] == "running"]
        if not idx:
            break
        groups = [np.arange(n_k)] if sub is None else [np.flatnonzero(sub[:n_k] == s) for s in range(3)]
        if any(len(g) < 2 for g in groups):
            mu = var = np.full(len(idx), np.nan)
        else:
            parts = [x[np.ix_(idx, g)] for g in groups]
            mu = np.mean([p.mean(axis=1) for p in parts], axis=0)
            var = np.sum([np.maximum(p.var(axis=1, ddof=1), 1 / p.shape[1]) / p.shape[1] for p in parts],
                         axis=0) / len(parts) ** 2
        c = boundary_multiplier("pocock", alpha / m, looks[: k + 1], n, look_size, 2)
        half = c * np.sqrt(var)
        exhausted = n_k == n  # the expected score stays unknown: intervals keep their width, the run just ends
        for i, j in enumerate(idx):
            mean[j] = mu[i]
            lower[j] = np.clip(mu[i] - half[i], 0, 1)
            upper[j] = np.clip(mu[i] + half[i], 0, 1)
            if np.isfinite(half[i]) and upper[j] < threshold:
                status[j] = "below"
        if mode == "precision":
            for i, j in enumerate(idx):
                if status[j] == "running" and np.isfinite(half[i]) and (upper[j] - lower[j]) / 2 <= halfwidth:
                    status[j] = "precise"
        else:
            alive = [j for j in range(m) if status[j] not in ("below", "not-best")]
            for j in alive:
                if status[j] == "running" and upper[j] < max((lower[i] for i in alive if i != j), default=-np.inf):
                    status[j] = "not-best"
            alive = [j for j in range(m) if status[j] not in ("below", "not-best")]
            if len(alive) == 1 or all((upper[j] - lower[j]) / 2 <= halfwidth for j in alive):
                for j in alive:
                    status[j] = "candidate"
        if exhausted:
            status = ["exhausted" if s == "running" else s for s in status]
    return status, mean, lower, upper


def _play(sel, x, looks):
    """Feed the selection each look's new columns until no model runs; its last result."""
    prev, got = 0, sel.result()
    for n_k in looks:
        if not sel.running.any():
            break
        got = sel.update(x[:, prev:n_k])
        prev = n_k
    return got


@pytest.mark.parametrize("mode", ["precision", "best"])
@pytest.mark.parametrize("seed", range(20))
def test_sequential_selection_matches_a_replay(seed, mode):
    """The asymptotic (group-sequential Wald) construction, kept beside the default betting one."""
    x, sub, looks, names = _case(seed)
    sel = SequentialSelection(names, n_total=x.shape[1], rule=SelectionRule(0.45, 0.08, mode=mode),
                              intervals=SelectionIntervals("group-sequential", look_size=25), subsets=sub,
                              n_subsets=None if sub is None else 3)
    assert sel.result().validity == "asymptotic" and sel.result().guarantee.startswith("asymptotic")
    got = _play(sel, x, looks)
    status, mean, lower, upper = _replay_selection(x, sub, looks, 0.45, 0.08, mode)
    assert [s.status for s in got.models] == status
    np.testing.assert_allclose([s.mean for s in got.models], mean, atol=1e-12)
    np.testing.assert_allclose([s.lower for s in got.models], lower, atol=1e-10)
    np.testing.assert_allclose([s.upper for s in got.models], upper, atol=1e-10)


def _weights_by_loop(sub, n):
    """Each position's importance weight c = R / (S r_s) and range B = R / (S min_s r_s) (R items left, r_s of
    sub-dataset s, before the draw), and the first position with a sub-dataset used up: counted item by item."""
    present = sorted(set(int(c) for c in sub[:n]))
    left = {s: int(np.sum(sub[:n] == s)) for s in present}
    c, b, end = np.ones(n), np.ones(n), n
    for i in range(n):
        if min(left.values()) == 0:
            end = min(end, i)
        rest = n - i
        c[i] = rest / (len(present) * max(left[int(sub[i])], 1))
        b[i] = max(rest / (len(present) * max(min(left.values()), 1)), 1.0)
        left[int(sub[i])] -= 1
    return c, b, end


def _betting_replay(x, sub, looks, threshold, halfwidth, mode, alpha=0.05, grid=257):
    """The betting selection's rule with its per-model CSs built separately: without sub-datasets a single-model
    BettingCS at alpha/M per model; with them, i.i.d. streams fed one item at a time with the importance weights
    counted by :func:`_weights_by_loop`. Bets tuned as SequentialSelection tunes them (precision: to reach the
    half-width; best: the bank)."""
    from certeval.estimators.distribution.iid_streams import IidBettingStreams

    m, n = x.shape
    delta = alpha / m
    need = int(np.ceil(np.log(2 / delta) / (2 * halfwidth ** 2)))
    horizon = min(need, n) if mode == "precision" else n
    if sub is None:
        cs = [BettingCS(delta, grid_size=grid, bet_horizon=horizon) for _ in range(m)]
        c, b, end = np.ones(n), np.ones(n), n
    else:
        cs = [IidBettingStreams(1, n, delta, grid_size=grid, bet_horizon=horizon) for _ in range(m)]
        c, b, end = _weights_by_loop(sub, n)
    status, lower, upper, prev = ["running"] * m, np.zeros(m), np.ones(m), 0
    for n_k in looks:
        idx = [j for j in range(m) if status[j] == "running"]
        if not idx:
            break
        for j in idx:
            for col in range(prev, min(n_k, end)):
                if sub is None:
                    cs[j].update(x[j, col:col + 1])
                else:
                    cs[j].absorb(np.array([[x[j, col] * c[col] / b[col]]]), b[col:col + 1])
            lower[j], upper[j] = cs[j].interval() if sub is None else (cs[j].lower[0], cs[j].upper[0])
        prev = n_k
        for j in idx:
            if upper[j] < threshold:
                status[j] = "below"
        alive = [j for j in range(m) if status[j] not in ("below", "not-best")]
        for j in alive:
            if mode == "precision" and status[j] == "running" and (upper[j] - lower[j]) / 2 <= halfwidth:
                status[j] = "precise"
            if mode == "best" and status[j] == "running" and upper[j] < max(
                    (lower[i] for i in alive if i != j), default=-np.inf):
                status[j] = "not-best"
        alive = [j for j in range(m) if status[j] not in ("below", "not-best")]
        if mode == "best" and (len(alive) == 1 or all((upper[j] - lower[j]) / 2 <= halfwidth for j in alive)):
            status = [("candidate" if j in alive else s) for j, s in enumerate(status)]
        if n_k == n:
            status = ["exhausted" if s == "running" else s for s in status]
    return status, lower, upper


@pytest.mark.parametrize("mode", ["precision", "best"])
@pytest.mark.parametrize("seed", range(8))
def test_betting_selection_matches_single_model_betting_cs(seed, mode):
    """The default (exact) construction: every model's interval at every look is its own i.i.d. betting CS on the
    same grid, built separately (measured: equal to the last bit on these cases)."""
    x, sub, looks, names = _case(seed)
    sel = SequentialSelection(names, n_total=x.shape[1], rule=SelectionRule(0.45, 0.12, mode=mode),
                              intervals=SelectionIntervals(grid_size=257), subsets=sub,
                              n_subsets=None if sub is None else 3)
    got = _play(sel, x, looks)
    assert got.validity == "exact" and got.guarantee.startswith("exact")
    status, lower, upper = _betting_replay(x, sub, looks, 0.45, 0.12, mode)
    assert [s.status for s in got.models] == status
    np.testing.assert_allclose([s.lower for s in got.models], lower, atol=1e-12)
    np.testing.assert_allclose([s.upper for s in got.models], upper, atol=1e-12)
    assert all(s.lower <= s.mean <= s.upper for s in got.models if np.isfinite(s.mean))


def test_statuses_are_exercised():  # the cases above reach more than one kind of stop (else they prove little)
    seen = set()
    for seed in range(20):
        x, sub, looks, names = _case(seed)
        for mode in ("precision", "best"):
            seen |= set(_replay_selection(x, sub, looks, 0.45, 0.08, mode)[0])
    assert {"below", "precise", "not-best", "candidate"} <= seen
    seen = set()  # the betting cases (the selection itself: it equals the replay, above)
    for seed in range(8):
        x, sub, looks, names = _case(seed)
        for mode in ("precision", "best"):
            sel = select_models(x, names, looks, SelectionRule(0.45, 0.12, mode=mode),
                                intervals=SelectionIntervals(grid_size=257), subsets=sub,
                                n_subsets=None if sub is None else 3)
            seen |= {s.status for s in sel.models}
    assert {"below", "precise", "not-best", "candidate"} <= seen


def test_a_look_past_the_bank_is_refused():
    sel = SequentialSelection(["a", "b"], n_total=10, rule=SelectionRule(0.5, 0.1))
    with pytest.raises(InputError, match="within the 10 shared items"):
        sel.update(np.zeros((2, 11)))
    rank = SequentialRanking(["a", "b"], n_total=10)
    with pytest.raises(InputError, match="within the 10 shared items"):
        rank.update(np.zeros((2, 11)))


@pytest.mark.parametrize("seed", [0, 2, 4])
def test_importance_weights_match_a_count_item_by_item(seed):
    x, sub, looks, names = _case(seed)
    sel = SequentialSelection(names, n_total=x.shape[1], rule=SelectionRule(0.45, 0.12), subsets=sub, n_subsets=3)
    c, b, end = _weights_by_loop(sub, x.shape[1])
    np.testing.assert_allclose(sel.scale[:end], c[:end], rtol=1e-12)
    np.testing.assert_allclose(sel.range[:end], b[:end], rtol=1e-12)
    assert sel.joint_end == end < x.shape[1]  # the last sub-dataset item to go is before the bank's end


def test_the_weighted_values_have_the_mean_of_means_as_conditional_mean():
    """Exactly, given each prefix of the order: over the uniform continuations of a tiny bank (sub-datasets of 1, 2
    and 3 items with known means), the importance-weighted value at the next position averages to the mean of means
    whenever no sub-dataset has run out."""
    import itertools

    codes = np.array([0, 1, 1, 2, 2, 2])
    mu = np.array([0.9, 0.3, 0.5])
    orders = list(itertools.permutations(range(codes.size)))
    checked = 0
    for pos in range(codes.size):
        by_prefix: dict[tuple, list[float]] = {}
        for order in orders:
            sel = SequentialSelection(["a"], n_total=codes.size, rule=SelectionRule(0.0, 0.1),
                                      subsets=codes[list(order)], n_subsets=3)
            if pos < sel.joint_end:
                prefix = tuple(int(c) for c in codes[list(order[:pos])])
                by_prefix.setdefault(prefix, []).append(sel.scale[pos] * mu[codes[order[pos]]])
        for values in by_prefix.values():
            assert np.isclose(np.mean(values), mu.mean())
            checked += 1
    assert checked == 9  # prefixes that leave every sub-dataset an item: 1 + 2 + 3 + 3 at positions 0 to 3
