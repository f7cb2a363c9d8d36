"""One number per thing on every screen of a run: the progress lines, the console summary, report.md and
results.json show the same interval for a model, the same difference for a pair and the same rank, and report.md
states the question, the statement made and the answer at its top.

Before: ``select``'s last progress line showed a model's own method's interval, its final table the selection's;
``rank``'s progress said "rank 5" (the tie group's index, frozen when the model left) where the table said rank 10,
and "scored 0.664" beside a final mean of 0.6486; ``compare`` printed each model's own method's mean beside the
pair's difference of another estimator (0.7999 and 0.9540, difference −0.1700). Now every screen reads the look
log's record (:mod:`certeval.record.looks`) or the final result built from it, a comparison's models are shown with the
comparison's own per-model intervals (the two means differ by the pair's difference), and a rank is numbered one
way everywhere (ties share a rank, the next group skips places).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
from pathlib import Path

import numpy as np
import pytest

from certeval.requests import request_for
from certeval.runs.plan import make_plan

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK, replay

THREE = [STRONG, MIDDLE, WEAK]
CASES = {
    "certify": ("certify", [STRONG, WEAK], {"goal": "halfwidth:0.1"}),
    "compare": ("compare", [STRONG, MIDDLE], {"margin": 0.02}),
    "rank": ("rank", THREE, {}),
    "rank-epsilon": ("rank", THREE, {"epsilon": 0.05}),
    "rank-precision": ("rank", THREE, {"goal": "halfwidth:0.1"}),
    "select": ("select", THREE, {"halfwidth": 0.05, "threshold": 0.3}),
}
NUMBER = r"(-?\d+\.\d+)"


@pytest.fixture(scope="module")
def screens(infra, kept_actors, tmp_path_factory):
    """Every case run once, as the CLI runs it: its progress lines (lines mode), console summary, report.md and
    results.json. Replay actors are kept (no CPUs): a case on the same models adopts an earlier case's."""
    from certeval.cli.pipeline import summary
    from certeval.flows.pipeline import run_plan
    from certeval.reports.run_report import write_report

    out = tmp_path_factory.mktemp("one-number")
    shown = {}
    for name, (kind, models, extra) in CASES.items():
        plan, prepared = make_plan(request_for(kind, models=[replay(m) for m in models], batch_size=50, seed=1,
                                               output=str(out), run_id=name, ray_address=infra,
                                               options={"keep_actors": True}, **extra))
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            results = run_plan(plan, progress="lines", prepared=prepared)
        results["report"] = write_report(results["run_folder"]).files["report.md"]
        progress = [line for line in err.getvalue().splitlines() if line.startswith(f"certeval: {kind} {name} round")]
        folder = Path(results["run_folder"])
        shown[name] = {"progress": progress, "console": summary(results),
                       "report": (folder / "report.md").read_text(),
                       "json": json.loads((folder / "results.json").read_text())}
    return shown


def _progress_models(line: str) -> dict[str, tuple]:
    """``model N scored mean [lower, upper] verdict`` of each model on a progress line."""
    body = line.split("): ", 1)[1]
    out = {}
    for part in body.split("; "):
        m = re.match(rf"(\S+) (\d+) scored {NUMBER} \[{NUMBER}, {NUMBER}\]\s*(.*)$", part)
        assert m, part
        out[m[1]] = (int(m[2]), float(m[3]), float(m[4]), float(m[5]), m[6].strip())
    return out


def _console_models(text: str) -> dict[str, tuple]:
    out = {}
    for line in text.splitlines():
        m = re.match(rf"  (\S+)\s+{NUMBER} \[{NUMBER}, {NUMBER}\]\s+(\d+)/(\d+) items\s*(.*)$", line)
        if m:
            out[m[1]] = (float(m[2]), float(m[3]), float(m[4]), int(m[5]), m[7].strip())
    return out


