"""certeval report: a tiny fixture run folder (built here, not by the pipeline) → report.md, PNGs, HTML."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from certeval.cli import main
from certeval.estimators import BankSpec, make_method, parse_goal
from certeval.estimators.distribution.comparison import Comparison
from certeval.reports.run_report import (
    load_run,
    markdown_to_html,
    model_curves,
    publish_artifacts,
    ranking_rows,
    report_run,
    write_report,
)
from certeval.storage import Folder, filesystem, safe_name

from record_support import decision, model_entry, pair, ranking, run_record

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MODELS = ("model/a", "model-b", "model c")  # names that need safe_name()
TRUE_P = (0.8, 0.55, 0.5)


def build_run(url: str, n_items: int = 300, batch: int = 40, seed: int = 3) -> dict:
    """Run ``uniform`` on three synthetic models for 4 rounds and store it in the docs/architecture.md §5 layout."""
    rng = np.random.default_rng(seed)
    subsets = np.repeat([0, 1, 2], n_items // 3)
    spec = BankSpec(n_items=n_items, subsets=subsets, subset_names=("x", "y", "z"))
    scores = np.array([(rng.random(n_items) < p).astype(float) for p in TRUE_P])
    fs, path = filesystem(url)
    folder = Folder(fs, path)
    goal = parse_goal("halfwidth:0.01")
    folder.write_json("config.json", {"run_id": "fixture", "kind": "rank", "method": "uniform",
                                      "goal": str(goal), "confidence": 0.95, "seed": seed})
    methods = [make_method("uniform").start(spec) for _ in MODELS]
    order = rng.permutation(n_items)  # shared item order, as rank runs do
    for rnd in range(4):
        frames = []
        for m, meth in enumerate(methods):
            prop = meth.propose(batch, rng)
            meth.update(prop.items, scores[m, prop.items])
            est = meth.result()  # the look log, as the pipeline records it
            frames.append(pd.DataFrame({"model": MODELS[m], "item_id": [f"i{i}" for i in prop.items],
                                        "score": scores[m, prop.items], "round": rnd, "prob": prop.probs,
                                        "look_n_scored": est.n_scored, "look_mean": est.mean,
                                        "look_lower": est.lower, "look_upper": est.upper, "look_rule": None}))
        folder.write_parquet(f"rounds/{rnd:05d}.parquet", pd.concat(frames, ignore_index=True))
    del order
    entries = []
    for k, (name, meth) in enumerate(zip(MODELS, methods)):
        est = meth.result()
        d = goal.decide(est, look=4, budget_left=0)
        state = meth.state()
        if k == 1:  # the pipeline's wrapped form: {"round", "method_state", "decision"}
            state = {"round": 3, "method_state": state, "decision": d.to_dict()}
        folder.write_json(f"state/{safe_name(name)}.json", state)
        entries.append(model_entry(name, est.mean, est.lower, est.upper, est.n_scored, est.n_total,
                                   decision=decision(**d.to_dict())))
    folder.write_json("state/_run.json", {"round": 3})
    results = run_record("rank", entries, pairs=[pair(MODELS[0], MODELS[1], 0.25, 0.1, 0.4, "a>b")],
                         ranking=ranking([[MODELS[0]], [MODELS[1], MODELS[2]]], [e["mean"] for e in entries]))
    folder.write_json("results.json", results)
    return {"entries": entries, "spec": spec}


@pytest.fixture()
def run_dir(tmp_path):
    path = tmp_path / "runs" / "fixture"
    info = build_run(str(path))
    return path, info


def test_report_writes_valid_png_markdown_and_html(run_dir):
    path, info = run_dir
    rep = write_report(str(path), html=True)
    for name in ("interval_curve.png", "ranking.png"):
        data = (path / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 2000, name
    md = (path / "report.md").read_text()
    assert md.startswith("# certeval report: fixture")
    for heading in ("## Estimates and decisions", "## Interval vs items scored", "## Ranking", "## Pairs"):
        assert heading in md
    for name in MODELS:
        assert name in md
    assert "![interval vs items scored](interval_curve.png)" in md
    # markdown tables are well formed: every row of a table has the header's number of cells
    table = [ln for ln in md.split("## Estimates and decisions")[1].split("##")[0].splitlines() if ln.startswith("|")]
    assert len({ln.count(" | ") for ln in table if not set(ln) <= set("|:- ")}) == 1
    html = (path / "report.html").read_text()
    assert html.startswith("<!doctype html>") and "<table>" in html and "interval_curve.png" in html
    assert set(rep.files) == {"interval_curve.png", "ranking.png", "differences.png", "report.md", "report.html"}
    # the rule that fired is shown in each model's row: the fixture's goal (halfwidth:0.01) is decided with no
    # budget left after 160 of 300 items, so the budget rule fired, goal not reached
    assert {e["decision"]["rule"] for e in info["entries"]} == {"budget"}
    for name, rank in zip(MODELS, (1, 2, 2)):  # the fixture's tie groups: model/a, then the other two
        row = next(ln for ln in table if ln.startswith(f"| {name} "))
        cells = [c.strip() for c in row.strip("|").split("|")]
        # items, bank, verdict (its rank, and the rule that stopped it short), rule, reached
        assert cells[4:9] == ["160", "300", f"rank {rank} (budget)", "budget", "False"], row


def test_a_run_without_a_look_log_gets_no_curve_and_nothing_is_re_run(run_dir):
    path, _ = run_dir
    for part in sorted((path / "rounds").glob("*.parquet")):
        frame = pd.read_parquet(part)
        frame.drop(columns=[c for c in frame.columns if c.startswith("look_")]).to_parquet(part)
    assert model_curves(load_run(str(path))) == {}
    rep = write_report(str(path))
    assert "interval_curve.png" not in rep.files and "## Estimates and decisions" in rep.markdown


def test_curve_is_the_look_log_and_ends_at_the_stored_result(run_dir):
    path, info = run_dir
    curves = model_curves(load_run(str(path)))
    assert set(curves) == set(MODELS)
    for entry in info["entries"]:
        curve = curves[entry["model"]]
        assert [c[0] for c in curve] == [40, 80, 120, 160]  # one point per round, look sizes from rounds/
        n, mean, lo, hi = curve[-1]
        assert (n, mean) == (entry["n_scored"], pytest.approx(entry["mean"]))
        assert (lo, hi) == (pytest.approx(entry["lower"]), pytest.approx(entry["upper"]))
        widths = [c[3] - c[2] for c in curve]
        assert widths[-1] < widths[0]  # intervals shrink as items are scored


def test_ranking_rows_follow_tie_groups(run_dir):
    path, _ = run_dir
    rows = ranking_rows(load_run(str(path)))
    assert [(r["model"], r["rank"], r["group"]) for r in rows] == [
        ("model/a", 1, 1), ("model-b", 2, 2), ("model c", 2, 2)]


def test_savings_plot_from_a_backtest_json(run_dir, tmp_path):
    path, _ = run_dir
    cells = [{"dataset": d, "method": m, "goal": f"halfwidth:{g}", "items_ratio_vs_uniform": r,
              "fraction_of_bank": f, "coverage": 0.96}
             for d in ("d1", "d2") for m, r in (("uniform", 1.0), ("adaptive", 0.8))
             for g, f in ((0.1, 0.2), (0.05, 0.6))]
    bt = tmp_path / "bt.json"
    bt.write_text(json.dumps({"cells": cells}))
    rep = write_report(str(path), savings=str(bt))
    assert (path / "savings.png").read_bytes()[:8] == PNG_MAGIC
    md = rep.markdown
    rows = [[c.strip() for c in ln.strip("|").split("|")] for ln in md.split("## Savings vs goal")[1].splitlines()
            if ln.startswith("|")]
    assert ["adaptive", "halfwidth:0.05", "2", "0.200", "0.400", "0.960"] in rows


def test_report_on_an_fsspec_url():
    url = "memory://certeval-report-test/runs/fixture"
    build_run(url)
    rep = write_report(url, html=True)
    fs, path = filesystem(url)
    assert fs.cat_file(f"{path}/interval_curve.png")[:8] == PNG_MAGIC
    assert fs.cat_file(f"{path}/report.md").decode().startswith("# certeval report")
    assert rep.files["report.md"].startswith("memory://")


def test_cli_report_and_bad_input(run_dir, tmp_path, capsys):
    path, _ = run_dir
    assert main(["report", str(path), "--html", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert "report.html" in out["files"]
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "no results.json" in capsys.readouterr().err


def test_markdown_to_html_escapes():
    html = markdown_to_html("# T\n\n| a | b |\n|---|---|\n| <x> | 1 |\n")
    assert "&lt;x&gt;" in html and "<th>a</th>" in html


def test_artifacts_only_inside_a_prefect_run(run_dir):
    path, _ = run_dir
    rep = report_run(str(path), publish=False)
    assert publish_artifacts(rep) is False  # outside a flow: nothing to publish to


@pytest.mark.slow
def test_artifacts_published_inside_a_flow(run_dir):
    from prefect import flow
    from prefect.testing.utilities import prefect_test_harness

    path, _ = run_dir

    @flow(name="report-fixture")
    def report_flow() -> bool:
        rep = report_run(str(path), publish=False)
        return publish_artifacts(rep, key="fixture")

    with prefect_test_harness(server_startup_timeout=120):
        assert report_flow() is True
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        async def keys():
            async with get_client() as client:
                arts = await client.read_artifacts(
                    artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["fixture-report", "fixture-models"])))
                return sorted((a.key, a.type) for a in arts)

        import asyncio

        assert asyncio.run(keys()) == [("fixture-models", "table"), ("fixture-report", "markdown")]


def build_compare_run(url: str, rounds: int = 3, batch: int = 40, seed: int = 5) -> dict:
    """A compare run folder: two models scored on the same items each round, one pair in results.json."""
    rng = np.random.default_rng(seed)
    n = 300
    a = (rng.random(n) < 0.75).astype(float)
    b = (rng.random(n) < 0.55).astype(float)
    order = rng.permutation(n)
    fs, path = filesystem(url)
    folder = Folder(fs, path)
    folder.write_json("config.json", {"run_id": "cmp", "kind": "compare", "method": "uniform", "confidence": 0.95,
                                      "margin": 0.05, "seed": seed})
    entries = []
    for rnd in range(rounds):
        items = order[rnd * batch:(rnd + 1) * batch]
        so_far = order[:(rnd + 1) * batch]
        d = float((a[so_far] - b[so_far]).mean())  # the look log of the pair, as the pipeline records it
        look = {"look_n_scored": len(so_far), "look_pair_diff": d, "look_pair_lower": d - 0.12,
                "look_pair_upper": d + 0.12, "look_pair_verdict": "a>b" if d - 0.12 > 0 else "undecided"}
        frame = pd.concat([pd.DataFrame({"model": m, "item_id": [f"i{i}" for i in items], "score": s[items],
                                         "round": rnd, "prob": 1 / n, **look, "look_mean": s[so_far].mean(),
                                         "look_lower": s[so_far].mean() - 0.1, "look_upper": s[so_far].mean() + 0.1})
                           for m, s in (("alpha", a), ("beta", b))])
        folder.write_parquet(f"rounds/{rnd:05d}.parquet", frame)
    used = order[:rounds * batch]
    for m, s in (("alpha", a), ("beta", b)):
        mean = float(s[used].mean())
        entries.append(model_entry(m, mean, mean - 0.1, mean + 0.1, len(used), n))
    diff = float((a[used] - b[used]).mean())
    the_pair = pair("alpha", "beta", diff, diff - 0.12, diff + 0.12, "a>b" if diff - 0.12 > 0 else "undecided",
                    n_items=len(used), n_total=n, look=rounds, margin=0.05)
    folder.write_json("results.json", run_record("compare", entries, pairs=[the_pair]))
    return {"pair": the_pair, "a": a, "b": b, "used": used}


def test_compare_report_draws_the_paired_difference(tmp_path):
    from certeval.reports.run_report import paired_difference_curve

    path = tmp_path / "cmp"
    info = build_compare_run(str(path))
    rep = write_report(str(path), html=True)
    assert (path / "differences.png").read_bytes()[:8] == PNG_MAGIC and "differences.png" in rep.files
    curve = paired_difference_curve(load_run(str(path)), Comparison(**info["pair"]))
    # the pair's difference and interval at every look, read from the look log, ending at the stored result
    a, b, order = info["a"], info["b"], info["used"]
    assert [c[0] for c in curve] == [40, 80, 120]
    assert curve[-1][1:] == pytest.approx((info["pair"]["diff"], info["pair"]["lower"], info["pair"]["upper"]))
    assert curve[-1][1] == pytest.approx(float((a[order] - b[order]).mean()))
    md = rep.markdown
    verdict = "alpha better than beta" if info["pair"]["verdict"] == "a>b" else "alpha vs beta: undecided"
    assert verdict in md and "![paired differences](differences.png)" in md


def test_one_round_runs_still_plot(tmp_path):
    path = tmp_path / "one"
    build_compare_run(str(path), rounds=1)
    rep = write_report(str(path))
    assert "interval_curve.png" in rep.files and "differences.png" in rep.files


def test_verdicts_and_rank_numbers_spelled_once():
    from certeval.cli.pipeline import summary
    from certeval.reports.plots import spell_verdict
    from certeval.reports.run_report import rank_numbers

    assert rank_numbers([["a"], ["b", "c"], ["d"]]) == [1, 2, 4]  # per tie group
    one = pair("m1", "m2", -0.1, -0.2, -0.05, "b>a", margin=0.02)
    assert spell_verdict(Comparison(**one)) == "m2 better than m1"
    assert spell_verdict(Comparison(**{**one, "verdict": "equivalent"})) == "m1 and m2 equivalent (within ±0.02)"
    results = run_record("rank", [model_entry(m, 0.5, 0.4, 0.6, 1, 2) for m in "abcd"],
                         ranking=ranking([["a"], ["b", "c"], ["d"]], [0.5] * 4), pairs=[])
    text = summary(results)
    assert "rank 4" in text and "rank 3" not in text  # the report's numbering (1, 2, 2, 4)


def test_html_comes_from_a_markdown_library():
    html = markdown_to_html("# T\n\nsome *emphasis* and `code`\n\n| a | b |\n|---|---|\n| <x> | 1 |\n")
    assert "<em>emphasis</em>" in html and "<code>code</code>" in html and "<h1>T</h1>" in html
    assert "<script" not in markdown_to_html("<script>alert(1)</script>")
