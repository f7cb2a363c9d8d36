"""Bank target: incremental without-replacement CSs for pairs, rankings and best-model selection.

The streams themselves are checked in tests/test_wor_streams.py; here: family-wise error over exact ties with fixed seeds, where the same check
catches the variant without multiplicity correction; exact verdicts at exhaustion; order, verdicts and tie
groups on every bundled bank.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

from certeval.errors import InputError
from certeval.estimators.bank.ranking import BankRanking, bank_rank, group_ties
from certeval.estimators.bank.selection import BankSelection
from certeval.estimators.bank.wor_streams import weighted_order

ALPHA = 0.05


def _equal_means_bank(rng, m, n, ones):
    """m models, each with exactly ``ones`` correct items out of n (every pair's bank difference is 0), scores
    correlated through a shared item difficulty."""
    difficulty = rng.random(n)
    out = np.zeros((m, n))
    for k in range(m):
        noisy = difficulty + 0.6 * rng.random(n)
        out[k, np.argsort(noisy)[:ones]] = 1.0
    return out


def _fwer(correction, reps=50, seed=7, alpha=0.2):
    rng = np.random.default_rng(seed)
    m, n = 6, 240  # 15 pairs, all exact ties (measured: 0.04 with Bonferroni, 0.58 without)
    names = [f"m{k}" for k in range(m)]
    errors = 0
    looks = list(range(20, n + 1, 20))
    for _ in range(reps):
        x = _equal_means_bank(rng, m, n, n // 2)
        r = bank_rank(x, names, looks, alpha=alpha, margin=0.0, correction=correction)
        # every true difference is exactly 0: any directional statement is wrong
        errors += bool(np.isin(r.verdict, (1, 2)).any())
    return errors / reps


@pytest.mark.slow
def test_family_wise_error_over_exact_ties_is_at_most_alpha_and_no_correction_fails_the_same_check():
    # 50 reps: the bound is 0.37 (fail at 19+ errors); the uncorrected control's FWER of 0.58 (0.52 in these 50 reps)
    # fails with probability 0.999, one of 0.5 with 0.97; a valid 0.2 passes with probability 0.997
    alpha, reps = 0.2, 50
    bound = alpha + 3 * math.sqrt(alpha * (1 - alpha) / reps)
    ok = _fwer("bonferroni", reps, alpha=alpha)
    bad = _fwer("none", reps, alpha=alpha)
    assert ok <= bound
    assert bad > bound, f"the uncorrected control should fail the same check (FWER {bad})"


def test_exhausted_pair_gets_its_exact_verdict_and_zero_width():
    rng = np.random.default_rng(3)
    n = 400
    a = (rng.random(n) < 0.5).astype(float)
    b = a.copy()
    flip = rng.choice(np.flatnonzero(a == 1), size=12, replace=False)  # b loses 12 items: exactly 0.03
    b[flip] = 0.0
    diff = a.mean() - b.mean()
    assert diff == pytest.approx(0.03)
    for margin, want in ((0.0, "a>b"), (0.02, "a>b"), (0.03, "equivalent"), (0.05, "equivalent")):
        r = bank_rank(np.vstack([a, b]), ["a", "b"], [n], margin=margin).result()
        c = r.comparisons[0]
        if c.n_items < n:
            continue  # decided before exhaustion (then the interval covers, checked below)
        assert c.exact and c.lower == c.upper == pytest.approx(diff) and c.verdict == want and c.rule == "exhausted"
    r = bank_rank(np.vstack([b, a]), ["b", "a"], list(range(50, n + 1, 50)), margin=0.0).result()
    c = r.comparisons[0]
    assert c.lower <= -diff + 1e-12 and -diff <= c.upper + 1e-12 and c.verdict in ("b>a", "undecided")


def test_weighted_estimand_mean_of_means_at_exhaustion():
    rng = np.random.default_rng(5)
    sizes = [30, 90, 180]
    codes = np.repeat(np.arange(3), sizes)
    w = 1.0 / (3 * np.asarray(sizes)[codes])
    x = (rng.random((3, codes.size)) < np.array([[0.3], [0.5], [0.7]])).astype(float)
    r = bank_rank(x, ["a", "b", "c"], [codes.size], weights=w)
    mom = np.array([np.mean([x[k, codes == s].mean() for s in range(3)]) for k in range(3)])
    got = dict(zip(r.result().models, r.result().means))
    assert [got[n] for n in "abc"] == pytest.approx(list(mom))


def test_state_round_trip_resumes_exactly():
    rng = np.random.default_rng(11)
    m, n = 6, 200
    x = (rng.random((m, n)) < rng.uniform(0.3, 0.8, (m, 1))).astype(float)
    names = [f"m{k}" for k in range(m)]
    w = np.full(n, 1 / n)
    whole = BankRanking(names, margin=0.02).start(w)
    half = BankRanking(names, margin=0.02).start(w)
    for start in range(0, n, 25):
        block = np.where(whole.model_open[:, None], x[:, start:start + 25], np.nan)
        whole.update(np.arange(start, start + 25), block)
        if start == 100:  # save through npz (no pickle) and restore
            state = half.state()
            buf = io.BytesIO()
            flat = {k: v for k, v in state.items() if isinstance(v, np.ndarray)}
            np.savez(buf, **flat)
            buf.seek(0)
            loaded = dict(np.load(buf))
            half = BankRanking.from_state({**state, **loaded})
        half.update(np.arange(start, start + 25), np.where(half.model_open[:, None], x[:, start:start + 25], np.nan))
    a, b = whole.result(), half.result()
    assert a.models == b.models and a.tie_groups == b.tie_groups
    assert np.array_equal(whole.verdict, half.verdict) and np.allclose(whole.lower, half.lower)


def test_tie_groups_never_hold_two_separated_models():
    sep = np.zeros((4, 4), dtype=bool)
    sep[0, 2] = sep[2, 0] = True  # 0 and 2 separated, 1 ties with both
    groups = group_ties([0, 1, 2, 3], lambda k, g: bool(sep[k, g].any()))
    assert groups == [[0, 1], [2, 3]]


BUNDLED = ["helm_mmlu", "helm_raft", "helm_v023", "vlm_hallusionbench", "vlm_ocrbench", "opencompass_large",
           "openllm_tiny", "openllm_arc", "chembench"]


@pytest.mark.parametrize("dataset", BUNDLED)
def test_bank_ranking_order_verdicts_and_tie_groups_agree_on_every_bundled_bank(dataset):
    """Order, verdicts and reported means answer one estimand; a model certified better is never ranked
    below; two fully scored models whose exact bank means differ by more than the margin are never tied.
    (Up to 20 models per bank, picked at random, to keep the test fast; the order drawn ∝ weight.)"""
    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

    frame = load_scores(f"bundled:{dataset}")
    bank = bank_from_scores(frame)
    models = sorted(frame["model"].unique())
    picks = [models[i] for i in np.random.default_rng(0).choice(len(models), size=min(20, len(models)),
                                                                 replace=False)]
    n = bank.n_items
    order = weighted_order(bank.spec().weights(), np.random.default_rng(1))
    x = score_matrix(frame, picks, bank)[:, order]
    w = bank.spec().weights()[order]
    step = max(50, n // 10)
    margin = 0.02
    r = bank_rank(x, picks, list(range(step, n, step)) + [n], margin=margin, weights=w)
    res = r.result()
    exact = x @ w  # each model's exact bank mean (mean of sub-dataset means where the bank has them)
    place = {name: i for i, name in enumerate(res.models)}
    for a, b, verdict in zip(r.pa, r.pb, r.verdict):
        if verdict == 1:
            assert place[picks[a]] < place[picks[b]]
        elif verdict == 2:
            assert place[picks[b]] < place[picks[a]]
    full = {name for name, used in zip(res.models, res.items_used) if used == n}
    idx = {name: k for k, name in enumerate(picks)}
    for group in res.tie_groups:
        done = [g for g in group if g in full]
        for i, gi in enumerate(done):
            for gj in done[i + 1:]:
                assert abs(exact[idx[gi]] - exact[idx[gj]]) <= margin + 1e-12, (gi, gj)
    for name, mean, used in zip(res.models, res.means, res.items_used):
        if used == n:
            assert mean == pytest.approx(exact[idx[name]])


@pytest.mark.slow
def test_selection_finds_an_epsilon_best_model_and_drops_others_early():
    rng = np.random.default_rng(2)
    # 30 reps: at most 1 wrong selection passes (alpha 0.05), so a wrong-selection rate of 0.2 fails with probability
    # 0.99, one of 0.1 with 0.82
    m, n, reps, eps = 10, 1000, 30, 0.02
    acc = np.linspace(0.35, 0.75, m)
    names = [f"m{k}" for k in range(m)]
    wrong, fractions = 0, []
    for _ in range(reps):
        x = (rng.random((m, n)) < acc[:, None]).astype(float)
        truth = x.mean(axis=1)
        sel = BankSelection(names, alpha=ALPHA, top=2, epsilon=eps).start(np.full(n, 1 / n))
        for start in range(0, n, 50):
            live = np.array([s in sel.active for s in names])
            sel.update(np.arange(start, start + 50), np.where(live[:, None], x[:, start:start + 50], np.nan))
            if not sel.active:
                break
        res = sel.result()
        chosen = [names.index(s) for s in res.selected]
        assert len(chosen) == 2 and res.done
        kth = np.sort(truth)[::-1][1]
        wrong += any(truth[c] < kth - eps for c in chosen)
        fractions.append(res.fraction_used)
    assert wrong / reps <= ALPHA
    assert np.mean(fractions) < 0.6  # the weak models leave early


@pytest.mark.parametrize("kwargs, match", [
    ({"alpha": 1.5}, "alpha"), ({"margin": -0.1}, "margin"), ({"correction": "holm"}, "correction"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(InputError, match=match):
        BankRanking(["a", "b"], **kwargs)
    with pytest.raises(InputError, match="at least two"):
        BankRanking(["a"])
    r = BankRanking(["a", "b"]).start(np.full(4, 0.25))
    with pytest.raises(InputError, match="scores must be"):
        r.update([0, 1], np.zeros((3, 2)))
    with pytest.raises(InputError, match="top"):
        BankSelection(["a", "b"], top=3)


def _history_bank(seed, m=4, n=200):
    from certeval.estimators.history.prior import fit_history_prior

    rng = np.random.default_rng(seed)
    ability = rng.normal(0, 1, 30 + m)
    difficulty = rng.normal(0, 1.2, n)
    p = 1 / (1 + np.exp(-(ability[:, None] - difficulty[None, :])))
    pop = (rng.random(p.shape) < p).astype(float)
    prior = fit_history_prior(pop[:30], n_factors=2)  # the other 30 models are the history
    return pop[30:], prior


def test_history_ranking_statements_hold_and_exhaustion_is_exact():
    """rank --history: each pair's exact CS (difference minus prediction) at alpha/P. Over seeded banks, no
    statement contradicts the exact bank differences; at exhaustion every pair has its exact verdict."""
    from certeval.estimators.history.ranking import HistoryRanking
    from certeval.estimators.protocol import BankSpec

    names = ["a", "b", "c", "d"]
    wrong = 0
    for seed in range(4):
        x, prior = _history_bank(seed)
        n = x.shape[1]
        spec = BankSpec(n)
        rank = HistoryRanking(names, [prior] * 4, spec, alpha=ALPHA, margin=0.0)
        order = np.random.default_rng(100 + seed).permutation(n)
        for start in range(0, n, 50):
            cols = order[start:start + 50]
            rank.update(cols, np.where(rank.model_open[:, None], x[:, cols], np.nan))
            if not rank.active:
                break
        res = rank.result()
        exact = x.mean(axis=1)
        for c in res.comparisons:
            d = exact[names.index(c.model_a)] - exact[names.index(c.model_b)]
            wrong += (c.verdict == "a>b" and d <= 0) or (c.verdict == "b>a" and d >= 0)
            assert c.lower - 1e-9 <= d <= c.upper + 1e-9
            if c.exact:
                assert c.lower == pytest.approx(d, abs=1e-9) and c.verdict != "undecided"
        place = {m: i for i, m in enumerate(res.models)}
        for c in res.comparisons:
            if c.verdict == "a>b":
                assert place[c.model_a] < place[c.model_b]
    assert wrong == 0
    big = HistoryRanking([f"m{k}" for k in range(31)], [prior] * 31, BankSpec(200))  # no 30-model cap any more
    assert len(big.pa) == 31 * 30 // 2


def test_selection_state_round_trip_resumes_exactly():
    rng = np.random.default_rng(4)
    m, n = 6, 300
    x = (rng.random((m, n)) < np.linspace(0.3, 0.8, m)[:, None]).astype(float)
    names = [f"m{k}" for k in range(m)]
    whole = BankSelection(names, top=2, epsilon=0.05).start(np.full(n, 1 / n))
    part = BankSelection(names, top=2, epsilon=0.05).start(np.full(n, 1 / n))
    for start in range(0, n, 30):
        for sel in (whole, part):
            live = np.array([s == "running" for s in sel.status])
            sel.update(np.arange(start, start + 30), np.where(live[:, None], x[:, start:start + 30], np.nan))
        if start == 60:
            part = BankSelection.from_state(part.state())
    assert whole.result().to_dict() == part.result().to_dict()


def test_history_selection_drops_correctly_and_selects_within_epsilon():
    """select --history: BankSelection's rule on HistoryMethod's per-model exact CSs at alpha/2M and the rule's
    boundary tests (top-1 within epsilon). Over seeded banks every look's intervals hold the exact bank means
    jointly, every certified listing holds (mu_a >= mu_b - epsilon), no drop is wrong, the selection is an
    epsilon-top-1 of the bank, and a run to exhaustion selects the exact best."""
    from certeval.estimators.history.paired import HistorySelection
    from certeval.estimators.protocol import BankSpec

    names = ["a", "b", "c", "d"]
    eps, wrong, early = 0.05, 0, 0
    for seed in range(6):
        x, prior = _history_bank(seed, n=600)
        n = x.shape[1]
        exact = x.mean(axis=1)
        sel = HistorySelection(names, [prior] * 4, BankSpec(n), alpha=ALPHA, top=1, epsilon=eps).start()
        order = np.random.default_rng(200 + seed).permutation(n)
        for start in range(0, n, 60):
            cols = order[start:start + 60]
            live = sel.rule.status == "running"
            sel.update(cols, np.where(live[:, None], x[:, cols], np.nan))
            for j in np.flatnonzero(live):  # every interval just updated holds its exact bank mean
                wrong += not (sel.rule.lower[j] - 1e-9 <= exact[j] <= sel.rule.upper[j] + 1e-9)
            above = sel.rule.listed_above()  # and every listing the tests certified
            wrong += int((above & (exact[:, None] < exact[None, :] - eps - 1e-9)).sum())
            if sel.rule.finished:
                break
        res = sel.result()
        best = float(exact.max())
        assert len(res.selected) == 1 and res.done
        assert exact[names.index(res.selected[0])] >= best - eps - 1e-9
        for m in res.models:
            if m.status == "not-best":  # a drop is right: the model is not the bank's best
                assert exact[names.index(m.model)] < best
        early += sel.rule.n < n
        if sel.rule.n == n:  # exhausted: the exact best is chosen
            assert res.selected[0] == names[int(np.argmax(exact))]
    assert wrong == 0 and "history" in res.guarantee and "'best model' betting test per model" in res.guarantee
    assert "each model" in res.guarantee and "paired difference" in res.guarantee  # both families, named
    assert early >= 1  # the rule stopped before the bank's end on some banks