def _table(report: str, heading: str) -> list[dict[str, str]]:
    """The first markdown table below ``## heading`` as rows of cells by header."""
    lines = report.split(f"## {heading}\n", 1)[1].splitlines()
    end = next((i for i, line in enumerate(lines) if line.startswith("|")), 0)
    rows = []
    for line in lines[end:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    header = rows[0]
    return [dict(zip(header, r)) for r in rows[2:]]


def _models(results: dict) -> dict[str, dict]:
    return {m["model"]: m for m in results["models"]}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_every_model_shows_one_interval_on_every_screen(screens, case):
    s = screens[case]
    models = _models(s["json"])
    assert s["progress"], "no progress line"
    last = _progress_models(s["progress"][-1])
    console = _console_models(s["console"])
    table = {r["model"]: r for r in _table(s["report"], "Estimates and decisions")}
    assert set(last) == set(console) == set(table) == set(models)
    for name, m in models.items():
        mean, lower, upper = m["mean"], m["lower"], m["upper"]
        assert last[name][:4] == (m["n_scored"], round(mean, 3), round(lower, 3), round(upper, 3)), name
        assert console[name][:4] == (round(mean, 4), round(lower, 4), round(upper, 4), m["n_scored"]), name
        assert (table[name]["mean"], table[name]["lower"], table[name]["upper"]) == (
            f"{mean:.3f}", f"{lower:.3f}", f"{upper:.3f}"), name
        assert int(table[name]["items scored"]) == m["n_scored"]
        # the model's verdict: the same words on the console, in the report's table and on the last progress line
        assert console[name][4] == table[name]["verdict"].replace("\\|", "|"), name
        if case != "compare":  # (the progress line keeps a pair's verdict short: a>b)
            assert last[name][4] == console[name][4], name
        estimate = m["estimate"]  # the live estimator's numbers at the end are the look log's
        assert (estimate["mean"], estimate["lower"], estimate["upper"]) == (mean, lower, upper)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["rank", "rank-epsilon", "rank-precision"])
def test_every_rank_is_one_number(screens, case):
    s = screens[case]
    results = s["json"]
    from certeval.reports.run_report import rank_numbers

    groups = results["ranking"]["tie_groups"]
    rank = {m: r for g, r in zip(groups, rank_numbers(groups)) for m in g}
    last = _progress_models(s["progress"][-1])
    console = _console_models(s["console"])
    table = {r["model"]: r for r in _table(s["report"], "Ranking")}
    for name, m in _models(results).items():
        want = f"rank {rank[name]}"
        assert m["decision"]["verdict"] == want  # a model decided early keeps its rank current to the end
        assert last[name][4] == console[name][4] == want and int(table[name]["rank"]) == rank[name], name
        assert (table[name]["mean"], table[name]["lower"]) == (f"{m['mean']:.3f}", f"{m['lower']:.3f}")
    listing = "; ".join(f"{r}. {' = '.join(g)}" for g, r in zip(groups, rank_numbers(groups)))
    assert f"**Answer.** {listing}" in s["report"]


@pytest.mark.slow
@pytest.mark.parametrize("case", ["compare", "rank", "rank-precision"])
def test_every_difference_is_one_number_and_the_difference_of_the_means_shown(screens, case):
    s = screens[case]
    results = s["json"]
    models = _models(results)
    pairs = results["pairs"]
    table = _table(s["report"], "Pairs")
    assert len(table) == len(pairs)
    compared = 0
    for pair, row in zip(pairs, table):
        assert (row["model_a"], row["model_b"]) == (pair["model_a"], pair["model_b"])
        assert (row["diff"], row["lower"], row["upper"]) == tuple(f"{pair[k]:.3f}" for k in ("diff", "lower", "upper"))
        a, b = models[pair["model_a"]], models[pair["model_b"]]
        # both models still at the pair's last look (leaderboard precision: its pairs are the models' intervals)
        if a["n_scored"] == b["n_scored"] == pair["n_items"] or case == "rank-precision":
            assert pair["diff"] == pytest.approx(a["mean"] - b["mean"], abs=1e-12)
            compared += 1
    assert compared
    if case == "compare":
        (pair,) = pairs
        line = f"{pair['model_a']} - {pair['model_b']}: {pair['diff']:.4f} [{pair['lower']:.4f}, {pair['upper']:.4f}]"
        assert line in s["console"]
        assert f"= {pair['diff']:.4f} [{pair['lower']:.4f}, {pair['upper']:.4f}]" in s["report"]  # the answer
        last = _progress_models(s["progress"][-1])
        assert last[pair["model_a"]][1] - last[pair["model_b"]][1] == pytest.approx(pair["diff"], abs=2e-3)


