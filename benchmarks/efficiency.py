"""Sample efficiency on the real recorded data: items needed to reach a precision goal.

For every bundled dataset and every single-model method (static, seq, cer-eval, uniform,
adaptive) and several half-width goals, replay ``reps`` runs (rep r evaluates the r-th
held-out model in turn, with its own seed) and report: mean items scored when the goal was
met, the ratio to ``uniform`` (certeval's uniform-order betting confidence sequence) and to
the uniform-order method with the *same* guarantee type (Cer-Eval vs Seq, adaptive vs
uniform), and the measured coverage of the bank's true mean at the stopping time (Wilson
95% interval over reps). Cer-Eval's features are item factors from the held-out half of
the models (mean score + SVD components), since 7 of 9 datasets have no item text.

The estimand is the bank's mean-of-means over subsets (seed 004, eq. 1) for every method, or with
``--estimand bank-mean`` the plain bank mean (seed 000's setting; written as ``efficiency_bank_mean``).
Batch size is 1% of the bank (at least 10 items), so a stopping point is known to ±1%.

    python -m benchmarks efficiency            # full: 200 reps per cell on Ray (2 CPUs)
    python -m benchmarks efficiency --quick    # minutes: 4 reps, one goal, in-process
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: no BLAS oversubscription

from benchmarks._meta import read_result, write_result  # noqa: E402
from certeval.backtest.ray_fanout import Cell, dataset_arrays, run_cells, summarise  # noqa: E402
from certeval.banks import bundled_datasets  # noqa: E402

METHODS = ("static", "seq", "cer-eval", "uniform", "adaptive")
GOALS = ("halfwidth:0.1", "halfwidth:0.05", "halfwidth:0.02")
# every method gets the same reps per cell: coverage is the claim, and 200 reps resolve 0.95 to about ±0.03
REPS_STATIC = 200
REPS_CAP: dict[str, int] = {}


def batch_size_for(n_items: int) -> int:
    return max(10, n_items // 100)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks efficiency", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few reps, one goal, in-process (minutes)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--reps", type=int, default=None, help="reps per cell (default 200; --quick 4)")
    p.add_argument("--datasets", default=None, help="comma-separated subset of the bundled datasets")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--goals", default=None, help="comma-separated goals (default halfwidth 0.1,0.05,0.03,0.02)")
    p.add_argument("--no-ray", action="store_true", help="run in-process instead of on local Ray")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster instead of a local one")
    p.add_argument("--estimand", choices=("mean-of-means", "bank-mean"), default="mean-of-means",
                   help="mean of sub-dataset means (default; result 'efficiency') or the plain bank mean "
                        "(result 'efficiency_bank_mean')")
    p.add_argument("--ratio-only", default=None,
                   help="with --append: methods run only as same-rep baselines for the ratios, not stored")
    p.add_argument("--append", action="store_true",
                   help="keep the stored result's cells for other methods/datasets and replace only those rerun")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    reps = args.reps or (4 if quick else 200)
    goals = tuple(args.goals.split(",")) if args.goals else (("halfwidth:0.05",) if quick else GOALS)
    methods = tuple(args.methods.split(","))
    names = args.datasets.split(",") if args.datasets else bundled_datasets()
    use_ray = not (args.no_ray or quick)
    t0 = time.perf_counter()
    datasets = {}
    for name in names:
        datasets[name] = dataset_arrays(name, max_eval_models=4 if quick else None,
                                        mean_of_means=args.estimand == "mean-of-means")
    load_s = time.perf_counter() - t0
    cells = []
    for name, data in datasets.items():
        for goal in goals:
            for method in methods:
                n = min(reps, REPS_STATIC) if method == "static" and not quick else reps
                n = n if quick else min(n, REPS_CAP.get(name, n))
                cells.append(Cell(name, method, goal, n, batch_size_for(data.spec.n_items)))
    t1 = time.perf_counter()
    last = [0.0]

    def progress(done: int, total: int, what: str) -> None:
        now = time.perf_counter()
        if now - last[0] > 20 or done == total:
            last[0] = now
            print(f"[efficiency] {done}/{total} chunks, {now - t1:.0f} s ({what})", file=sys.stderr, flush=True)

    rows = run_cells(datasets, cells, args.seed, use_ray=use_ray, ray_address=args.ray_address,
                     chunk_reps=10 if quick else 25, record_errors=True, progress=progress)
    run_s = time.perf_counter() - t1
    summary = summarise(rows, baseline="uniform")
    result_name = "efficiency" if args.estimand == "mean-of-means" else "efficiency_bank_mean"
    previous = read_result(result_name, quick) if args.append else None
    if previous:
        # methods named in --ratio-only ran only so that ratios compare the same reps (same models,
        # same count); their cells are not merged, and the merged cells keep their in-run ratios
        ratio_only = set(args.ratio_only.split(",")) if args.ratio_only else set()
        new = [c for c in summary if c["method"] not in ratio_only]
        for c in new:
            c["note"] = f"{c['reps']} reps; ratios against the baselines re-run on the same reps"
        rerun = {(c["dataset"], c["method"], c["goal"]) for c in new}
        kept = [c for c in previous.get("cells", []) if (c["dataset"], c["method"], c["goal"]) not in rerun]
        order = {n: i for i, n in enumerate(METHODS)}
        summary = sorted(kept + new, key=lambda c: (c["dataset"], c["goal"], order.get(c["method"], 99)))
        payload_extra = {"first_run_meta": previous.get("first_run_meta") or previous.get("meta"),
                         "first_run_wall_s": previous.get("first_run_wall_s") or previous.get("wall_s"),
                         "appended": previous.get("appended", []) + [" ".join(sys.argv[1:])]}
    else:
        payload_extra = {}
    payload = {
        "seed": args.seed,
        "reps_per_cell": reps,
        "reps_static": min(reps, REPS_STATIC) if not quick else reps,
        "reps_cap": {} if quick else REPS_CAP,
        "goals": list(goals),
        "methods": list(methods),
        "estimand": ("bank mean-of-means over subsets (seed 004 eq. 1)" if args.estimand == "mean-of-means"
                     else "plain bank mean (every item 1/N; seed 000's setting)") + ", confidence 0.95",
        "batch_size": "max(10, n_items // 100)",
        "ray": use_ray,
        "wall_s": {"load": load_s, "replay": run_s},
        "datasets": {name: d.notes for name, d in datasets.items()},
        "cells": summary,
        **payload_extra,
    }
    path = write_result(result_name, payload, quick, seed=args.seed)
    bad = [c for c in summary if c.get("errors")]
    print(f"efficiency: {len(summary)} cells, {len(rows)} reps in {run_s:.0f} s -> {path}")
    for c in bad:
        print(f"  {c['dataset']}/{c['method']}/{c['goal']}: {c['errors']} reps raised "
              f"({c.get('first_error', '')})", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
