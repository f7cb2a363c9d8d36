"""``--history`` end to end: real Prefect flows and Ray actors, history from recorded scores and from
earlier run folders, the look log read by the report, and bad history input refused before anything is
written (exit 2, one line)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from certeval.cli import main
from certeval.errors import InputError
from certeval.inputs.banks import load_scores
from certeval.reports.run_report import load_run, model_curves
from certeval.requests import Certify, Compare, Rank
from certeval.runs.plan import make_plan

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK, bank_diff, replay, small_scores

pytestmark = pytest.mark.slow


def _run(tmp_path, **kw):
    from certeval.flows.pipeline import run_plan

    kw.setdefault("output", str(tmp_path / "runs"))
    plan, _ = make_plan(Certify(**kw))
    return plan, run_plan(plan)


def _truth(model: str) -> float:
    frame = load_scores(SCORES)
    return float(frame[frame["model"] == model].groupby("subset")["score"].mean().mean())


def test_certify_with_history_uses_the_other_models_and_costs_no_more_items(infra, tmp_path):
    common = dict(models=[replay(MIDDLE)], goal="halfwidth:0.08", batch_size=30, seed=4)
    _, plain = _run(tmp_path, run_id="plain", **common)
    _, hist = _run(tmp_path, run_id="hist", history=[SCORES], **common)
    m, p = hist["models"][0], plain["models"][0]
    assert m["method"] == "history" and p["method"] == "adaptive"
    assert m["lower"] <= _truth(MIDDLE) <= m["upper"] and hist["reached"]
    # one seeded run each: history must not cost more than a batch or two beyond adaptive, which is itself tight
    # now (one joint CS, bets tuned to the goal); how much history saves is measured over 40 reps on every bank in
    # benchmarks/exact_items.py (helm_mmlu ±0.1: ×0.86 of uniform's items, ×0.71 of history-permuted's)
    assert m["n_scored"] <= p["n_scored"] + 2 * common["batch_size"], (m["n_scored"], p["n_scored"])
    info = m["history"]
    assert info["n_models"] == 43 and info["left_out_self"] is True and info["items_matched"] == 567
    assert MIDDLE not in info["models"] and hist["history"]["sources"] == [SCORES]
    # the look log: every round records its estimate; the report draws exactly those, ending at the result
    folder = tmp_path / "runs" / "hist"
    rounds = pd.concat(pd.read_parquet(f) for f in sorted((folder / "rounds").glob("*.parquet")))
    assert rounds.groupby("round")["look_n_scored"].nunique().max() == 1
    curve = model_curves(load_run(str(folder)))[MIDDLE]
    assert len(curve) == hist["rounds"]
    assert curve[-1] == (m["n_scored"], m["mean"], m["lower"], m["upper"])
    assert json.loads((folder / "config.json").read_text())["history"] == [SCORES]


def test_the_flow_takes_the_validated_bank_and_priors_and_loads_fits_and_claims_nothing_again(infra, tmp_path,
                                                                                          monkeypatch):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    import certeval.runs.plan as plan_module
    import certeval.runs.run as run_module
    from certeval.flows.pipeline import run_plan

    plan, prepared = make_plan(Certify(models=[replay(MIDDLE)], goal="halfwidth:0.1", batch_size=50,
                                           seed=1, history=[SCORES], output=str(tmp_path / "runs"), run_id="once"))
    assert set(prepared.history) == {MIDDLE} and prepared.bank.n_items == 567
    prepared = prepared.claimed(plan_module.claim_run(plan))  # what the CLI does before the flow

    def refuse(*_args, **_kw):
        raise AssertionError("the flow loaded, fitted or claimed again")

    monkeypatch.setattr(run_module, "prepare_run", refuse)
    monkeypatch.setattr(plan_module, "claim_run", refuse)
    res = run_plan(plan, prepared=prepared)
    assert res["reached"] and res["models"][0]["method"] == "history"
    # Prefect records the plan, and only a placeholder for the bank and priors
    with get_client(sync_client=True) as client:
        # newest first: the worker's shared server holds every flow run of its earlier tests
        runs = [r for r in client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=50)
                if isinstance(r.parameters.get("plan"), dict) and r.parameters["plan"].get("run_id") == "once"]
    assert len(runs) == 1 and runs[0].parameters["prepared"] == "<PreparedRun>"


def test_history_from_earlier_run_folders(infra, tmp_path):
    scores = small_scores(tmp_path, n_items=150)
    out = tmp_path / "runs"
    for model, run_id in ((STRONG, "earlier-a"), (WEAK, "earlier-b")):
        _run(tmp_path, models=[replay(model, scores)], goal="halfwidth:0.3", batch_size=50, run_id=run_id,
             method="uniform")
    _, res = _run(tmp_path, models=[replay(MIDDLE, scores)], goal="halfwidth:0.15", batch_size=25,
                  run_id="later", history=[str(out)])
    info = res["models"][0]["history"]
    assert sorted(info["models"]) == sorted([STRONG, WEAK]) and info["left_out_self"] is False
    assert res["models"][0]["method"] == "history"


@pytest.mark.parametrize("extra, message", [
    (["--method", "history"], "needs --history"),
    (["--history", SCORES, "--method", "adaptive"], "used by method 'history'"),
    (["--method", "faq"], "backtests only"),
    (["--history", "/nonexistent/history.parquet"], "history.parquet"),
    (["--history", "bundled:vlm_ocrbench"], "no model with a score on this bank's items"),
])
def test_bad_history_input_exits_2_and_writes_nothing(tmp_path, capsys, extra, message):
    out = tmp_path / "runs"
    argv = ["certify", "--model", replay(MIDDLE), "--goal", "halfwidth:0.1", "--output", str(out), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not out.exists() or not any(out.iterdir())


def test_history_left_out_entirely_when_only_the_model_itself_is_recorded(tmp_path):
    scores = small_scores(tmp_path, models=(MIDDLE,), n_items=40)
    with pytest.raises(InputError, match="never its own history"):
        make_plan(Certify(models=[replay(MIDDLE, scores)], goal="halfwidth:0.1", history=[scores],
                              output=str(tmp_path / "runs")))


def test_paired_commands_refuse_history_with_the_distribution_target(tmp_path):
    with pytest.raises(InputError, match="drop --target"):
        make_plan(Rank(models=[replay(MIDDLE), replay(WEAK)], history=[SCORES], target="distribution",
                              output=str(tmp_path / "r")))


def test_checkpoint_schedule_learns_from_the_checkpoints_it_already_certified(infra, tmp_path):
    from certeval.flows.checkpoints import certify_checkpoints_flow

    scores = small_scores(tmp_path, n_items=150)
    ckpt, out = tmp_path / "checkpoints", tmp_path / "runs"
    ckpt.mkdir()
    seen = []
    for step, model in (("step-1000", WEAK), ("step-2000", MIDDLE), ("step-3000", STRONG)):
        (ckpt / f"{step}.spec").write_text(replay(model, scores) + "\n")  # a new checkpoint appears
        report = certify_checkpoints_flow(str(ckpt), Certify(output=str(out), goal="halfwidth:0.2", batch_size=25,
                                                             seed=2))
        seen.append({r["checkpoint"]: r for r in report["checkpoints"]})
    assert seen[0][WEAK]["method"] == "adaptive" and seen[0][WEAK]["history_models"] == []
    assert seen[1][MIDDLE]["method"] == "history" and seen[1][MIDDLE]["history_models"] == [WEAK]
    assert sorted(seen[2][STRONG]["history_models"]) == sorted([WEAK, MIDDLE])
    # earlier checkpoints were not certified again on later ticks
    assert seen[2][WEAK]["run_id"] == seen[0][WEAK]["run_id"] and seen[2][WEAK]["n_scored"] == seen[0][WEAK]["n_scored"]
    assert report["best"] == STRONG and (out / "checkpoints.json").is_file()


def test_compare_with_history_answers_the_bank_question_exactly(infra, tmp_path):
    from certeval.flows.pipeline import run_plan
    from certeval.runs.run import Run

    scores = small_scores(tmp_path, n_items=200)
    plan, _ = make_plan(Compare(models=[replay(STRONG, scores), replay(WEAK, scores)], history=[SCORES],
                                    batch_size=20, seed=3, output=str(tmp_path / "runs"), run_id="cmp-hist"))
    res = run_plan(plan)
    pair = res["pairs"][0]
    truth = bank_diff(scores, STRONG, WEAK)
    assert pair["statistic"] == "paired-history" and res["history"]["comparison_target"] == "bank"
    assert pair["lower"] - 1e-9 <= truth <= pair["upper"] + 1e-9 and pair["verdict"] == "a>b"
    assert pair["n_items"] < 200  # decided before the bank ran out
    # a resumed run replays its rounds into the same comparison (nothing re-scored, same numbers)
    run = Run.open(plan)
    run.restore()
    again = run.engine.outcome.to_dict()
    assert (again["lower"], again["upper"], again["verdict"]) == (pair["lower"], pair["upper"], pair["verdict"])


def test_compare_with_history_at_exhaustion_gives_the_exact_difference(infra, tmp_path):
    from certeval.flows.pipeline import run_plan

    a, b = "openai_text-ada-001", "openai_text-babbage-001"  # equal bank means on these 40 items
    scores = small_scores(tmp_path, models=(a, b), n_items=40)
    plan, _ = make_plan(Compare(models=[replay(a, scores), replay(b, scores)], history=[SCORES], batch_size=20,
                                    seed=1, output=str(tmp_path / "runs"), run_id="cmp-x"))
    pair = run_plan(plan)["pairs"][0]
    truth = bank_diff(scores, a, b)
    assert truth == pytest.approx(0.0, abs=1e-12) and pair["exact"]  # margin 0: only the whole bank shows a tie
    assert pair["lower"] == pytest.approx(0.0, abs=1e-12) and pair["upper"] == pytest.approx(0.0, abs=1e-12)
    assert pair["verdict"] == "equivalent" and pair["rule"] == "exhausted"
