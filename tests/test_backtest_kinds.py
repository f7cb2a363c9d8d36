"""The one backtest driver runs every kind of cell: a rep's row depends on its seed (root seed, dataset, models,
method, rep), never on the chunk it ran in, the cells beside it or Ray."""

from __future__ import annotations

import numpy as np
import pytest

from certeval.backtests.cells import FAQ_BUDGET, PAIRED, Cell, DatasetArrays, uninformative_factors
from certeval.backtests.comparative import ComparativeBacktest, compare_backtest, rank_backtest
from certeval.backtests.faq import evaluate_new_models, faq_dataset
from certeval.backtests.kinds import run_chunk
from certeval.backtests.ray_fanout import FanOut, run_cells
from certeval.errors import InputError
from certeval.estimators import BankSpec
from certeval.estimators.faq.querying import FactorPrior
from certeval.estimators.faq.simulation import simulate_faq
from certeval.estimators.groups import GroupRequest


def _matrix(n_models: int = 5, n_items: int = 300, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    p = np.linspace(0.35, 0.75, n_models)
    return (rng.random((n_models, n_items)) < p[:, None]).astype(float)


def _paired_data(n_models: int = 5) -> DatasetArrays:
    return DatasetArrays("synth", BankSpec(n_items=300), tuple(f"m{i}" for i in range(n_models)), _matrix(n_models))


def _paired_cell(kind: str, reps: int, rows=None, **request) -> Cell:
    return Cell("synth", kind, kind, reps, 50, kind=PAIRED, rows=rows,
                request=GroupRequest(kind=kind, labels=(), look_size=50, **request))


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


@pytest.mark.parametrize("kind", ["compare", "rank"])
def test_a_paired_rep_is_the_same_alone_or_in_a_chunk_with_others(kind):
    data = _paired_data()
    rows = (1, 2) if kind == "compare" else None
    cell = _paired_cell(kind, 6, rows, margin=0.02)
    other = _paired_cell(kind, 6, (0, 3) if kind == "compare" else (0, 1, 4), margin=0.02)
    alone = [run_chunk(data, cell, rep, rep + 1, 7)[0] for rep in range(6)]
    together = run_cells({"synth": data}, [other, cell], 7, fan_out=FanOut(chunk_reps=4))[6:]
    in_one_chunk = run_chunk(data, cell, 0, 6, 7)
    assert _strip(alone) == _strip(together) == _strip(in_one_chunk)
    key = "verdict" if kind == "compare" else "tie_groups"
    differ = "n_items" if kind == "compare" else "fraction_used"
    assert len({str(r[key]) + str(r[differ]) for r in alone}) > 1  # the reps really draw different orders
    assert [r["rep"] for r in together] == list(range(6))


def test_compare_backtest_pairs_do_not_depend_on_which_other_pairs_run():
    """A pair's verdicts are keyed by its models: sampling fewer pairs leaves the kept pair's reps unchanged."""
    matrix = _matrix(4)[[1, 0, 2, 3]]  # a and c: 0.48 and 0.62, decided at different looks across reps
    request = GroupRequest(kind="compare", labels=(), margin=0.0, look_size=50)
    names = ("a", "b", "c", "d")

    def pairs(keep):
        bt = ComparativeBacktest(matrix[list(keep)], tuple(names[k] for k in keep), BankSpec(n_items=300), request,
                                 reps=5, seed=3, looks_every=50, name="synth")
        return {(p["model_a"], p["model_b"]): p for p in compare_backtest(bt)["pairs"]}

    every, two = pairs(range(4)), pairs((0, 2))
    kept, alone = dict(every[("a", "c")]), dict(two[("a", "c")])
    # the bank difference is a mean over another matrix's rows: equal up to rounding
    assert kept.pop("bank_diff") == pytest.approx(alone.pop("bank_diff"), abs=1e-12)
    assert list(two) == [("a", "c")] and kept == alone


def test_rank_backtest_keeps_its_per_rep_extras_and_rep_zero_details():
    bt = ComparativeBacktest(_matrix(), tuple(f"m{i}" for i in range(5)), BankSpec(n_items=300),
                             GroupRequest(kind="rank", labels=(), margin=0.02, look_size=50), reps=3, seed=1,
                             looks_every=50)
    out = rank_backtest(bt)
    first, later = out["rankings"][0], out["rankings"][1]
    assert {"models", "means", "items_used", "comparisons", "kendall_tau", "errors"} <= set(first)
    assert "models" not in later and "wall_s" not in later and "dataset" not in later
    assert [r["rep"] for r in out["rankings"]] == [0, 1, 2]
    # five well-separated models: every rep lists them apart, in the bank's order (tau 1 against the exact means)
    exact_order = out["summary"]["full_bank_order"]
    assert exact_order == ["m4", "m3", "m2", "m1", "m0"]
    for r in out["rankings"]:
        assert r["tie_groups"] == [[m] for m in exact_order] and r["errors"] == 0
        assert r["kendall_tau"] == pytest.approx(1.0, abs=1e-12)
    assert out["summary"]["kendall_tau_mean"] == pytest.approx(np.mean([r["kendall_tau"] for r in out["rankings"]]))
    assert out["summary"]["fraction_used"] == pytest.approx(np.mean([r["fraction_used"] for r in out["rankings"]]))
    # wall time: recorded, never asserted on (no wall-clock asserts)
    assert np.isfinite(out["summary"]["wall_s_per_rep"]) and out["summary"]["wall_s_per_rep"] >= 0


def _faq_data(n_models: int = 3, n_items: int = 120) -> DatasetArrays:
    return DatasetArrays("synth", BankSpec(n_items=n_items), tuple(f"m{i}" for i in range(n_models)),
                         _matrix(n_models, n_items, seed=2), faq=uninformative_factors(n_items, "mean"))


def _faq_cell(reps: int) -> Cell:
    return Cell("synth", "faq", "budget", reps, 2, (("budgets", (12, 30)), ("confidence", 0.95), ("tau", 0.1)),
                label="faq-budget", kind=FAQ_BUDGET)


def _assert_faq_rows_equal(a, b):
    """Same draws; the vectorised arithmetic over a chunk's runs may round the last bit differently."""
    for x, y in zip(a, b, strict=True):
        assert (x["rep"], x["model"]) == (y["rep"], y["model"])
        for bx, by in zip(x["budgets"], y["budgets"], strict=True):
            assert bx["budget"] == by["budget"] and bx["distinct"] == by["distinct"]
            for key in ("default", "paper", "anytime", "uniform"):
                np.testing.assert_allclose(bx[key], by[key], rtol=1e-12, atol=1e-15)


def test_a_faq_budget_rep_is_the_same_alone_or_in_a_chunk_with_others():
    data = _faq_data()
    cell = _faq_cell(9)
    alone = [run_chunk(data, cell, rep, rep + 1, 5)[0] for rep in range(9)]
    chunked = run_cells({"synth": data}, [cell], 5, fan_out=FanOut(chunk_reps=4))
    _assert_faq_rows_equal(alone, chunked)
    _assert_faq_rows_equal(chunked, run_chunk(data, cell, 0, 9, 5))
    assert [r["model"] for r in chunked[:4]] == ["m0", "m1", "m2", "m0"]  # rep r evaluates model r % M
    assert len({r["budgets"][0]["default"][0] for r in chunked}) > 3


def test_evaluate_new_models_does_not_depend_on_chunk_rows():
    data = _faq_data()
    arrays = data.faq
    new = faq_dataset(data.matrix, arrays["item_factors"], arrays["prior_mean"], arrays["prior_cov"])
    run = lambda chunk: evaluate_new_models(new, [12, 30], 4, 8, chunk_rows=chunk)  # noqa: E731
    a, b = run(5), run(2000)
    assert set(a) == {12, 30}
    for budget in a:
        for key, value in a[budget]["summary"].items():
            assert value == pytest.approx(b[budget]["summary"][key], rel=1e-9, abs=1e-15), key
    with pytest.raises(InputError, match="models must name"):
        faq_dataset(data.matrix, arrays["item_factors"], arrays["prior_mean"], arrays["prior_cov"], models=["x"])


def test_simulate_faq_with_one_generator_per_run_is_each_run_on_its_own():
    data = _faq_data()
    a = data.faq
    prior = FactorPrior(a["item_factors"], a["prior_mean"], a["prior_cov"])
    together = simulate_faq(data.matrix, prior, 20, [np.random.default_rng(s) for s in (1, 2, 3)], batch_size=3)
    for i, s in enumerate((1, 2, 3)):
        one = simulate_faq(data.matrix[i:i + 1], prior, 20, np.random.default_rng(s), batch_size=3)
        assert np.array_equal(together["item"][i], one["item"][0])
        np.testing.assert_allclose(together["q_item"][i], one["q_item"][0], rtol=1e-12)
    with pytest.raises(InputError, match="one per run"):
        simulate_faq(data.matrix, prior, 5, [np.random.default_rng(0)])


def test_a_cell_of_unknown_kind_or_a_paired_cell_without_request_is_refused():
    with pytest.raises(InputError, match="kind must be one of"):
        Cell("synth", "rank", "rank", 1, 50, kind="pairs")
    with pytest.raises(InputError, match="needs a request"):
        Cell("synth", "rank", "rank", 1, 50, kind=PAIRED)


@pytest.mark.slow
def test_every_kind_gives_the_in_process_numbers_on_ray():
    paired = _paired_data()
    faq = _faq_data()
    faq = DatasetArrays("faqsynth", faq.spec, faq.models, faq.matrix, faq=faq.faq)
    datasets = {"synth": paired, "faqsynth": faq}
    cells = [Cell("synth", "uniform", "halfwidth:0.1", 4, 20), _paired_cell("rank", 3, margin=0.02),
             _paired_cell("compare", 3, (0, 4)), Cell("faqsynth", "faq", "budget", 6, 2, _faq_cell(6).params,
                                                      label="faq-budget", kind=FAQ_BUDGET)]
    on_ray = run_cells(datasets, cells, 4, fan_out=FanOut(use_ray=True, chunk_reps=2))
    local = run_cells(datasets, cells, 4, fan_out=FanOut(chunk_reps=3))
    drop = {"wall_s", "controller_s"}
    split = lambda rows: [{k: v for k, v in r.items() if k not in drop} for r in rows]  # noqa: E731
    assert split(on_ray[:10]) == split(local[:10])  # certify, rank, compare
    _assert_faq_rows_equal(on_ray[10:], local[10:])
