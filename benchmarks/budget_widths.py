"""Width at the budget the user set: certeval's exact history CS against PPI++ and against itself with a reachable goal.

A run with ``--goal halfwidth:E --max-items B`` tunes its bets to the horizon it can reach, ``min(n_goal, B, N)``
(:func:`certeval.estimators.method_for_goal`, :func:`certeval.estimators.single.bounds.bet_sizes`), so a goal the
budget cannot reach must not widen the interval it ends with. Every rep replays one model's recorded scores through
the live round engine (:func:`certeval.engine.replay_once`: batches of 10, a look after each) with the bank's own
estimand (mean of sub-dataset means where the bank has them) and half the other models as history. Labels:

* ``history`` — ``--goal halfwidth:E --max-items B`` (the run stops at the goal or the budget);
* ``history-budget`` — the same method tuned to the budget alone (``bet_horizon = B``, what a goal that the budget
  just reaches gets), on the same random stream: the "reachable goal" baseline;
* ``ppi++`` — PPI++ from the peer package ``ppi-python`` (``ppi_py.ppi_mean_ci``, power-tuned λ; Angelopoulos,
  Duchi & Zrnic 2023): asymptotic, one fixed n = B, for an infinite population, with B items drawn ∝ the estimand's
  weights, the history's item mean as the predictor and every bank item as unlabelled data.

``grid``: every bundled bank × goals 0.001–0.1 × budgets 50–500 (budgets above half the bank skipped): median
half-width of each label, ``history ÷ ppi++`` and ``history ÷ history-budget`` (medians of per-rep ratios), items.

``check`` (the acceptance numbers): helm_mmlu, openllm_arc and vlm_ocrbench at B = 100 with goal 0.001, five models
each; per (bank, model) the ratio of median half-widths history ÷ PPI++; coverage of the bank's estimand at every
look over ≥ 1,000 runs, with a control that must undercover: PPI++ recomputed at every look of 10 items on its own
draws (an asymptotic fixed-n interval under peeking). A one-sided binomial test at level 0.01 says whether each
covers less than 95%.

    python -m benchmarks budget_widths            # the grid (10 reps a cell) and the check (70 reps a model)
    python -m benchmarks budget_widths --quick    # one bank, one cell, 2 reps (seconds)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: no BLAS oversubscription

import numpy as np  # noqa: E402
from scipy.stats import binomtest  # noqa: E402

from benchmarks._meta import read_result, write_result  # noqa: E402
from certeval.backtests.ray_fanout import dataset_arrays  # noqa: E402
from certeval.engine import Replay, replay_once  # noqa: E402
from certeval.estimators import parse_goal  # noqa: E402

DATASETS = ("chembench", "helm_mmlu", "helm_raft", "helm_v023", "openllm_arc", "openllm_tiny",
            "vlm_hallusionbench", "vlm_ocrbench", "opencompass_large")
GOALS = (0.001, 0.01, 0.05, 0.1)
BUDGETS = (50, 100, 200, 500)
CHECK_BANKS = ("helm_mmlu", "openllm_arc", "vlm_ocrbench")
CHECK_MODELS, BATCH, CONFIDENCE = 5, 10, 0.95


def _ppi():
    try:
        import ppi_py
    except ImportError:
        return None
    return ppi_py


def ppi_halfwidths(ppi_py, x: np.ndarray, f: np.ndarray, w: np.ndarray, budget: int, rng: np.random.Generator,
                   looks: bool = False) -> tuple[float, bool]:
    """PPI++'s half-width at n = ``budget`` (items drawn ∝ w) and whether it covered ``Σ w x`` — at every look of
    ``BATCH`` items when ``looks`` (the peeking control), else at n = budget only."""
    drawn = rng.choice(x.size, size=budget, replace=False, p=w)
    truth, covered, half = float(w @ x), True, float("nan")
    w_unlabelled = w * x.size
    for n in (range(BATCH, budget + 1, BATCH) if looks else (budget,)):
        d = drawn[:n]
        lo, hi = ppi_py.ppi_mean_ci(x[d], f[d], f, alpha=1.0 - CONFIDENCE, w_unlabeled=w_unlabelled)
        lo, hi = float(np.ravel(lo)[0]), float(np.ravel(hi)[0])
        covered &= lo <= truth <= hi
        half = 0.5 * (hi - lo)
    return half, bool(covered)


def exact_run(data, x: np.ndarray, goal: float, budget: int, seed: list[int], budget_only: bool = False
              ) -> tuple[float, int, bool]:
    """(half-width at the stop, items, covered at every look) of the history method on one model's scores."""
    spec = replace(data.spec, history=data.history)
    truth = float(spec.weights() @ x)
    looks: list[bool] = []
    params = {"subset_intervals": False} | ({"bet_horizon": budget} if budget_only else {})
    est, _ = replay_once(Replay("history", params, parse_goal(f"halfwidth:{goal}"), BATCH, budget), spec, x,
                         np.random.default_rng(seed),
                         on_look=lambda e: looks.append(e.lower - 1e-12 <= truth <= e.upper + 1e-12))
    return 0.5 * (est.upper - est.lower), int(est.n_scored), all(looks)


