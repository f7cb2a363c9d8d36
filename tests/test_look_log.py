"""The look log (docs/architecture.md §5): every look's estimate is recorded once, with its round, and results.json and the
report read it back — for every single-model method and every paired kind, with and without history.

Each case runs the real pipeline (Prefect flow, Ray actors) on a small HELM-MMLU bank and checks three
things against each other: the look log in ``rounds/``, results.json, and the estimates the run's estimators
computed (``estimate`` in results.json is the live method's ``result()``; ``pairs``/``ranking``/``selection``
are the live group estimator's). Before the look log, the report rebuilt curves by re-running estimators from
stored state and could end somewhere else than the stored result (adaptive's joint interval did).
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from certeval.reports.run_report import load_run, model_curves, paired_difference_curve, write_report
from certeval.requests import request_for
from certeval.runs.plan import make_plan

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK, replay, small_scores

pytestmark = pytest.mark.slow

CLOSE = dict(rel=1e-12, abs=1e-12)


@pytest.fixture(scope="module")
def scores(tmp_path_factory) -> str:
    """One small scores file for every case: their replay actors (kept, no CPUs) are the same, adopted by the
    next run on the same models instead of started again; each run still scores into its own folder's cache."""
    return small_scores(tmp_path_factory.mktemp("look-log"), n_items=150)


@pytest.fixture()
def keep_actors(infra, kept_actors) -> dict:
    """A plan's --keep-actors on the shared Ray (its kept actors killed after the module)."""
    return {"ray_address": infra, "options": {"keep_actors": True}}


def _run(kind: str, tmp_path, run_id: str, scores: str, **kw):
    from certeval.flows.pipeline import run_plan

    kw.setdefault("models", [replay(m, scores) for m in (STRONG, MIDDLE, WEAK)])
    plan, _ = make_plan(request_for(kind, output=str(tmp_path / "runs"), run_id=run_id, seed=2, **kw))
    res = run_plan(plan)
    folder = tmp_path / "runs" / run_id
    rounds = pd.concat(pd.read_parquet(f) for f in sorted((folder / "rounds").glob("*.parquet")))
    assert json.loads((folder / "results.json").read_text())["models"] == res["models"]
    return res, rounds, folder


def _last_look(rounds: pd.DataFrame, model: str) -> pd.Series:
    mine = rounds[rounds["model"] == model]
    last = mine[mine["round"] == mine["round"].max()]
    cols = [c for c in rounds.columns if c.startswith("look_") and c != "look_pair_verdict"]
    assert (last[cols].nunique(dropna=False) <= 1).all(), "the rows of one look disagree"
    return last.iloc[0]


def _check_models(res, rounds, folder) -> None:
    curves = model_curves(load_run(str(folder)))
    for m in res["models"]:
        look, live = _last_look(rounds, m["model"]), m["estimate"]
        assert int(look["look_n_scored"]) == m["n_scored"] == live["n_scored"]
        for key in ("mean", "lower", "upper"):
            assert m[key] == pytest.approx(float(look[f"look_{key}"]), **CLOSE) == live[key]
        curve = curves[m["model"]]
        assert len(curve) == rounds[rounds["model"] == m["model"]]["round"].nunique()
        # a ranking's or selection's plot shows the interval its verdicts use: the model's one interval
        if res["kind"] == "select":
            assert curve[-1][2:] == pytest.approx((m["lower"], m["upper"]), **CLOSE)
        else:
            assert curve[-1] == pytest.approx((m["n_scored"], m["mean"], m["lower"], m["upper"]), **CLOSE)


def _bank_with_embeddings(tmp_path, scores: str) -> str:
    """The small bank with random 8-d item embeddings and no sub-datasets: Cer-Eval's partition and adaptive's
    feature strata (and so adaptive's joint interval, used on banks without sub-datasets) need features."""
    frame = pd.read_parquet(scores)
    items = frame.drop_duplicates("item_id")[["item_id"]].reset_index(drop=True)
    rng = np.random.default_rng(0)
    items["embedding"] = list(rng.standard_normal((len(items), 8)))
    path = tmp_path / "bank.parquet"
    items.to_parquet(path, index=False)
    return str(path)


