"""Backtest fan-out: same numbers in-process and on Ray, seeds keyed by what a rep is, coverage checks."""

from __future__ import annotations

import numpy as np
import pytest

from certeval.backtests.cells import Cell, DatasetArrays, rep_seed, replay_one
from certeval.backtests.ray_fanout import FanOut, FaqFit, dataset_arrays, run_cells
from certeval.backtests.summary import summarise
from certeval.engine import Replay
from certeval.estimators import BankSpec, Estimate, parse_goal, register
from certeval.estimators.single.uniform import UniformMethod


@register
class _NarrowUniform(UniformMethod):
    """Deliberately miscalibrated: the uniform interval shrunk to 30% of its width."""

    name = "test-narrow-uniform"

    def result(self) -> Estimate:
        est = super().result()
        if est.n_scored == 0:
            return est
        mid, half = est.mean, 0.3 * est.halfwidth
        return Estimate(**{**est.__dict__, "lower": mid - half, "upper": mid + half, "subsets": ()})


def _synthetic(n_models: int = 6, n_items: int = 400, seed: int = 0) -> DatasetArrays:
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.3, 0.8, n_models)
    matrix = (rng.random((n_models, n_items)) < p[:, None]).astype(float)
    return DatasetArrays("synth", BankSpec(n_items=n_items), tuple(f"m{i}" for i in range(n_models)), matrix)


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "controller_s"} for r in rows]


def test_rep_seed_is_keyed_by_identity_not_order():
    a = rep_seed(7, "d", "m", "uniform", 3).generate_state(4)
    assert np.array_equal(a, rep_seed(7, "d", "m", "uniform", 3).generate_state(4))
    for other in (rep_seed(8, "d", "m", "uniform", 3), rep_seed(7, "d", "m2", "uniform", 3),
                  rep_seed(7, "d", "m", "seq", 3), rep_seed(7, "d", "m", "uniform", 4)):
        assert not np.array_equal(a, other.generate_state(4))


def test_results_do_not_depend_on_chunking_or_cell_order():
    data = {"synth": _synthetic()}
    cells = [Cell("synth", "uniform", "halfwidth:0.1", 9, 20), Cell("synth", "seq", "halfwidth:0.1", 9, 20)]
    a = run_cells(data, cells, 11, fan_out=FanOut(chunk_reps=2))
    b = run_cells(data, cells[::-1], 11, fan_out=FanOut(chunk_reps=9))
    key = lambda r: (r["method"], r["rep"])  # noqa: E731
    assert sorted(_strip(a), key=key) == sorted(_strip(b), key=key)
    assert len({r["n_scored"] for r in a if r["method"] == "uniform"}) > 1  # reps really differ


def test_replay_one_curve_matches_the_plain_loop():
    d = _synthetic()
    goal = parse_goal("halfwidth:0.08")
    plain = replay_one(Replay("uniform", {}, goal, 25), d.spec, d.matrix[0], np.random.default_rng(5))
    traced = replay_one(Replay("uniform", {}, goal, 25), d.spec, d.matrix[0], np.random.default_rng(5),
                        record_curve=True)
    assert (plain.n_scored, plain.lower, plain.upper) == (traced.n_scored, traced.lower, traced.upper)
    assert traced.curve[-1][0] == traced.n_scored and len(traced.curve) == traced.looks
    assert plain.truth == pytest.approx(d.matrix[0].mean())


def test_coverage_check_passes_a_valid_interval_and_fails_a_miscalibrated_one():
    """200 reps each: uniform's anytime-valid interval covers; a 30%-width copy must not."""
    data = {"synth": _synthetic(n_models=8, n_items=600, seed=1)}
    cells = [Cell("synth", m, "halfwidth:0.06", 200, 20) for m in ("uniform", "test-narrow-uniform")]
    summary = {c["method"]: c for c in summarise(run_cells(data, cells, 2026, fan_out=FanOut(chunk_reps=50)))}
    assert summary["uniform"]["coverage"] >= 0.95
    assert summary["test-narrow-uniform"]["coverage"] < 0.85
    assert summary["uniform"]["items_ratio_vs_uniform"] == 1.0
    assert summary["test-narrow-uniform"]["items_ratio_vs_uniform"] < 1.0  # stops early, that is the point


@pytest.mark.slow
def test_ray_path_gives_the_in_process_numbers(tmp_path):
    data = {"helm_mmlu": dataset_arrays("helm_mmlu", max_eval_models=5)}
    cells = [Cell("helm_mmlu", m, "halfwidth:0.1", 6, 20) for m in ("uniform", "adaptive")]
    seen = []
    on_ray = run_cells(data, cells, 3, fan_out=FanOut(use_ray=True, chunk_reps=2), progress=lambda d, t, w: seen.append((d, t)))
    local = run_cells(data, cells, 3, fan_out=FanOut(chunk_reps=6))
    assert _strip(on_ray) == _strip(local)
    assert seen[-1] == (6, 6) and len(seen) == 6
    assert len(summarise(on_ray)) == 2  # one summary cell per method


# --------------------------------------------------------------------------------------
# FAQ (Wu et al. 2026, arXiv:2601.20251) cells
# --------------------------------------------------------------------------------------


