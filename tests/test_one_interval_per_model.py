"""One number per model per run: in a ranking, a selection and a comparison, every table of the report, every
plot's data and the console summary show a model with the same interval — the one in results.json, which is
the look log's last entry — and each plot draws a model in the same colour. (A rank report once showed a model
at 0.426 [0.280, 0.571] in one table and 0.412 [0.313, 0.485] in the next.)"""

from __future__ import annotations

import re

import pytest

import certeval.reports.run_report as report
from certeval.cli.pipeline import summary
from certeval.reports.run_report import load_run, write_report

from paired_fixed_seed import run_case

NUMBER = r"(-?\d+\.\d+|nan|–)"


def _table(markdown: str, heading: str) -> list[dict[str, str]]:
    """The rows of the markdown table under ``## heading``."""
    part = markdown.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in part.splitlines() if line.startswith("|")]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    return [dict(zip(header, (c.strip() for c in line.strip("|").split("|")))) for line in lines[2:]]


@pytest.mark.parametrize("case", ["rank-bank", "select-bank", "compare-bank", "rank-distribution"])
def test_every_table_plot_and_console_line_shows_one_interval_per_model(case, tmp_path, monkeypatch):
    run_case(case, tmp_path)
    folder = tmp_path / "runs" / case
    drawn = {}
    for name in ("plot_interval_curves", "plot_ranking"):
        original = getattr(report, name)

        def record(*args, _name=name, _original=original):
            drawn[_name] = args
            return _original(*args)

        monkeypatch.setattr(report, name, record)
    text = write_report(str(folder)).markdown
    results = load_run(str(folder)).results.to_json()
    shown = {m["model"]: (m["mean"], m["lower"], m["upper"]) for m in results["models"]}
    fmt = {model: tuple(f"{v:.3f}" for v in values) for model, values in shown.items()}

    for row in _table(text, "Estimates and decisions"):
        assert (row["mean"], row["lower"], row["upper"]) == fmt[row["model"]]
    if "ranking" in results:
        rows = _table(text, "Ranking")
        assert {r["model"] for r in rows} == set(shown)
        for row in rows:
            assert (row["mean"], row["lower"], row["upper"]) == fmt[row["model"]]
        ranked, colours = drawn["plot_ranking"]
        for r in ranked:
            assert (r["mean"], r["lower"], r["upper"]) == pytest.approx(shown[r["model"]], abs=1e-12)
    curves, _goal, curve_colours = drawn["plot_interval_curves"]
    for model, curve in curves.items():
        assert curve[-1][1:] == pytest.approx(shown[model], abs=1e-12)
    if "ranking" in results:
        assert all(colours[m] == curve_colours[m] for m in shown)  # one colour per model across plots
    for line in summary(results).splitlines():
        match = re.match(rf"\s+(\S+)\s+{NUMBER} \[{NUMBER}, {NUMBER}\]", line)
        if match and match.group(1) in shown:
            assert tuple(float(x) for x in match.groups()[1:]) == pytest.approx(shown[match.group(1)], abs=5e-5)
    if case == "compare-bank":
        assert "a decided pair can have overlapping per-model bands" in text
    else:  # a group with per-model intervals shows them, labelled as such
        claims = {m["model"]: m["guarantee"] for m in results["models"]}
        if case != "rank-distribution":
            assert all("simultaneous over the 3 models" in g for g in claims.values())
