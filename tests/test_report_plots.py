"""The report's plots agree with their captions and with the statement the run made (issue 47, item 2): the
differences plot of a strict ranking and of an ε-ranking colours each pair as its title says and its caption
explains the rule that decided it (ε-statements: decided intervals may straddle 0); interval curves are steps at
the looks, one small panel per model beyond four. Checked on the drawn matplotlib artists, not only on a PNG."""

from __future__ import annotations

import numpy as np
import pytest
from matplotlib.colors import to_rgba

import certeval.reports.plots as plots
import certeval.reports.run_report as report
from certeval.estimators.distribution.comparison import Comparison
from certeval.reports.run_report import load_run, write_report

from paired_fixed_seed import run_case
from record_support import pair


@pytest.fixture()
def figures(monkeypatch):
    """Every figure the plots draw, kept open (in drawing order) after its PNG is made."""
    drawn = []
    original = plots._png

    def keep(fig):
        drawn.append(fig)
        buf = __import__("io").BytesIO()
        fig.savefig(buf, format="png", dpi=40)
        return buf.getvalue()

    monkeypatch.setattr(plots, "_png", keep)
    yield drawn
    for fig in drawn:
        original(fig)  # closes it


def _row_colours(fig) -> dict[int, tuple]:
    """The colour of each forest row's interval line (y = row), from the first axes' artists."""
    ax = fig.axes[0]
    rows = {}
    for line in ax.get_lines():
        y = np.asarray(line.get_ydata(), dtype=float)
        if y.size == 2 and y[0] == y[1] and float(y[0]).is_integer():
            rows[int(y[0])] = to_rgba(line.get_color())
    return rows


def _report_with_plots(case: str, tmp_path, monkeypatch) -> tuple[dict, str, dict]:
    run_case(case, tmp_path)
    made = {}
    for name in ("plot_differences", "plot_interval_curves"):
        original = getattr(report, name)

        def record(*args, _name=name, _original=original):
            made[_name] = _original(*args)
            return made[_name]

        monkeypatch.setattr(report, name, record)
    text = write_report(str(tmp_path / "runs" / case)).markdown
    return load_run(str(tmp_path / "runs" / case)).results.to_json(), text, made


@pytest.mark.parametrize("case", ["rank-bank", "rank-bank-epsilon"])
def test_a_rankings_differences_plot_colours_pairs_as_its_title_says_and_its_caption_states_the_rule(
        case, tmp_path, monkeypatch, figures):
    results, text, made = _report_with_plots(case, tmp_path, monkeypatch)
    drawn = made["plot_differences"]
    pairs = {f"{p['model_a']} − {p['model_b']}": p for p in results["pairs"]}
    epsilon = results["ranking"].get("epsilon")
    assert drawn.caption in text  # the report prints the caption made with the plot
    fig = figures[[f._suptitle is None and f.axes[0].get_title() for f in figures].index(drawn.title)]
    colours = _row_colours(fig)
    for y, mark in enumerate(drawn.marks):
        pair = pairs[mark["pair"]]
        decided = pair["verdict"] != "undecided"
        assert mark["status"] == ("undecided" if not decided else
                                  "equivalent" if pair["verdict"] == "equivalent" else "decided")
        assert colours[y] == to_rgba(plots.STATUS_COLOURS[mark["status"]])  # the drawn colour is the status's
        if mark["status"] == "decided":
            assert "green: decided" in drawn.title
    assert "grey: undecided" in drawn.title or all(m["status"] != "undecided" for m in drawn.marks)
    if epsilon is None:
        assert "strict" in drawn.title and "clears 0" in drawn.caption and "ε" not in drawn.caption
        for mark in drawn.marks:  # a strict decided pair's interval lies on one side of 0 (beyond the margin)
            if mark["status"] == "decided":
                assert mark["lower"] > 0 or mark["upper"] < 0
    else:  # the default ε-ranking certifies each listing by a one-sided test, not by the interval drawn
        assert f"ε-statements, ε = {epsilon:g}" in drawn.title
        assert "one-sided anytime-valid test" in drawn.caption and "straddles 0" in drawn.caption
        legend = " ".join(t.get_text() for t in fig.axes[0].get_legend().get_texts())
        assert "equivalence margin" not in legend and f"−ε = −{epsilon:g}" in legend
        assert any(m["status"] == "decided" and m["lower"] < 0 < m["upper"] for m in drawn.marks), \
            "the case should show a decided pair whose interval straddles 0, which the caption explains"
    curves = made["plot_interval_curves"]
    assert curves.caption in text and "steps" in curves.caption


