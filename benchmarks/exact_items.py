"""Items the exact methods need to reach a half-width, side by side with the construction they replaced.

Every cell replays the same reps (rep r evaluates held-out model r mod M with its own seed; history is the other
half of the models) and stops at the goal. Labels:

* ``uniform-before`` — ``uniform`` as it was: one betting CS per sub-dataset at δ/H added up (union bound,
  ``combine='union'``) with Waudby-Smith & Ramdas's all-times bets (``bet_halfwidth=None``);
* ``uniform`` — one betting CS for the estimand (no union bound), draws in proportion to its weights, bets tuned to
  the goal's half-width (``λ = α ε / v``, :func:`certeval.estimators.single.bounds.bet_sizes`);
* ``adaptive`` — the same with Neyman draws on the strata's running variances;
* ``history`` / ``history-permuted`` — the history method with the held-out half's history, and with that
  history's items shuffled (it says nothing true), both with tuned bets;
* ``history-before`` — the history method's column of the efficiency table (docs/results.md)
  (``benchmarks/results/efficiency.json``: all-times bets, c = ½, 200 reps at an earlier commit), read, not re-run.

Reported per bank × goal: items as a fraction of the bank, coverage of the bank's mean at the stopping time, and
the ratios ``uniform ÷ uniform-before``, ``uniform ÷ history-permuted``, ``adaptive ÷ history-permuted``,
``history ÷ history-permuted`` (what the history itself contributes), ``history ÷ uniform`` and
``history ÷ history-before``.

    python -m benchmarks exact_items            # 9 banks x 3 goals, 40 reps a cell (tens of minutes on 2 cores)
    python -m benchmarks exact_items --quick    # one bank, one goal, 2 reps (seconds)
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: no BLAS oversubscription

import numpy as np  # noqa: E402

from benchmarks._meta import read_result, write_result  # noqa: E402
from certeval.backtests.cells import Cell, history_cell
from certeval.backtests.ray_fanout import dataset_arrays, run_cells  # noqa: E402

DATASETS = ("chembench", "helm_mmlu", "helm_raft", "helm_v023", "openllm_arc", "openllm_tiny",
            "vlm_hallusionbench", "vlm_ocrbench", "opencompass_large")
GOALS = ("halfwidth:0.1", "halfwidth:0.05", "halfwidth:0.02")
LABELS = ("uniform-before", "uniform", "adaptive", "history", "history-permuted")
RATIOS = {"uniform_vs_uniform_before": ("uniform", "uniform-before"),
          "uniform_vs_history_permuted": ("uniform", "history-permuted"),
          "adaptive_vs_history_permuted": ("adaptive", "history-permuted"),
          "history_vs_history_permuted": ("history", "history-permuted"),
          "history_vs_uniform": ("history", "uniform")}


def cells_for(name: str, n_items: int, goal: str, reps: int) -> list[Cell]:
    batch = max(10, n_items // 100)  # a stopping point known to ±1% of the bank, as in benchmarks.efficiency
    before = (("bet_halfwidth", None), ("combine", "union"))
    return [Cell(name, "uniform", goal, reps, batch, before, "uniform-before"),
            Cell(name, "uniform", goal, reps, batch),
            Cell(name, "adaptive", goal, reps, batch),
            history_cell(name, goal, reps, batch),
            history_cell(name, goal, reps, batch, permute=True)]


def history_before(name: str, goal: str) -> float | None:
    """The efficiency table's ``history`` fraction of the bank for this cell (None when not recorded)."""
    doc = read_result("efficiency") or {}
    for c in doc.get("cells", []):
        if c.get("dataset") == name and c.get("method") == "history" and c.get("goal") == goal:
            return float(c["fraction_of_bank"])
    return None


def summarise_cell(rows: list[dict], n_items: int) -> dict:
    by = {label: [r for r in rows if r["method"] == label] for label in LABELS}
    items = {label: float(np.mean([r["n_scored"] for r in by[label]])) for label in LABELS}
    out = {"methods": {label: {"fraction": items[label] / n_items,
                               "coverage": float(np.mean([r["covered"] for r in by[label]]))} for label in LABELS}}
    out["ratios"] = {key: items[a] / items[b] for key, (a, b) in RATIOS.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks exact_items", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="reps per cell (default 40; --quick 2)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--datasets", default=None, help="comma-separated subset of the bundled datasets")
    args = p.parse_args(argv)
    reps = args.reps or (2 if args.quick else 40)
    names = args.datasets.split(",") if args.datasets else (["helm_v023"] if args.quick else list(DATASETS))
    goals = GOALS[:1] if args.quick else GOALS
    rows = []
    for name in names:
        data = dataset_arrays(name, features=None, history=True)
        n = data.spec.n_items
        for goal in goals:
            cell = summarise_cell(run_cells({name: data}, cells_for(name, n, goal, reps), args.seed), n)
            before = history_before(name, goal)
            cell["methods"]["history-before"] = {"fraction": before, "coverage": None}
            cell["ratios"]["history_vs_history_before"] = (None if not before else
                                                           cell["methods"]["history"]["fraction"] / before)
            rows.append({"dataset": name, "goal": goal, "n_items": n, "reps": reps, **cell})
            print(f"[exact_items] {name} {goal}: " + " | ".join(
                f"{k} {v['fraction']:.3f}" for k, v in cell["methods"].items() if v["fraction"] is not None)
                + " || " + " ".join(f"{k} x{v:.2f}" for k, v in cell["ratios"].items() if v is not None),
                file=sys.stderr, flush=True)
    summary = {}
    for goal in goals:
        mine = [r for r in rows if r["goal"] == goal]
        summary[goal] = {key: {"median": float(np.median([r["ratios"][key] for r in mine if r["ratios"][key]])),
                               "max": float(np.max([r["ratios"][key] for r in mine if r["ratios"][key]]))}
                         for key in (*RATIOS, "history_vs_history_before")
                         if any(r["ratios"][key] for r in mine)}
        summary[goal]["min_coverage"] = float(min(v["coverage"] for r in mine for v in r["methods"].values()
                                                  if v["coverage"] is not None))
    path = write_result("exact_items", {"seed": args.seed, "reps": reps, "goals": list(goals), "rows": rows,
                                        "summary": summary}, args.quick)
    print(f"exact_items -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
