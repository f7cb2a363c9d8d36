"""The report's plots (matplotlib, Agg backend; PNG bytes): interval curves, the ranking forest, paired
differences and savings vs the goal. Pure: each takes numbers and returns PNG bytes."""


from __future__ import annotations

import io
from typing import Any

import numpy as np
import pandas as pd



MAX_CURVES = 12  # more lines than this in one plot is unreadable
MAX_FOREST = 60


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


def spell_verdict(pair: dict[str, Any]) -> str:
    """A pair's verdict with the models' names (``a>b`` → ``X better than Y``)."""
    a, b = str(pair.get("model_a", "A")), str(pair.get("model_b", "B"))
    template = VERDICT_TEXT.get(str(pair.get("verdict")), "{a} vs {b}: " + str(pair.get("verdict")))
    return template.format(a=a, b=b, m=float(pair.get("margin") or 0.0))


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


def plot_interval_curves(curves: dict[str, list[tuple[int, float, float, float]]], goal: str | None = None,
                         colours: dict[str, Any] | None = None) -> bytes:
    """Interval (band) and estimate (line) vs items scored, one colour per model; the goal drawn in: a threshold
    line for ``above:T``/``below:T``, a half-width panel with the line at E for ``halfwidth:E``. A model with one
    look (a 1-round run) is drawn as a point with its interval."""
    plt = _pyplot()
    kind, value = _goal_parts(goal)
    width_panel = kind == "halfwidth"
    fig, axes = plt.subplots(1, 2 if width_panel else 1, figsize=(11 if width_panel else 7, 4.2), squeeze=False)
    ax = axes[0, 0]
    names = list(curves)[:MAX_CURVES]
    colours = colours or model_colours(list(curves))
    for name in names:
        c = np.asarray(curves[name], dtype=float)
        if c.size == 0:
            continue
        line, = ax.plot(c[:, 0], c[:, 1], lw=1.4, label=name, marker="o" if len(c) < 3 else None, ms=4,
                        color=colours.get(name))
        if len(c) > 1:
            ax.fill_between(c[:, 0], c[:, 2], c[:, 3], color=line.get_color(), alpha=0.18, lw=0)
        else:  # one look: an error bar instead of a band of zero width
            ax.errorbar(c[:, 0], c[:, 1], yerr=[c[:, 1] - c[:, 2], c[:, 3] - c[:, 1]], color=line.get_color(),
                        capsize=4, lw=1.4)
        if width_panel:
            axes[0, 1].plot(c[:, 0], 0.5 * (c[:, 3] - c[:, 2]), color=line.get_color(), lw=1.4,
                            marker="o" if len(c) < 3 else None, ms=4)
    if kind in ("above", "below") and value is not None:
        ax.axhline(value, color="k", ls="--", lw=1, label=f"threshold {value:g} ({kind})")
    ax.set_xlabel("items scored")
    ax.set_ylabel("estimate and confidence interval")
    title = "Interval vs items scored"
    if goal:
        title += f" (goal {goal})"
    if len(curves) > len(names):
        title += f" — first {len(names)} of {len(curves)} models"
    ax.set_title(title)
    ax.set_ylim(-0.02, 1.02)
    ax.grid(alpha=0.3)
    if any(len(curves[n]) for n in names):
        ax.legend(fontsize=7, loc="best", ncol=2 if len(names) > 6 else 1)
    if width_panel:
        w = axes[0, 1]
        w.axhline(value, color="k", ls="--", lw=1, label=f"goal: half-width {value:g}")
        w.set_xlabel("items scored")
        w.set_ylabel("interval half-width")
        w.set_title("Half-width vs items scored")
        w.set_ylim(bottom=0)
        w.grid(alpha=0.3)
        w.legend(fontsize=7)
    return _png(fig)


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




def plot_differences(pairs: list[dict[str, Any]], curve: list[tuple[int, float, float, float]] | None = None) -> bytes:
    """Paired differences A − B with their intervals, the decision boundary at 0 and the equivalence margin band
    (per-model intervals overlap even when a pair is decided; the difference's interval is what decides).
    ``curve``: the recorded (items, difference, lower, upper) per look of a single comparison (second panel)."""
    plt = _pyplot()
    shown = sorted(pairs, key=lambda p: -abs(float(p.get("diff") or 0.0)))[:MAX_FOREST]
    panels = 2 if curve else 1
    fig, axes = plt.subplots(1, panels, figsize=(7 * panels, max(2.2, 0.32 * len(shown) + 1.4)), squeeze=False)
    ax = axes[0, 0]
    margin = max([float(p.get("margin") or 0.0) for p in shown] or [0.0])
    if margin > 0:
        ax.axvspan(-margin, margin, color="tab:blue", alpha=0.12, label=f"equivalence margin ±{margin:g}")
    ax.axvline(0.0, color="k", lw=1, ls="--", label="boundary: no difference (0)")
    colours = {"a>b": "tab:green", "b>a": "tab:green", "equivalent": "tab:blue", "undecided": "tab:gray"}
    for y, p in enumerate(shown):
        colour = colours.get(str(p.get("verdict")), "tab:orange")
        _interval_row(ax, y, p.get("lower"), p.get("upper"), p.get("diff"), colour, lw=2.4, ms=5)
    title = "Paired differences (green: decided, grey: undecided)" + (
        f" — {len(shown)} largest of {len(pairs)}" if len(pairs) > len(shown) else "")
    _forest_axes(ax, [f"{p.get('model_a')} − {p.get('model_b')}\n{spell_verdict(p)}" for p in shown],
                 "paired difference of mean scores (A − B) with its interval", title, 9)
    ax.legend(fontsize=7, loc="best")
    if curve:
        c = np.asarray(curve, dtype=float)
        w = axes[0, 1]
        if margin > 0:
            w.axhspan(-margin, margin, color="tab:blue", alpha=0.12, label=f"equivalence margin ±{margin:g}")
        w.axhline(0.0, color="k", lw=1, ls="--", label="boundary: no difference (0)")
        w.fill_between(c[:, 0], c[:, 2], c[:, 3], color="tab:red", alpha=0.18, step="post",
                       label="interval at each look (as recorded; the last one decides the pair)")
        w.plot(c[:, 0], c[:, 1], "o-", ms=3, lw=1.4, color="tab:red", label="paired difference at each look")
        last = shown[0]
        w.set_xlabel("items scored per model")
        w.set_ylabel(f"{last.get('model_a')} − {last.get('model_b')}")
        w.set_title(spell_verdict(last), fontsize=9)
        w.grid(alpha=0.3)
        w.legend(fontsize=7)
    return _png(fig)
