"""Backtest summaries (coverage with Wilson bounds, items against the same-guarantee baseline)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

# --------------------------------------------------------------------------------------
# summaries
# --------------------------------------------------------------------------------------


def _wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a coverage proportion (Wilson 1927)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


# The uniform-sampling method with the same kind of guarantee as each method: Cer-Eval is
# compared with Seq (both adaptive-Hoeffding, Wang et al. 2025, arXiv:2505.03814 §6), adaptive with uniform (same betting CS).
# FAQ is compared with itself on uninformative factors (same PAI estimator, same asymptotic anytime CS).
SAME_GUARANTEE_BASELINE = {"adaptive": "uniform", "uniform": "uniform", "cer-eval": "seq", "seq": "seq",
                           "static": "static", "faq": "faq-uniform", "faq-uniform": "faq-uniform",
                           "faq-uniform-half": "faq-uniform", "history": "uniform", "history-permuted": "uniform"}


def _cost(g: Any) -> np.ndarray:
    """Model calls per rep: distinct items scored. Equal to ``n_scored`` for methods drawing without
    replacement; a with-replacement method (faq) re-draws items whose score is already cached."""
    draws = g["n_scored"].to_numpy(float)
    if "n_distinct" not in g:
        return draws
    distinct = g["n_distinct"].to_numpy(float)
    return np.where(np.isnan(distinct), draws, distinct)


def summarise(rows: Iterable[dict[str, Any]], baseline: str = "uniform",
              same_guarantee: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per (dataset, method, goal): mean items, ratios to baselines on the same reps, coverage.

    A ratio is mean items of the method over mean items of the baseline at the same goal on
    the same dataset (same models and reps); ``saving = 1 - ratio``. ``items_ratio_vs_uniform``
    uses ``baseline``; ``items_ratio_same_guarantee`` uses the uniform-order method with the same
    guarantee type (:data:`SAME_GUARANTEE_BASELINE`).

    Items are model calls (:func:`_cost`): distinct items scored; ``mean_draws`` counts draws. A rep
    that stopped without meeting its goal (bank exhausted, or a with-replacement method at its cap on
    draws) counts what it scored — a lower bound on what it needed — and not in ``reached_rate``;
    ``rules`` counts how reps stopped.
    """
    same_guarantee = SAME_GUARANTEE_BASELINE if same_guarantee is None else same_guarantee
    import pandas as pd

    frame = pd.DataFrame(list(rows))
    if frame.empty:
        return []
    if "error" not in frame.columns:
        frame["error"] = None
    out = []
    for (dataset, method, goal), g_all in frame.groupby(["dataset", "method", "goal"], sort=False):
        errors = g_all[g_all["error"].notna()]
        g = g_all[g_all["error"].isna()]
        n = len(g)
        if n == 0:
            out.append({"dataset": dataset, "method": method, "goal": goal, "reps": 0, "errors": len(errors),
                        "first_error": str(errors["error"].iloc[0])})
            continue
        covered = int(g["covered"].sum())
        n_items = _cost(g)
        base = frame[(frame["dataset"] == dataset) & (frame["method"] == baseline) & (frame["goal"] == goal)
                     & frame["error"].isna()]
        ratio = float(n_items.mean() / _cost(base).mean()) if len(base) else None
        sg_name = same_guarantee.get(str(method).split("@")[0], baseline)
        sg = frame[(frame["dataset"] == dataset) & (frame["method"] == sg_name) & (frame["goal"] == goal)
                   & frame["error"].isna()]
        ratio_sg = float(n_items.mean() / _cost(sg).mean()) if len(sg) else None
        lo, hi = _wilson(covered, n)
        out.append({
            "dataset": dataset, "method": method, "goal": goal, "reps": n,
            "mean_items": float(n_items.mean()), "median_items": float(np.median(n_items)),
            "mean_draws": float(g["n_scored"].mean()),
            "sd_items": float(n_items.std(ddof=1)) if n > 1 else 0.0,
            "n_items": int(g["n_items"].iloc[0]) if "n_items" in g else None,
            "fraction_of_bank": float((n_items / g["n_items"].to_numpy(float)).mean()) if "n_items" in g else None,
            "items_ratio_vs_uniform": ratio, "saving_vs_uniform": None if ratio is None else 1.0 - ratio,
            "same_guarantee_baseline": sg_name, "items_ratio_same_guarantee": ratio_sg,
            # a baseline that ran out of bank before its goal makes the ratio censored, not a saving
            "same_guarantee_reached_rate": float(sg["reached"].mean()) if len(sg) else None,
            "coverage": covered / n, "coverage_ci95": [lo, hi],
            "reached_rate": float(g["reached"].mean()),
            "mean_abs_error": float((g["mean"] - g["truth"]).abs().mean()),
            "mean_halfwidth": float(g["halfwidth"].mean()),
            "anytime_valid": bool(g["anytime_valid"].all()),
            "controller_s_per_rep": float(g["controller_s"].mean()),
            "rules": {str(k): int(v) for k, v in g["rule"].fillna("none").value_counts().items()},
            "errors": len(errors),
        })
    return out
