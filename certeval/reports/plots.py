"""The report's plots (matplotlib, Agg backend; PNG bytes): interval curves, the ranking forest, paired
differences and savings vs the goal. Pure: each takes numbers and returns PNG bytes — the interval curves and the
differences as a :class:`Plot`, which carries the title drawn and the caption the report prints under it, so the
two are made from the same facts (and a test can read them)."""


from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from certeval.estimators.distribution.comparison import Comparison

MAX_OVERLAY = 4  # up to this many models share one panel; more get one small panel each (small multiples)
MAX_CURVES = 24  # small multiples drawn at most (a 6 x 4 grid)
MAX_FOREST = 60


@dataclass(frozen=True)
class Plot:
    """A drawn plot: its PNG, the title drawn on it, the caption that explains it, and what each mark is
    (``marks``: one entry per row or panel, e.g. a pair's status and colour)."""

    png: bytes
    title: str
    caption: str
    marks: tuple[dict[str, Any], ...] = field(default=())


# --------------------------------------------------------------------------------------
# plots (matplotlib, Agg backend; PNG bytes)
# --------------------------------------------------------------------------------------


VERDICT_TEXT = {
    "a>b": "{a} better than {b}", "b>a": "{b} better than {a}",
    "equivalent": "{a} and {b} equivalent (within ±{m:g})", "a>=b+margin": "{a} at least {b} + {m:g}",
    "not a>=b+margin": "{a} not at least {b} + {m:g}", "undecided": "{a} vs {b}: undecided",
    "a>=b-eps": "{a} listed above {b} ({a} at least {b} − {m:g})",
    "b>=a-eps": "{b} listed above {a} ({b} at least {a} − {m:g})",
    "either order": "{a} and {b} within ±{m:g} (either order holds)",
}


def spell_verdict(pair: Comparison) -> str:
    """A pair's verdict with the models' names (``a>b`` → ``X better than Y``)."""
    template = VERDICT_TEXT.get(pair.verdict, "{a} vs {b}: " + pair.verdict)
    return template.format(a=pair.model_a, b=pair.model_b, m=float(pair.margin or 0.0))


def _interval_row(ax, y: float, lo: Any, hi: Any, point: Any, colour: Any, *, lw: float, ms: float) -> None:
    """One row of a forest plot: the interval as a line, the point estimate as a dot (either may be missing)."""
    if lo is not None and hi is not None:
        ax.plot([lo, hi], [y, y], color=colour, lw=lw)
    if point is not None:
        ax.plot([point], [y], "o", color=colour, ms=ms)


def _forest_axes(ax, labels: list[str], xlabel: str, title: str, title_size: float) -> None:
    """A forest plot's axes: one labelled row per entry, first at the top, a vertical grid."""
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=title_size)
    ax.grid(axis="x", alpha=0.3)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    _pyplot().close(fig)
    return buf.getvalue()


def model_colours(names: list[str]) -> dict[str, Any]:
    """One colour per model for every plot of a report, by the model's place in results.json (tab20 cycles)."""
    cmap = _pyplot().get_cmap("tab10" if len(names) <= 10 else "tab20")
    return {name: cmap(k % cmap.N) for k, name in enumerate(names)}


def _steps(ax, c: np.ndarray, colour: Any, label: str | None = None, *, width: bool = False) -> None:
    """One model's record as steps at the looks: the interval (band) and the estimate hold from one look to the
    next (a straight line between looks would draw values no look recorded); a dot at each look. ``width``: the
    half-width instead."""
    x = c[:, 0]
    if width:
        ax.plot(x, 0.5 * (c[:, 3] - c[:, 2]), drawstyle="steps-post", color=colour, lw=1.4, marker="o", ms=2.5,
                label=label)
        return
    if len(c) > 1:
        ax.fill_between(x, c[:, 2], c[:, 3], step="post", color=colour, alpha=0.2, lw=0)
        ax.plot(x, c[:, 1], drawstyle="steps-post", color=colour, lw=1.4, marker="o", ms=2.5, label=label)
    else:  # one look: an error bar instead of a band of zero width
        ax.errorbar(x, c[:, 1], yerr=[c[:, 1] - c[:, 2], c[:, 3] - c[:, 1]], color=colour, capsize=4, lw=1.4,
                    marker="o", ms=4, label=label)


