"""Scale paths: the Gram-matrix ranking equals the per-pair ranking; one replay actor serves many models."""

from __future__ import annotations

import numpy as np
import pytest

from certeval.errors import InputError
from certeval.estimators.distribution.comparison import ComparisonDesign
from certeval.estimators.distribution.ranking import RankingOptions, rank_models


def _scores(rng, m, n, binary=True):
    ability = rng.normal(0, 0.6, m)
    item = rng.normal(0, 1.0, n)
    p = 1 / (1 + np.exp(-(ability[:, None] + item[None, :])))
    return (rng.random((m, n)) < p).astype(float) if binary else rng.beta(2 * p + 0.1, 2 * (1 - p) + 0.1)


def _same(r1, r2):
    assert r1.models == r2.models and r1.tie_groups == r2.tie_groups and r1.items_used == r2.items_used
    t1, t2 = r1.pairs, r2.pairs
    assert np.array_equal(t1.verdict, t2.verdict) and np.array_equal(t1.look, t2.look)
    assert np.array_equal(t1.used, t2.used)
    for key in ("diff", "lower", "upper"):
        a, b = getattr(t1, key), getattr(t2, key)
        assert np.array_equal(np.isnan(a), np.isnan(b))
        np.testing.assert_allclose(a[~np.isnan(a)], b[~np.isnan(b)], rtol=0, atol=1e-12)
    for c1, c2 in zip(r1.comparisons, r2.comparisons):
        assert (c1.model_a, c1.model_b, c1.verdict, c1.rule, c1.look, c1.n_items, c1.exact) == \
            (c2.model_a, c2.model_b, c2.verdict, c2.rule, c2.look, c2.n_items, c2.exact)