@pytest.mark.slow
def test_the_selected_model_is_one_answer_everywhere(screens):
    s = screens["select"]
    selected = s["json"]["selection"]["selected"]
    assert selected and f"selected: {', '.join(selected)}" in s["console"]
    answer = s["report"].split("**Answer.**", 1)[1].splitlines()[0]
    assert all(name in answer for name in selected) and answer.strip().startswith("selected:")
    table = {r["model"]: r for r in _table(s["report"], "Estimates and decisions")}
    status = {m["model"]: m["selection_status"] for m in s["json"]["models"]}
    assert {n for n, r in table.items() if r["verdict"] == "selected"} == set(selected) == {
        n for n, st in status.items() if st == "selected"}


@pytest.mark.slow
@pytest.mark.parametrize("case, statement, setting", [
    ("certify", "half-width <= 0.1", "**goal** `halfwidth:0.1`"),
    ("compare", "margin ±0.02", "**margin** `0.02`"),
    ("rank", "strict ordering statements at margin 0", "**margin** `0.0`"),
    ("rank-epsilon", "ε-statements with ε = 0.05", "**epsilon** `0.05`"),
    ("rank-precision", "half-width <= 0.1", "**goal** `halfwidth:0.1`"),
    ("select", "ε-top-1 with ε = 0.05", "**halfwidth** `0.05`"),
])
def test_the_report_states_the_question_the_statement_and_the_answer_at_its_top(screens, case, statement, setting):
    report = screens[case]["report"]
    top = report.split("## ", 1)[0]  # before the first section
    for part in ("**Question.**", "**Statement made.**", "**Answer.**"):
        assert part in top, (case, part)
    assert statement in top.split("**Statement made.**", 1)[1].split("**Answer.**", 1)[0]
    assert setting in top
    if case not in ("compare", "rank"):  # no margin beside a statement that has none
        assert "**margin**" not in top and "margin 0" not in top


def test_a_comparisons_model_intervals_differ_by_its_difference_for_every_group():
    """Engine level, every comparison group (bank target, distribution target, bank target with history): the
    per-model intervals every screen shows are the comparison's own, whose means differ by the pair's difference
    at every look."""
    from certeval.engine import PairedRounds, run_paired
    from certeval.estimators import make_method
    from certeval.estimators.groups import GroupRequest
    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix
    from certeval.inputs.history import history_prior, load_history

    scores = load_scores(SCORES)
    bank = bank_from_scores(scores)
    models = [MIDDLE, WEAK]
    matrix = score_matrix(scores, models, bank)
    spec = bank.spec()
    history = load_history([SCORES])
    for target, priors in (("bank", {}), ("distribution", {}),
                           ("bank", {m: history_prior(history, bank, m) for m in models})):
        request = GroupRequest("compare", tuple(models), target=target, look_size=50, history=priors)
        methods = {m: make_method("uniform", target=target).start(spec) for m in models}
        rounds = PairedRounds(request, n_items=bank.n_items, batch_size=50, methods=methods)
        rounds.start(spec, np.random.default_rng(1))
        seen = []

        def look(r):
            a, b = (r.intervals[m] for m in models)
            seen.append(r.n_shared)
            assert a[3] == b[3] == r.outcome.n_items == r.n_shared
            assert a[0] - b[0] == pytest.approx(r.outcome.diff, abs=1e-12), (target, bool(priors), r.n_shared)
            assert a[1] <= a[0] <= a[2] and b[1] <= b[0] <= b[2]

        run_paired(rounds, matrix, on_look=look)
        assert seen, target