@pytest.mark.parametrize("method", ["uniform", "static", "seq", "cer-eval", "adaptive", "history"])
def test_certify_every_method_results_and_curve_are_the_look_log(keep_actors, scores, tmp_path, method):
    kw = {"history": [SCORES]} if method == "history" else {}
    if method in ("cer-eval", "adaptive"):
        kw["bank"] = _bank_with_embeddings(tmp_path, scores)
    res, rounds, folder = _run("certify", tmp_path, f"certify-{method}", scores, method=method, goal="halfwidth:0.15",
                               batch_size=25, **kw, **keep_actors)
    assert {m["method"] for m in res["models"]} == {method}
    if method == "adaptive":  # the joint construction, whose replayed curve once ended away from the result
        assert all(m["estimate"]["extra"]["combine"] == "joint" for m in res["models"])
    assert res["rounds"] >= 2 and rounds["round"].nunique() >= 2
    _check_models(res, rounds, folder)


# --history answers the bank target only (with --target distribution it is refused: tested elsewhere)
@pytest.mark.parametrize("target,history", [("bank", False), ("distribution", False), ("bank", True)])
def test_compare_pair_curve_is_the_look_log(keep_actors, scores, tmp_path, target, history):
    kw = {"history": [SCORES]} if history else {}
    res, rounds, folder = _run("compare", tmp_path, f"cmp-{target}-{history}", scores, target=target, batch_size=20,
                               margin=0.02, models=[replay(m, scores) for m in (STRONG, MIDDLE)], **kw, **keep_actors)
    _check_models(res, rounds, folder)
    pair, stored = res["pairs"][0], load_run(str(folder))
    curve = paired_difference_curve(stored, stored.results.pairs[0])
    assert len(curve) == rounds["round"].nunique()
    assert curve[-1] == pytest.approx((pair["n_items"], pair["diff"], pair["lower"], pair["upper"]), **CLOSE)
    assert _last_look(rounds, STRONG)["look_pair_verdict"] == pair["verdict"]
    assert "differences.png" in write_report(str(folder)).files


@pytest.mark.parametrize("kind", ["rank", "select"])
@pytest.mark.parametrize("target,history", [("bank", False), ("distribution", False), ("bank", True)])
def test_rank_and_select_group_intervals_are_the_look_log(keep_actors, scores, tmp_path, kind, target, history):
    kw = {"history": [SCORES]} if history else {}
    if kind == "select":  # select states no verdict at a margin: its request has none
        kw.update(threshold=0.0, halfwidth=0.05)
    else:
        kw.update(margin=0.02)
    res, rounds, folder = _run(kind, tmp_path, f"{kind}-{target}-{history}", scores, target=target, batch_size=20,
                               **kw, **keep_actors)
    _check_models(res, rounds, folder)
    for m in res["models"]:  # the model's one interval is the group's, as the look log recorded it
        look = _last_look(rounds, m["model"])
        if not np.isfinite(float(look["look_group_lower"])):
            continue  # a group that gives no interval per model: the model's own (checked above)
        assert m["lower"] == pytest.approx(float(look["look_group_lower"]), **CLOSE)
        assert m["upper"] == pytest.approx(float(look["look_group_upper"]), **CLOSE)
    if kind == "select":  # the live selection's own intervals are what the look log recorded
        live = {s["model"]: s for s in res["selection"]["models"]}
        for m in res["models"]:
            assert (m["lower"], m["upper"]) == pytest.approx(
                (live[m["model"]]["lower"], live[m["model"]]["upper"]), **CLOSE)
    elif target == "bank" and not history:  # BankRanking's simultaneous per-model intervals (at alpha / M)
        assert all(np.isfinite(m["lower"]) for m in res["models"])
