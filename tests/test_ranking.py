"""Ranking: family-wise error with exact ties, tie groups, model dropping; the unadjusted variant fails."""

from __future__ import annotations

import math

import numpy as np
import pytest

from certeval.errors import InputError
from certeval.estimators.distribution.comparison import ComparisonDesign
from certeval.estimators.distribution.ranking import RankingOptions, rank_models, tie_groups

ACC = np.array([0.55, 0.55, 0.62, 0.62, 0.70, 0.80])  # two exact ties: (0,1) and (2,3)
NAMES = [f"m{k}" for k in range(6)]
N, REPS, ALPHA = 1000, 300, 0.05
LOOKS = list(range(100, N + 1, 100))


def _family_errors(ranking, true_diff, margin):
    errors = 0
    for c in ranking.comparisons:
        d = true_diff[(c.model_a, c.model_b)]
        if (c.verdict == "a>b" and d <= 0) or (c.verdict == "b>a" and d >= 0) or \
                (c.verdict == "equivalent" and abs(d) > margin):
            errors += 1
    return errors


def _simulate(correction, design=None, margin=0.0, seed=123):
    rng = np.random.default_rng(seed)
    true_diff = {(NAMES[i], NAMES[j]): ACC[i] - ACC[j] for i in range(6) for j in range(i + 1, 6)}
    fwe = []
    for _ in range(REPS):
        item = rng.normal(0, 1.0, N)  # item difficulty shared by every model: positively correlated scores
        p = 1 / (1 + np.exp(-(np.log(ACC / (1 - ACC))[:, None] + item[None, :])))
        p = p - p.mean(axis=1, keepdims=True) + ACC[:, None]  # exact target accuracies (ties stay exact)
        scores = (rng.random((6, N)) < np.clip(p, 0, 1)).astype(float)
        r = rank_models(scores, NAMES, LOOKS, options=RankingOptions(ALPHA, margin, design, correction))
        fwe.append(_family_errors(r, true_diff, margin) > 0)
    return float(np.mean(fwe))


def test_family_wise_error_with_two_exact_ties_is_at_most_alpha():
    rate = _simulate("bonferroni", margin=0.02)
    assert rate <= ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / REPS)


def test_unadjusted_fixed_sample_test_at_every_look_fails_the_same_check():
    # no multiplicity correction and the fixed-sample 1.96 at every look (a one-look "design" reused)
    class Fixed(ComparisonDesign):
        def interval(self, a, b, look_n, n_total, subsets=None, n_subsets=None):
            d = a - b
            diff = d.mean(-1)
            se = np.sqrt(np.maximum(d.var(-1, ddof=1), 1 / d.shape[-1]) / d.shape[-1])
            return diff, diff - 1.959964 * se, diff + 1.959964 * se

    rate = _simulate("none", design=Fixed(alpha=ALPHA), margin=0.02)
    assert rate > ALPHA + 3 * math.sqrt(ALPHA * (1 - ALPHA) / REPS)


def test_ranking_orders_separated_models_and_drops_decided_ones():
    rng = np.random.default_rng(0)
    acc = np.array([0.9, 0.6, 0.3])
    scores = (rng.random((3, 2000)) < acc[:, None]).astype(float)
    r = rank_models(scores, ["a", "b", "c"], list(range(100, 2001, 100)))
    assert r.models == ("a", "b", "c") and r.tie_groups == (("a",), ("b",), ("c",))
    assert all(c.verdict == "a>b" for c in r.comparisons)
    assert max(r.items_used) < 2000 and r.fraction_used < 0.2  # stopped early, every model dropped
    d = r.to_dict()
    assert d["correction"] == "bonferroni" and len(d["comparisons"]) == 3
    assert r.rank_of("b") == 2


def test_tie_groups_follow_the_leader():
    means = np.array([0.9, 0.85, 0.5, 0.48])
    sep = np.ones((4, 4), bool)
    sep[0, 1] = sep[1, 0] = False
    sep[2, 3] = sep[3, 2] = False
    assert tie_groups(list("abcd"), means, sep) == [[0, 1], [2, 3]]


@pytest.mark.parametrize("scores,names,match", [
    (np.zeros((1, 10)), ["a"], "two models"),
    (np.zeros((2, 0)), ["a", "b"], "share no"),
    (np.full((2, 5), np.nan), ["a", "b"], "share no"),
    (np.zeros((3, 5)), ["a", "b"], "one row per name"),
])
def test_bad_input(scores, names, match):
    with pytest.raises(InputError, match=match):
        rank_models(scores, names, [5])


@pytest.mark.parametrize("dataset", ["helm_mmlu", "helm_raft", "helm_v023", "vlm_hallusionbench", "vlm_ocrbench",
                                     "opencompass_large", "openllm_tiny", "openllm_arc", "chembench"])
@pytest.mark.slow
def test_rank_order_agrees_with_every_directional_verdict(dataset):
    """Order and verdicts answer one estimand (mean-of-means on banks with sub-datasets): a model certified
    better than another is never ranked below it."""
    from certeval.estimators.distribution.ranking import rank_models
    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

    frame = load_scores(f"bundled:{dataset}")
    bank = bank_from_scores(frame)
    models = sorted(frame["model"].unique())
    picks = [models[i] for i in np.random.default_rng(0).choice(len(models), size=min(12, len(models)),
                                                                 replace=False)]
    order = np.random.default_rng(1).permutation(bank.n_items)
    x = score_matrix(frame, picks, bank)[:, order]
    codes = None if bank.subsets is None else bank.spec().subset_codes()[order]
    n = bank.n_items
    step = max(100, n // 20)
    looks = list(range(step, n, step)) + [n]
    r = rank_models(x, picks, looks, subsets=codes, n_subsets=None if codes is None else int(codes.max()) + 1)
    place = {name: i for i, name in enumerate(r.models)}
    for a, b, verdict in zip(r.pairs.a, r.pairs.b, r.pairs.verdict):
        name_a, name_b = picks[a], picks[b]
        if verdict == 1:  # a>b
            assert place[name_a] < place[name_b], (name_a, name_b)
        elif verdict == 2:  # b>a
            assert place[name_b] < place[name_a], (name_a, name_b)
