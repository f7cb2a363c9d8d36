"""Exact intervals without history on banks with sub-datasets: one joint CS against the union bound.

The estimand of a bank with sub-datasets is the mean of sub-dataset means (seed 004, eq. 1). ``uniform`` and
``adaptive`` used to give each sub-dataset its own without-replacement betting CS at δ/H and add the
intervals (union bound); they now run ONE betting CS for the estimand on the stratified control-variate
statistic (``combine='joint'``, :mod:`certeval.estimators.single.adaptive`). This benchmark replays the same
reps (same held-out models, same seeds per rep) with

* ``uniform-union`` — the earlier construction (``uniform``, ``combine='union'``);
* ``uniform`` — draws in proportion to the estimand's weights, one joint CS;
* ``adaptive`` — Neyman draws on the strata's running variances, one joint CS;
* ``history-permuted`` — the history method with history whose items are shuffled (it says nothing true):
  the reference the issue measured ``uniform`` against;

and reports items to reach each half-width goal as a fraction of the bank, the ratio to ``history-permuted``
and to ``uniform-union`` on the same reps, and the coverage of the bank's mean at the stopping time.

    python -m benchmarks strata_combine            # 9 banks x 2 goals, 40 reps a cell (~15 min on 2 cores)
    python -m benchmarks strata_combine --quick    # one bank, one goal, 4 reps (seconds)
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: no BLAS oversubscription

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402
from certeval.backtest.ray_fanout import Cell, dataset_arrays, history_cell, run_cells  # noqa: E402

DATASETS = ("chembench", "helm_mmlu", "helm_raft", "helm_v023", "openllm_arc", "openllm_tiny",
            "vlm_hallusionbench", "vlm_ocrbench", "opencompass_large")
GOALS = ("halfwidth:0.1", "halfwidth:0.05")
LABELS = ("uniform-union", "uniform", "adaptive", "history-permuted")


def cells_for(name: str, n_items: int, goal: str, reps: int) -> list[Cell]:
    batch = max(10, n_items // 100)  # a stopping point known to ±1% of the bank, as in benchmarks.efficiency
    return [Cell(name, "uniform", goal, reps, batch, (("combine", "union"),), "uniform-union"),
            Cell(name, "uniform", goal, reps, batch),
            Cell(name, "adaptive", goal, reps, batch),
            history_cell(name, goal, reps, batch, permute=True)]


def summarise_cell(rows: list[dict], n_items: int) -> dict:
    """Per label: mean items (fraction of the bank) and coverage; ratios on the same reps."""
    by = {label: sorted((r for r in rows if r["method"] == label), key=lambda r: r["rep"]) for label in LABELS}
    items = {label: np.array([r["n_scored"] for r in by[label]], dtype=float) for label in LABELS}
    out = {}
    for label in LABELS:
        out[label] = {
            "fraction": float(items[label].mean() / n_items),
            "coverage": float(np.mean([r["covered"] for r in by[label]])),
            "ratio_to_history_permuted": float(items[label].mean() / items["history-permuted"].mean()),
            "ratio_to_uniform_union": float(items[label].mean() / items["uniform-union"].mean()),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks strata_combine", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="reps per cell (default 40; --quick 4)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--datasets", default=None, help="comma-separated subset of the bundled datasets")
    args = p.parse_args(argv)
    reps = args.reps or (4 if args.quick else 40)
    names = args.datasets.split(",") if args.datasets else (["helm_v023"] if args.quick else list(DATASETS))
    goals = GOALS[:1] if args.quick else GOALS
    rows = []
    for name in names:
        data = dataset_arrays(name, features=False, history=True)
        n = data.spec.n_items
        for goal in goals:
            cell = summarise_cell(run_cells({name: data}, cells_for(name, n, goal, reps), args.seed), n)
            rows.append({"dataset": name, "goal": goal, "n_items": n, "reps": reps,
                         "n_subsets": int(np.unique(data.spec.subset_codes()).size) if data.spec.subsets is not None
                         else 1, "methods": cell})
            print(f"[strata_combine] {name} {goal}: " + " | ".join(
                f"{k} {v['fraction']:.3f} (x{v['ratio_to_history_permuted']:.2f} hp, cov {v['coverage']:.2f})"
                for k, v in cell.items()), file=sys.stderr, flush=True)
    worst = {label: max(r["methods"][label]["ratio_to_history_permuted"] for r in rows)
             for label in ("uniform", "adaptive")}
    path = write_result("strata_combine", {"seed": args.seed, "reps": reps, "goals": list(goals), "rows": rows,
                                           "max_ratio_to_history_permuted": worst}, args.quick)
    print(f"strata_combine -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