def plot_interval_curves(curves: dict[str, list[tuple[int, float, float, float]]], goal: str | None = None,
                         colours: dict[str, Any] | None = None) -> Plot:
    """Interval (band) and estimate (line) vs items scored, drawn as steps at the looks, in each model's colour; the
    goal drawn in (a threshold line for ``above:T``/``below:T``; for ``halfwidth:E`` the half-width at E). Up to
    :data:`MAX_OVERLAY` models share one panel (with a half-width panel for a half-width goal); more get one small
    panel each on shared axes (the first :data:`MAX_CURVES`), each titled with its final interval."""
    plt = _pyplot()
    kind, value = _goal_parts(goal)
    colours = colours or model_colours(list(curves))
    names = [n for n in curves if len(curves[n])]
    shown = names[:MAX_CURVES]
    title = "Interval vs items scored, as steps at the looks" + (f" (goal {goal})" if goal else "")
    if len(names) > len(shown):
        title += f" — first {len(shown)} of {len(names)} models"
    marks = []
    if len(shown) <= MAX_OVERLAY:
        width_panel = kind == "halfwidth"
        fig, axes = plt.subplots(1, 2 if width_panel else 1, figsize=(11 if width_panel else 7, 4.2), squeeze=False)
        ax = axes[0, 0]
        for name in shown:
            c = np.asarray(curves[name], dtype=float)
            _steps(ax, c, colours.get(name), name)
            if width_panel:
                _steps(axes[0, 1], c, colours.get(name), width=True)
            marks.append({"model": name, "panel": 0, "looks": len(c)})
        _goal_lines(ax, kind, value)
        ax.set_xlabel("items scored")
        ax.set_ylabel("estimate and confidence interval")
        ax.set_title(title, fontsize=10)
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if shown:
            ax.legend(fontsize=7, loc="best")
        if width_panel:
            w = axes[0, 1]
            w.axhline(value, color="k", ls="--", lw=1, label=f"goal: half-width {value:g}")
            w.set_xlabel("items scored")
            w.set_ylabel("interval half-width")
            w.set_title("Half-width vs items scored", fontsize=10)
            w.set_ylim(bottom=0)
            w.grid(alpha=0.3)
            w.legend(fontsize=7)
        layout = "All models share one panel"
    else:
        cols = 4
        rows = math.ceil(len(shown) / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(12, 2.3 * rows + 0.8), squeeze=False, sharex=True, sharey=True)
        for k, name in enumerate(shown):
            ax = axes[k // cols, k % cols]
            c = np.asarray(curves[name], dtype=float)
            _steps(ax, c, colours.get(name))
            _goal_lines(ax, kind, value, label=False)
            last = c[-1]
            hw = f" ±{0.5 * (last[3] - last[2]):.3f}" if kind == "halfwidth" else ""
            ax.set_title(f"{_short(name)}\n{last[1]:.3f} [{last[2]:.3f}, {last[3]:.3f}]{hw} at {int(last[0])}",
                         fontsize=7)
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=6)
            marks.append({"model": name, "panel": k, "looks": len(c)})
        for k in range(len(shown), rows * cols):
            axes[k // cols, k % cols].set_visible(False)
        fig.supxlabel("items scored", fontsize=8)
        fig.supylabel("estimate and confidence interval", fontsize=8)
        fig.suptitle(title, fontsize=10)
        layout = "One small panel per model, on shared axes, titled with its final estimate and interval"
    caption = ("Each band is the confidence interval recorded at a look and the line the estimate, drawn as steps: "
               "a value holds from its look to the next, and a dot marks each look (no line joins two looks, which "
               f"would show values no look recorded, such as the goal met between them). {layout}"
               + (f"; the dashed line is the goal's threshold {value:g}" if kind in ("above", "below") and value
                  is not None else "")
               + (f"; the goal is a half-width of {value:g}" + (" (each panel's title gives its final half-width)"
                                                                  if len(shown) > MAX_OVERLAY else "")
                  if kind == "halfwidth" and value is not None else "")
               + (f"; the first {len(shown)} of {len(names)} models are drawn" if len(names) > len(shown) else "")
               + " (compare Arviv et al. 2026, Fig. 1).")
    return Plot(_png(fig), title, caption, tuple(marks))


def _short(name: str, limit: int = 34) -> str:
    return name if len(name) <= limit else "…" + name[-(limit - 1):]


def _goal_lines(ax, kind: str | None, value: float | None, *, label: bool = True) -> None:
    if kind in ("above", "below") and value is not None:
        ax.axhline(value, color="k", ls="--", lw=1, label=f"threshold {value:g} ({kind})" if label else None)


def _goal_parts(goal: str | None) -> tuple[str | None, float | None]:
    if not goal or ":" not in str(goal):
        return None, None
    kind, _, raw = str(goal).split("+", 1)[0].partition(":")  # an added rule (+diminishing:G) is not the goal
    try:
        return kind, float(raw)
    except ValueError:
        return kind, None


def plot_ranking(rows: list[dict[str, Any]], colours: dict[str, Any] | None = None) -> bytes:
    """Forest plot: each model's interval, best first, in the model's colour (the same in every plot); tie
    groups on alternating shaded bands."""
    plt = _pyplot()
    shown = rows[:MAX_FOREST]
    fig, ax = plt.subplots(figsize=(7, max(2.0, 0.28 * len(shown) + 1)))
    colours = colours or model_colours([r["model"] for r in rows])
    for y, r in enumerate(shown):
        if int(r.get("group") or 0) % 2 == 0:
            ax.axhspan(y - 0.5, y + 0.5, color="0.92", lw=0, zorder=0)
        _interval_row(ax, y, r.get("lower"), r.get("upper"), r.get("mean"), colours.get(r["model"]), lw=2.2, ms=4)
    title = "Ranking (shaded bands = tie groups)" + (f" — top {len(shown)} of {len(rows)}"
                                                     if len(rows) > len(shown) else "")
    _forest_axes(ax, [f"{r.get('rank', '')}. {r['model']}" for r in shown], "mean score (interval)", title, 12)
    return _png(fig)


def _goal_value(goal: str) -> float | None:
    try:
        return float(str(goal).split(":", 1)[1])
    except (IndexError, ValueError):
        return None


def savings_frame(cells: list[dict[str, Any]]) -> pd.DataFrame:
    """Cells of a backtest/efficiency JSON → one row per (method, goal): mean saving over datasets."""
    frame = pd.DataFrame([c for c in cells if c.get("items_ratio_vs_uniform") is not None])
    if frame.empty:
        return frame
    frame["goal_value"] = frame["goal"].map(_goal_value)
    frame["saving_vs_uniform"] = 1.0 - frame["items_ratio_vs_uniform"]
    if "fraction_of_bank" in frame.columns:
        frame["saving_vs_full_bank"] = 1.0 - frame["fraction_of_bank"]
    agg = {"saving_vs_uniform": "mean", "coverage": "min"}
    if "saving_vs_full_bank" in frame.columns:
        agg["saving_vs_full_bank"] = "mean"
    out = frame.groupby(["method", "goal", "goal_value"], as_index=False).agg(agg)
    out["datasets"] = frame.groupby(["method", "goal", "goal_value"]).size().to_numpy()
    return out.sort_values(["method", "goal_value"])


def plot_savings(cells: list[dict[str, Any]]) -> bytes:
    """Saving (1 − items/items of uniform, and 1 − items/bank size) vs goal half-width, per method."""
    plt = _pyplot()
    frame = savings_frame(cells)
    has_bank = "saving_vs_full_bank" in frame.columns
    fig, axes = plt.subplots(1, 2 if has_bank else 1, figsize=(10 if has_bank else 6, 4), squeeze=False)
    for method, g in frame.groupby("method"):
        axes[0, 0].plot(g["goal_value"], g["saving_vs_uniform"], "o-", label=method)
        if has_bank:
            axes[0, 1].plot(g["goal_value"], g["saving_vs_full_bank"], "o-", label=method)
    axes[0, 0].axhline(0, color="k", lw=0.8)
    axes[0, 0].set_title("items saved vs uniform sampling")
    axes[0, 0].set_ylabel("1 − items / items(uniform)")
    if has_bank:
        axes[0, 1].set_title("items saved vs scoring the whole bank")
        axes[0, 1].set_ylabel("1 − items / bank size")
    for ax in axes[0]:
        ax.set_xlabel("goal: interval half-width ε")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _png(fig)




EPSILON_VERDICTS = ("a>=b-eps", "b>=a-eps", "either order")
STATUS_COLOURS = {"decided": "tab:green", "equivalent": "tab:blue", "undecided": "tab:gray"}


def pair_status(verdict: Any) -> str:
    """How a pair's mark is coloured: ``undecided``, ``equivalent`` (within the margin) or ``decided``."""
    verdict = str(verdict)
    return "undecided" if verdict == "undecided" else "equivalent" if verdict == "equivalent" else "decided"


def differences_caption(pairs: Sequence[Comparison], epsilon: float | None = None) -> str:
    """What the differences plot shows, for the statement the run made (strict at the margin, or ε-statements)."""
    eps = _epsilon(pairs, epsilon)
    if eps is not None and _by_tests(pairs):
        return (f"Each pair's difference A − B with its interval. The ranking makes ε-statements (ε = {eps:g}): "
                f"listing A above B claims mean(A) ≥ mean(B) − {eps:g}, listing B above A claims mean(B) ≥ "
                f"mean(A) − {eps:g} (the dashed lines at −{eps:g} and +{eps:g} are these boundaries). Each listing is "
                f"certified by a one-sided anytime-valid test of its claim (against A − B ≤ −{eps:g}, resp. ≥ "
                f"+{eps:g}) at the pair's level, not by the interval drawn, which is the pair's two-sided confidence "
                "sequence, reported beside it and wider. So a decided pair (green) may have an interval that "
                f"straddles 0 and even reaches past ±{eps:g}: the claim is the order up to {eps:g}, not that the two "
                "differ. Grey: undecided (neither listing certified yet).")
    if eps is not None:
        return (f"Each pair's difference A − B with its interval. The ranking makes ε-statements (ε = {eps:g}): "
                f"listing A above B claims mean(A) ≥ mean(B) − {eps:g}, certified once the difference's interval "
                f"lies above −{eps:g} (the dashed line on the left); listing B above A, once it lies below +{eps:g} "
                "(the dotted line on the right). So a decided pair (green) may straddle 0: the claim is the order "
                f"up to {eps:g}, not that the two differ; a pair whose interval lies inside (−{eps:g}, +{eps:g}) "
                "holds in either order. Grey: undecided (neither listing certified).")
    margin = max([float(p.margin or 0.0) for p in pairs] or [0.0])
    text = ("Each pair's difference A − B with its interval: a pair is decided (green) once its interval clears 0 "
            "(the dashed boundary)")
    if margin > 0:
        text += (f" by more than the margin {margin:g}, or equivalent (blue) once it lies inside the margin band "
                 f"±{margin:g}")
    return text + "; grey: undecided."


def _by_tests(pairs: Sequence[Comparison]) -> bool:
    """Whether the ε-listings were certified by one-sided tests (the default) rather than by the pair intervals,
    as the pairs' guarantee says."""
    return any("one-sided" in p.guarantee for p in pairs)


def _epsilon(pairs: Sequence[Comparison], epsilon: float | None) -> float | None:
    """The run's ε: given, or read off ε-verdicts (their ``margin`` is ε); None for strict statements."""
    if epsilon is not None:
        return float(epsilon)
    marked = [p for p in pairs if p.verdict in EPSILON_VERDICTS]
    return float(marked[0].margin or 0.0) if marked else None


def plot_differences(pairs: Sequence[Comparison], curve: list[tuple[int, float, float, float]] | None = None,
                     epsilon: float | None = None) -> Plot:
    """Paired differences A − B with their intervals, coloured by whether the statement the run makes is decided
    (green), equivalent (blue) or undecided (grey), with that statement's boundaries: 0 and the equivalence margin
    band for strict verdicts, −ε and +ε for ε-statements (``epsilon``; read off the pairs' verdicts when not given).
    Per-model intervals overlap even when a pair is decided; the difference's interval is what decides.
    ``curve``: the recorded (items, difference, lower, upper) per look of a single comparison (second panel, as
    steps at the looks)."""
    plt = _pyplot()
    shown = sorted(pairs, key=lambda p: -abs(float(p.diff or 0.0)))[:MAX_FOREST]
    eps = _epsilon(pairs, epsilon)
    panels = 2 if curve else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, max(2.2, 0.32 * len(shown) + 1.4)), squeeze=False)
    ax = axes[0, 0]
    margin = 0.0 if eps is not None else max([float(p.margin or 0.0) for p in shown] or [0.0])
    _boundaries(ax.axvline, ax.axvspan, eps, margin)
    marks = []
    for y, p in enumerate(shown):
        status = pair_status(p.verdict)
        colour = STATUS_COLOURS[status]
        _interval_row(ax, y, p.lower, p.upper, p.diff, colour, lw=2.4, ms=5)
        marks.append({"pair": f"{p.model_a} − {p.model_b}", "verdict": p.verdict, "status": status,
                      "colour": colour, "lower": p.lower, "upper": p.upper})
    present = [s for s in STATUS_COLOURS if any(m["status"] == s for m in marks)] or ["decided", "undecided"]
    key = ", ".join(f"{STATUS_COLOURS[s].removeprefix('tab:').replace('gray', 'grey')}: {s}" for s in present)
    statement = f"ε-statements, ε = {eps:g}" if eps is not None else "strict" + (
        f", margin {margin:g}" if margin > 0 else "")
    title = f"Paired differences ({statement}; {key})" + (
        f" — {len(shown)} largest of {len(pairs)}" if len(pairs) > len(shown) else "")
    _forest_axes(ax, [f"{p.model_a} − {p.model_b}\n{spell_verdict(p)}" for p in shown],
                 "paired difference of mean scores (A − B) with its interval", title, 9)
    ax.legend(fontsize=7, loc="best")
    if curve:
        c = np.asarray(curve, dtype=float)
        w = axes[0, 1]
        _boundaries(w.axhline, w.axhspan, eps, margin)
        w.fill_between(c[:, 0], c[:, 2], c[:, 3], color="tab:red", alpha=0.18, step="post",
                       label="interval at each look (as recorded; the last one decides the pair)")
        w.plot(c[:, 0], c[:, 1], drawstyle="steps-post", marker="o", ms=3, lw=1.4, color="tab:red",
               label="paired difference at each look")
        last = shown[0]
        w.set_xlabel("items scored per model")
        w.set_ylabel(f"{last.model_a} − {last.model_b}")
        w.set_title(spell_verdict(last), fontsize=9)
        w.grid(alpha=0.3)
        w.legend(fontsize=7)
    return Plot(_png(fig), title, differences_caption(pairs, eps), tuple(marks))


def _boundaries(line, band, eps: float | None, margin: float) -> None:
    """The statement's boundaries on one axis (``line`` / ``band``: axvline/axvspan or axhline/axhspan)."""
    if eps is not None:
        line(-eps, color="k", lw=1, ls="--", label=f"−ε = −{eps:g}: boundary of 'A listed above B'")
        line(eps, color="k", lw=1, ls=":", label=f"+ε = {eps:g}: boundary of 'B listed above A'")
        line(0.0, color="0.6", lw=0.8)
        return
    if margin > 0:
        band(-margin, margin, color="tab:blue", alpha=0.12, label=f"equivalence margin ±{margin:g}")
    line(0.0, color="k", lw=1, ls="--", label="boundary: no difference (0)")