def _curves(n_models: int, looks: int = 5) -> dict[str, list[tuple[int, float, float, float]]]:
    rng = np.random.default_rng(0)
    out = {}
    for m in range(n_models):
        mean = rng.uniform(0.2, 0.8)
        out[f"model-{m:02d}"] = [(20 * (k + 1), mean, max(0.0, mean - 0.4 / (k + 1)), min(1.0, mean + 0.4 / (k + 1)))
                                 for k in range(looks)]
    return out


@pytest.mark.parametrize("n_models", [3, 15])
def test_interval_curves_are_steps_at_the_looks_and_one_small_panel_per_model_beyond_four(n_models, figures):
    curves = _curves(n_models)
    drawn = plots.plot_interval_curves(curves, "halfwidth:0.05")
    fig = figures[-1]
    panels = [ax for ax in fig.axes if ax.get_visible()]
    lines = [line for ax in panels for line in ax.get_lines() if len(line.get_xdata()) == 5]
    assert lines and all(line.get_drawstyle() == "steps-post" for line in lines)  # no straight line between looks
    assert "steps" in drawn.caption and "steps at the looks" in drawn.title
    if n_models <= plots.MAX_OVERLAY:
        assert len(panels) == 2 and "share one panel" in drawn.caption  # estimates, and the half-width panel
    else:
        assert len(panels) == n_models and "One small panel per model" in drawn.caption
        titles = sorted(ax.get_title().split("\n")[0] for ax in panels)
        assert titles == sorted(curves)  # each panel names its model
    assert [m["model"] for m in drawn.marks] == list(curves)


def test_an_epsilon_ranking_decided_by_its_intervals_says_so_and_its_decided_intervals_lie_past_minus_epsilon(
        figures):
    """``epsilon_method="intervals"`` (runs stored with it): a listing is certified once the interval lies above −ε
    (or below +ε); the caption says that rule and every green pair obeys it, straddling 0 or not."""
    from certeval.estimators.distribution.comparison import VERDICTS, epsilon_verdicts

    eps = 0.05
    lower = np.array([-0.04, 0.02, -0.2, -0.03, -0.3])
    upper = np.array([0.08, 0.2, 0.1, 0.04, -0.06])
    codes = epsilon_verdicts(None, lower, upper, eps, exact=False)
    pairs = [Comparison(**pair(f"m{k}", f"n{k}", (lo + hi) / 2, float(lo), float(hi), VERDICTS[c], margin=eps,
                         guarantee="pair intervals"))
             for k, (lo, hi, c) in enumerate(zip(lower, upper, codes))]
    drawn = plots.plot_differences(pairs, None, eps)
    colours = _row_colours(figures[-1])
    assert f"lies above −{eps:g}" in drawn.caption and "may straddle 0" in drawn.caption
    for y, mark in enumerate(drawn.marks):
        assert colours[y] == to_rgba(plots.STATUS_COLOURS[mark["status"]])
        assert (mark["status"] == "decided") == (mark["lower"] > -eps or mark["upper"] < eps)
    assert {m["pair"] for m in drawn.marks if m["status"] == "undecided"} == {"m2 − n2"}
    assert any(m["status"] == "decided" and m["lower"] < 0 < m["upper"] for m in drawn.marks)
    assert drawn.title.startswith("Paired differences (ε-statements, ε = 0.05; green: decided, grey: undecided")