CASES = [
    dict(binary=True, design=None, subsets=False, margin=0.0),
    dict(binary=True, design=None, subsets=True, margin=0.02),
    dict(binary=False, design=None, subsets=True, margin=0.05),
    dict(binary=True, design=ComparisonDesign(statistic="unpaired", spending="ld-obf"), subsets=False, margin=0.0),
    dict(binary=True, design=ComparisonDesign(statistic="unpaired"), subsets=True, margin=0.0),
    dict(binary=False, design=ComparisonDesign(goal="improvement", margin=0.02), subsets=False, margin=0.02),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_gram_path_equals_pairs_path(case):
    """Same verdicts, looks, items and tie groups; diff and bounds equal to rounding (random data, 12 models)."""
    c = CASES[case]
    rng = np.random.default_rng(100 + case)
    m, n = 12, 400
    scores = _scores(rng, m, n, c["binary"])
    names = [f"m{k:02d}" for k in range(m)]
    looks = [1, 20, 50, 51, 100, 170, 250, 400]  # includes a 1-item look (variance undefined) and unequal steps
    kw = dict(options=RankingOptions(0.05, c["margin"], c["design"]))
    if c["subsets"]:
        codes = rng.integers(0, 3, n)
        kw.update(subsets=codes, n_subsets=3)
    r_pairs = rank_models(scores, names, looks, path="pairs", **kw)
    r_gram = rank_models(scores, names, looks, path="gram", **kw)
    _same(r_pairs, r_gram)
    assert r_pairs.pairs.decided.any() and (r_pairs.pairs.look > 1).any()  # something to compare


def test_gram_path_with_stopped_models_and_auto_switch():
    """Two far-apart groups decide early; 'auto' picks Gram above the size threshold and agrees."""
    rng = np.random.default_rng(7)
    scores = np.vstack([_scores(rng, 5, 600) * 0, _scores(rng, 5, 600)])
    scores[:5] = (rng.random((5, 600)) < 0.1)
    scores[5:] = (rng.random((5, 600)) < 0.9)
    names = [f"m{k}" for k in range(10)]
    looks = list(range(50, 601, 50))
    r1 = rank_models(scores, names, looks, path="pairs")
    r2 = rank_models(scores, names, looks, path="gram")
    _same(r1, r2)
    assert set(r2.undecided_models()) <= set(names)
    assert len(r2.tie_groups) >= 2


def test_gram_path_detects_a_wrong_statistic():
    """The equality check is sharp: a Gram path without the cross term (Σd² = q_a + q_b) disagrees."""
    from certeval.estimators.distribution import ranking as rk

    rng = np.random.default_rng(3)
    scores = _scores(rng, 8, 300)
    names = [f"m{k}" for k in range(8)]
    looks = list(range(50, 301, 50))
    good = rank_models(scores, names, looks, path="gram")
    original = rk._pair_mean_var

    def broken(sums, squares, gram, counts, a, b, plain):
        return original(sums, squares, np.zeros_like(gram), counts, a, b, plain)

    rk._pair_mean_var = broken
    try:
        bad = rank_models(scores, names, looks, path="gram")
    finally:
        rk._pair_mean_var = original
    assert not np.allclose(good.pairs.upper, bad.pairs.upper)


def test_gram_path_rejects_anytime_and_bad_path():
    scores = np.random.default_rng(0).integers(0, 2, (3, 50)).astype(float)
    with pytest.raises(InputError, match="anytime"):
        rank_models(scores, list("abc"), [50], options=RankingOptions(design=ComparisonDesign(guarantee="anytime")),
                    path="gram")
    with pytest.raises(InputError, match="path"):
        rank_models(scores, list("abc"), [50], path="fast")


def test_large_ranking_is_compact():
    """300 models (44,850 pairs): the Gram path needs no per-pair objects until asked (its speed is measured in
    benchmarks/scale.py, not here)."""
    rng = np.random.default_rng(11)
    scores = _scores(rng, 300, 493)
    names = [f"m{k:03d}" for k in range(300)]
    r = rank_models(scores, names, list(range(50, 494, 50)) + [493])
    d = r.to_dict(comparisons=False)
    assert d["n_pairs"] == 300 * 299 // 2 and "comparisons" not in d
    assert len(r.pairs.columns()["verdict"]) == d["n_pairs"]


def test_one_worker_serves_many_replay_models_from_one_table(tmp_path):
    """Replay specs of one file form one actor group; its worker answers each model's recorded scores
    and writes each model's cache; other backends keep their own group."""
    from certeval.hosting.pool_groups import group_models
    from certeval.hosting.replay import ReplayTable
    from certeval.hosting.worker import ModelWorker
    from certeval.inputs.banks import load_scores
    from certeval.storage import ScoreCache, filesystem

    frame = load_scores("bundled:helm_mmlu")
    names = sorted(frame["model"].unique())[:3]
    specs = {n: f"replay:bundled:helm_mmlu#{n}" for n in names}
    groups = group_models({**specs, "lm": "hf:bundled:smollm2", "solo": "replay:bundled:openllm_arc#x"})
    assert sorted(map(sorted, groups.values())) == sorted([sorted(names), ["lm"], ["solo"]])
    assert "lm" in groups and "solo" in groups
    caches = {n: str(tmp_path / f"c{i}") for i, n in enumerate(names)}
    worker = ModelWorker(specs, caches, None)
    assert len({id(h.table) for h in worker.hosts.values()}) == 1
    assert ReplayTable.shared("bundled:helm_mmlu") is next(iter(worker.hosts.values())).table
    ids = list(frame["item_id"].drop_duplicates()[:7])
    parts = [(n, [{"item_id": i} for i in ids], [f"k{i}" for i in ids]) for n in names]
    out = worker.score(parts)
    truth = frame.set_index(["model", "item_id"])["score"]
    for n, results in zip(names, out):
        assert [r["score"] for r in results] == [float(truth[(n, i)]) for i in ids]
        assert set(ScoreCache(*filesystem(caches[n])).load()) == {f"k{i}" for i in ids}
