"""Bank target end to end (real Prefect flows, real Ray replay actors): rank resumes into the same result
(incremental estimator replayed once), rank --history records its history and agrees with the exact bank
order, select --history selects within epsilon of the exact best, and the target is stated in results.json; bad --target / --top input exits 2 before anything runs."""

from __future__ import annotations

import numpy as np
import pytest

from certeval.cli import main
from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix
from certeval.requests import Compare, Rank, Select
from certeval.runs.plan import make_plan

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK, replay, small_scores

pytestmark = pytest.mark.slow


def _exact(scores: str, models) -> np.ndarray:
    frame = load_scores(scores)
    bank = bank_from_scores(frame)
    return score_matrix(frame, list(models), bank) @ bank.spec().weights()


def test_bank_rank_states_its_target_and_resumes_into_the_same_ranking(infra, tmp_path):
    from certeval.flows.pipeline import run_plan
    from certeval.runs.run import Run

    models = (STRONG, MIDDLE, WEAK)
    plan, _ = make_plan(Rank(models=[replay(m) for m in models], batch_size=50, seed=5, margin=0.02,
                                    output=str(tmp_path / "runs"), run_id="bank-rank"))
    res = run_plan(plan)
    assert res["target"] == "bank" and res["config"]["target"] == "bank"
    exact = dict(zip(models, _exact(SCORES, models)))
    for p in res["pairs"]:
        d = exact[p["model_a"]] - exact[p["model_b"]]
        assert p["lower"] - 1e-9 <= d <= p["upper"] + 1e-9 and p["verdict"] in ("a>b", "b>a")
    assert res["ranking"]["tie_groups"] == [[STRONG], [MIDDLE], [WEAK]]
    for m in res["models"]:  # the ranking's own simultaneous intervals cover the exact bank means
        assert m["lower"] - 1e-9 <= exact[m["model"]] <= m["upper"] + 1e-9
    run = Run.open(plan)  # resume: the stored rounds replayed once through the incremental estimator
    run.restore()
    again = run.engine.outcome.to_dict(comparisons=True)
    assert again["tie_groups"] == res["ranking"]["tie_groups"]
    assert [c["lower"] for c in again["comparisons"]] == [p["lower"] for p in res["pairs"]]


def test_distribution_target_answers_every_interval_for_the_distribution(infra, tmp_path):
    from certeval.flows.pipeline import run_plan

    plan, _ = make_plan(Compare(models=[replay(STRONG), replay(WEAK)], batch_size=50, seed=1,
                                    target="distribution", output=str(tmp_path / "runs"), run_id="cmp-dist"))
    res = run_plan(plan)
    assert res["target"] == "distribution" and res["pairs"][0]["verdict"] == "a>b"
    assert {m["estimate"]["target"] for m in res["models"]} == {"distribution"}
    assert res["pairs"][0]["statistic"] == "paired"  # the group-sequential test, not the bank CS


def test_rank_with_history_records_it_and_agrees_with_the_exact_bank(infra, tmp_path):
    from certeval.flows.pipeline import run_plan

    scores = small_scores(tmp_path, n_items=150)
    models = (STRONG, MIDDLE, WEAK)
    plan, _ = make_plan(Rank(models=[replay(m, scores) for m in models], history=[SCORES], batch_size=25,
                                    seed=3, output=str(tmp_path / "runs"), run_id="rank-hist"))
    res = run_plan(plan)
    assert res["target"] == "bank" and res["history"]["comparison_target"] == "bank"
    assert all(m["history"]["n_models"] > 0 for m in res["models"])  # the other models, never itself
    exact = dict(zip(models, _exact(scores, models)))
    for p in res["pairs"]:
        d = exact[p["model_a"]] - exact[p["model_b"]]
        assert p["lower"] - 1e-9 <= d <= p["upper"] + 1e-9
        assert p["statistic"] == "paired-wor" and "history" in p["guarantee"]
    flat = [m for g in res["ranking"]["tie_groups"] for m in g]
    assert flat.index(STRONG) < flat.index(WEAK)


def test_select_with_history_records_it_and_selects_the_exact_best(infra, tmp_path):
    from certeval.flows.pipeline import run_plan

    scores = small_scores(tmp_path, n_items=150)
    models = (STRONG, MIDDLE, WEAK)
    plan, _ = make_plan(Select(models=[replay(m, scores) for m in models], history=[SCORES], batch_size=25,
                                    seed=4, halfwidth=0.02, output=str(tmp_path / "runs"), run_id="select-hist"))
    res = run_plan(plan)
    exact = dict(zip(models, _exact(scores, models)))
    assert res["target"] == "bank" and res["history"]["comparison_target"] == "bank"
    assert all(m["history"]["n_models"] > 0 for m in res["models"])  # the other models, never itself
    sel = res["selection"]
    assert "history" in sel["guarantee"] and len(sel["selected"]) == 1
    assert exact[sel["selected"][0]] >= max(exact.values()) - 0.02 - 1e-9
    for m in sel["models"]:
        assert m["lower"] - 1e-9 <= exact[m["model"]] <= m["upper"] + 1e-9


@pytest.mark.parametrize("argv, match", [
    (["certify", "--goal", "halfwidth:0.1", "--target", "bank"], "unrecognized arguments|--target"),
    (["rank", "--target", "population"], "invalid choice|--target"),
    (["select", "--top", "4"], "--top"),
    (["select", "--mode", "precision"], "--mode precision"),
    (["select", "--target", "distribution", "--halfwidth", "0.1"], "--threshold"),
])
def test_bad_target_input_exits_2_before_anything_runs(argv, match, tmp_path, capsys):
    models = ["--model", replay(STRONG), "--model", replay(WEAK)]
    try:
        code = main(argv[:1] + models + argv[1:] + ["--output", str(tmp_path / "runs")])
    except SystemExit as exc:  # argparse's own refusals (unknown option, invalid choice) exit 2 too
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and len([line for line in err.strip().splitlines() if line.strip()]) >= 1
    assert any(s in err for s in match.split("|"))
    assert not (tmp_path / "runs").exists()
