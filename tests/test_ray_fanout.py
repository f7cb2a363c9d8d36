"""Backtest fan-out: same numbers in-process and on Ray, seeds keyed by what a rep is, coverage checks."""

from __future__ import annotations

import numpy as np
import pytest

from certeval.backtest.ray_fanout import (
    Cell, DatasetArrays, dataset_arrays, rep_seed, replay_one, run_cells, store_backtest, summarise,
)
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
    a = run_cells(data, cells, 11, chunk_reps=2)
    b = run_cells(data, cells[::-1], 11, chunk_reps=9)
    key = lambda r: (r["method"], r["rep"])  # noqa: E731
    assert sorted(_strip(a), key=key) == sorted(_strip(b), key=key)
    assert len({r["n_scored"] for r in a if r["method"] == "uniform"}) > 1  # reps really differ


def test_replay_one_curve_matches_the_plain_loop():
    d = _synthetic()
    goal = parse_goal("halfwidth:0.08")
    plain = replay_one("uniform", {}, d.spec, d.matrix[0], goal, 25, np.random.default_rng(5))
    traced = replay_one("uniform", {}, d.spec, d.matrix[0], goal, 25, np.random.default_rng(5), record_curve=True)
    assert (plain.n_scored, plain.lower, plain.upper) == (traced.n_scored, traced.lower, traced.upper)
    assert traced.curve[-1][0] == traced.n_scored and len(traced.curve) == traced.looks
    assert plain.truth == pytest.approx(d.matrix[0].mean())


def test_coverage_check_passes_a_valid_interval_and_fails_a_miscalibrated_one():
    """200 reps each: uniform's anytime-valid interval covers; a 30%-width copy must not."""
    data = {"synth": _synthetic(n_models=8, n_items=600, seed=1)}
    cells = [Cell("synth", m, "halfwidth:0.06", 200, 20) for m in ("uniform", "test-narrow-uniform")]
    summary = {c["method"]: c for c in summarise(run_cells(data, cells, 2026, chunk_reps=50))}
    assert summary["uniform"]["coverage"] >= 0.95
    assert summary["test-narrow-uniform"]["coverage"] < 0.85
    assert summary["uniform"]["items_ratio_vs_uniform"] == 1.0
    assert summary["test-narrow-uniform"]["items_ratio_vs_uniform"] < 1.0  # stops early, that is the point


@pytest.mark.slow
def test_ray_path_gives_the_in_process_numbers_and_stores_a_run(tmp_path):
    data = {"helm_mmlu": dataset_arrays("helm_mmlu", max_eval_models=5)}
    cells = [Cell("helm_mmlu", m, "halfwidth:0.1", 6, 20) for m in ("uniform", "adaptive")]
    seen = []
    on_ray = run_cells(data, cells, 3, use_ray=True, chunk_reps=2, progress=lambda d, t, w: seen.append((d, t)))
    local = run_cells(data, cells, 3, use_ray=False, chunk_reps=6)
    assert _strip(on_ray) == _strip(local)
    assert seen[-1] == (6, 6) and len(seen) == 6
    summary = summarise(on_ray)
    url = store_backtest(str(tmp_path / "bt"), {"seed": 3}, on_ray, summary)
    import json

    import pandas as pd

    stored = json.loads((tmp_path / "bt" / "results.json").read_text())
    assert stored["kind"] == "backtest" and len(stored["cells"]) == 2 and url.endswith("bt")
    assert len(pd.read_parquet(tmp_path / "bt" / "reps.parquet")) == 12


def test_one_call_backtest_stores_a_run_with_its_baseline(tmp_path):
    from certeval.backtest.ray_fanout import backtest

    out = backtest("bundled:helm_mmlu", "adaptive", "halfwidth:0.1", 4, 1, use_ray=False,
                   output=str(tmp_path / "run"), models=["openai_davinci", "openai_ada"], progress=None)
    cells = {c["method"]: c for c in out["cells"]}
    assert set(cells) == {"adaptive", "uniform"} and cells["uniform"]["items_ratio_vs_uniform"] == 1.0
    assert {p.name for p in (tmp_path / "run").iterdir()} == {"config.json", "reps.parquet", "results.json"}
    with pytest.raises(Exception, match="unknown model"):
        backtest("bundled:helm_mmlu", "adaptive", "halfwidth:0.1", 2, 1, use_ray=False, models=["nope"],
                 progress=None)