def test_faq_cells_replay_with_fitted_and_uninformative_factors(tmp_path):
    from certeval.backtests.cells import faq_cell

    fit = {"n_factors": 2, "penalty": 1.0}  # fixed K, λ: no cross-validation in a unit test
    data = dataset_arrays("helm_raft", max_eval_models=2, faq=FaqFit(cache=tmp_path, params=fit))
    assert data.faq["item_factors"].shape == (data.spec.n_items, 2) and data.notes["faq"]["cached"] is False
    again = dataset_arrays("helm_raft", max_eval_models=2, faq=FaqFit(cache=tmp_path, params=fit))
    assert isinstance(again.notes["faq"]["cached"], str)  # the cached fit, same arrays
    assert np.array_equal(again.faq["item_factors"], data.faq["item_factors"])
    cells = [faq_cell("helm_raft", "halfwidth:0.1", 4, 10, factors=f) for f in ("history", "mean", "none")]
    rows = run_cells({"helm_raft": data}, cells, 5, record_errors=True)
    assert len(rows) == 12 and not any("error" in r for r in rows)
    assert {r["method"] for r in rows} == {"faq", "faq-uniform", "faq-uniform-half"}
    # draws may pass N (re-draws reuse a cached score), never the cap; model calls never pass N
    assert all(r["n_distinct"] <= min(r["n_scored"], data.spec.n_items) for r in rows)
    assert all(r["n_scored"] <= 10 * data.spec.n_items for r in rows)
    cells_out = {c["method"]: c for c in summarise(rows)}
    faq, base = cells_out["faq"], cells_out["faq-uniform"]
    by_cell = {m: [r for r in rows if r["method"] == m] for m in ("faq", "faq-uniform")}
    # items (model calls) are distinct items, and the same-guarantee ratio compares model calls
    assert faq["mean_items"] == pytest.approx(np.mean([r["n_distinct"] for r in by_cell["faq"]]))
    assert faq["mean_draws"] == pytest.approx(np.mean([r["n_scored"] for r in by_cell["faq"]]))
    assert faq["items_ratio_same_guarantee"] == pytest.approx(
        faq["mean_items"] / np.mean([r["n_distinct"] for r in by_cell["faq-uniform"]]))
    assert faq["same_guarantee_baseline"] == "faq-uniform" and faq["items_ratio_same_guarantee"] is not None
    assert base["items_ratio_same_guarantee"] == 1.0
    for c in (faq, base):
        assert 0 <= c["coverage"] <= 1 and len(c["coverage_ci95"]) == 2 and c["anytime_valid"]
        assert 0 <= c["reached_rate"] <= 1 and c["mean_items"] <= c["mean_draws"]


def test_faq_uniform_draws_uniformly_and_estimates_the_plain_mean():
    """Item-blind factors: q = (1−τ) w + τ/N, i.e. exactly 1/N and the sample mean for the plain bank mean."""
    from certeval.backtests.cells import faq_cell, faq_params
    from certeval.estimators import make_method

    goal = parse_goal("halfwidth:0.1")
    plain = dataset_arrays("helm_raft", features=None, mean_of_means=False)
    n = plain.spec.n_items
    row = plain.matrix[np.argmax(np.abs(plain.matrix.mean(axis=1) - 0.5))]  # the model furthest from 50%
    variance = {}
    for factors in ("mean", "none"):
        cell = faq_cell("helm_raft", "halfwidth:0.1", 1, 10, factors=factors)
        obj = make_method("faq", **faq_params(plain, cell, goal)).start(plain.spec)
        rng = np.random.default_rng(0)
        drawn = []
        for _ in range(20):
            prop = obj.propose(10, rng)
            assert np.allclose(prop.probs, 1.0 / n)
            obj.update(prop.items, row[prop.items])
            drawn.extend(row[prop.items])
        est = obj.result()
        assert est.mean == pytest.approx(np.mean(drawn))  # duplicates count once per draw
        variance[factors] = dict(est.extra)["variance_per_draw"]
    # a constant plug-in of 1/2 pins the variance at the worst case; learning the overall accuracy does not
    assert variance["none"] == pytest.approx(0.25) and variance["mean"] < 0.2
    # mean of sub-dataset means: the policy FAQ follows when it knows nothing about items (uniform within a subset)
    mom = dataset_arrays("helm_raft", max_eval_models=1, features=None)
    cell = faq_cell("helm_raft", "halfwidth:0.1", 1, 10, factors="mean")
    obj = make_method("faq", **faq_params(mom, cell, goal)).start(mom.spec)
    prop = obj.propose(10, np.random.default_rng(1))
    w = mom.spec.weights()
    assert np.allclose(prop.probs, 0.9 * w[prop.items] + 0.1 / mom.spec.n_items)


def test_faq_cells_check_their_inputs():
    from certeval.backtests.cells import faq_cell, faq_planned_draws
    from certeval.errors import InputError
    from certeval.estimators.faq.querying import anytime_radius

    d = _synthetic()
    with pytest.raises(InputError, match="without FAQ inputs"):
        run_cells({"synth": d}, [faq_cell("synth", "halfwidth:0.1", 1, 10)], 0)
    with pytest.raises(InputError, match="must not carry 'item_factors'"):
        run_cells({"synth": d}, [faq_cell("synth", "halfwidth:0.1", 1, 10, factors="mean", item_factors=[[0.0]])], 0)
    with pytest.raises(InputError, match="factors must be one of"):
        faq_cell("synth", "halfwidth:0.1", 1, 10, factors="text")
    # the anytime CS is tuned, before the run, where it would just reach the goal at variance 1/4
    big = BankSpec(n_items=10**6)
    n = faq_planned_draws(parse_goal("halfwidth:0.05"), big)
    assert anytime_radius(n, 0.25, 0.05, n) <= 0.05 < anytime_radius(n - 1, 0.25, 0.05, n - 1)
    assert faq_planned_draws(parse_goal("halfwidth:0.01"), d.spec) == 10 * d.spec.n_items  # capped like the draws