def _load(name: str):
    data = dataset_arrays(name, features=None, history=True)
    return data, np.clip(data.history.item_mean, 0.0, 1.0), data.spec.weights()


def grid(names: list[str], goals: tuple[float, ...], budgets: tuple[int, ...], reps: int, seed: int) -> list[dict]:
    ppi_py = _ppi()
    rows = []
    for name in names:
        data, f, w = _load(name)
        for budget in (b for b in budgets if b <= data.spec.n_items // 2):
            ppi = [ppi_halfwidths(ppi_py, data.matrix[r % len(data.models)], f, w, budget,
                                  np.random.default_rng([seed, budget, r, 2]))[0]
                   for r in range(reps)] if ppi_py is not None else []
            tuned = [exact_run(data, data.matrix[r % len(data.models)], 0.001, budget, [seed, budget, r],
                               budget_only=True) for r in range(reps)]
            for goal in goals:
                runs = [exact_run(data, data.matrix[r % len(data.models)], goal, budget, [seed, budget, r])
                        for r in range(reps)]
                half = np.array([h for h, _, _ in runs])
                row = {"dataset": name, "n_items": data.spec.n_items, "goal": goal, "budget": budget, "reps": reps,
                       "median_halfwidth": {"history": float(np.median(half)),
                                            "history-budget": float(np.median([h for h, _, _ in tuned])),
                                            "ppi++": float(np.median(ppi)) if ppi else None},
                       "mean_items": {"history": float(np.mean([n for _, n, _ in runs])),
                                      "history-budget": float(np.mean([n for _, n, _ in tuned]))},
                       "history_vs_budget_tuned": float(np.median(half / np.array([h for h, _, _ in tuned]))),
                       "history_vs_ppi": float(np.median(half / np.array(ppi))) if ppi else None,
                       "coverage_with_peeking": float(np.mean([c for _, _, c in runs]))}
                rows.append(row)
                print(f"[budget_widths] {name} B={budget} goal {goal}: history {row['median_halfwidth']['history']:.4f}"
                      f" budget-tuned {row['median_halfwidth']['history-budget']:.4f} ppi++ "
                      f"{row['median_halfwidth']['ppi++'] or float('nan'):.4f} | ÷ppi {row['history_vs_ppi'] or 0:.2f}"
                      f" ÷budget {row['history_vs_budget_tuned']:.3f}", file=sys.stderr, flush=True)
    return rows


def check(names: tuple[str, ...], reps: int, seed: int, budget: int = 100, goal: float = 0.001) -> dict:
    """The acceptance numbers: width ratios against PPI++ per (bank, model), coverage with a peeking control."""
    ppi_py = _ppi()
    cells, exact_cover, control_cover = [], [], []
    for name in names:
        data, f, w = _load(name)
        for m in range(min(CHECK_MODELS, len(data.models))):
            x = data.matrix[m]
            runs = [exact_run(data, x, goal, budget, [seed, m, r]) for r in range(reps)]
            exact_cover += [c for _, _, c in runs]
            cell = {"dataset": name, "model": data.models[m], "reps": reps,
                    "median_halfwidth": float(np.median([h for h, _, _ in runs]))}
            if ppi_py is not None:
                ppi = [ppi_halfwidths(ppi_py, x, f, w, budget, np.random.default_rng([seed, m, r, 2]), looks=True)
                       for r in range(reps)]
                control_cover += [c for _, c in ppi]
                cell["ppi_median_halfwidth"] = float(np.median([h for h, _ in ppi]))
                cell["history_vs_ppi"] = cell["median_halfwidth"] / cell["ppi_median_halfwidth"]
            cells.append(cell)
            print(f"[budget_widths] check {name} {cell['model']}: {cell['median_halfwidth']:.4f} "
                  f"÷ppi {cell.get('history_vs_ppi', float('nan')):.3f}", file=sys.stderr, flush=True)

    def coverage(flags: list[bool]) -> dict | None:
        if not flags:
            return None
        hits = int(np.sum(flags))
        p = binomtest(hits, len(flags), CONFIDENCE, alternative="less").pvalue
        return {"runs": len(flags), "coverage": hits / len(flags), "p_undercover": float(p),
                "undercovers_at_0.01": bool(p < 0.01)}

    ratios = [c["history_vs_ppi"] for c in cells if "history_vs_ppi" in c]
    return {"budget": budget, "goal": goal, "cells": cells,
            "history_vs_ppi_median": float(np.median(ratios)) if ratios else None,
            "history_vs_ppi_max": float(np.max(ratios)) if ratios else None,
            "coverage_history": coverage(exact_cover),
            "coverage_control_ppi_peeking": coverage(control_cover)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks budget_widths", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="grid reps per cell (default 10; --quick 2)")
    p.add_argument("--check-reps", type=int, default=None, help="check reps per model (default 70; --quick 2)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--datasets", default=None, help="comma-separated subset of the bundled datasets (grid)")
    p.add_argument("--skip-grid", action="store_true", help="only the check")
    args = p.parse_args(argv)
    reps = args.reps or (2 if args.quick else 10)
    check_reps = args.check_reps or (2 if args.quick else 70)
    names = args.datasets.split(",") if args.datasets else (["helm_v023"] if args.quick else list(DATASETS))
    goals, budgets = ((GOALS[0],), (BUDGETS[0],)) if args.quick else (GOALS, BUDGETS)
    rows = [] if args.skip_grid else grid(names, goals, budgets, reps, args.seed)
    acceptance = check(CHECK_BANKS[:1] if args.quick else CHECK_BANKS, check_reps, args.seed)
    summary = {}
    for goal in goals:
        mine = [r for r in rows if r["goal"] == goal and r["history_vs_ppi"] is not None]
        if mine:
            summary[str(goal)] = {
                "history_vs_ppi_median": float(np.median([r["history_vs_ppi"] for r in mine])),
                "history_vs_ppi_max": float(np.max([r["history_vs_ppi"] for r in mine])),
                "history_vs_budget_tuned_max": float(np.max([r["history_vs_budget_tuned"] for r in mine])),
                "min_coverage_with_peeking": float(np.min([r["coverage_with_peeking"] for r in mine]))}
    payload = {"seed": args.seed, "reps": reps, "confidence": CONFIDENCE, "ppi_python": _ppi() is not None,
               "rows": rows, "summary": summary, "check": acceptance}
    if args.skip_grid:  # the check alone: the stored grid stays, said so
        payload = _stored_grid(args.quick) | {"check": acceptance, "check_only_rerun": True}
    path = write_result("budget_widths", payload, args.quick)
    print(f"budget_widths -> {path}")
    return 0


def _stored_grid(quick: bool) -> dict:
    """The grid of the last full run (``rows``, ``summary``, its ``meta`` as ``grid_meta``), or an empty one."""
    stored = read_result("budget_widths", quick)
    if stored is None:
        return {"rows": [], "summary": {}}
    return {k: v for k, v in stored.items() if k not in ("meta", "check", "check_meta", "check_only_rerun")} | {
        "grid_meta": stored.get("grid_meta", stored.get("meta"))}


if __name__ == "__main__":
    sys.exit(main())
