"""``select --target distribution`` on 16 close arms: how often some model's interval misses its expected score at
some look, and the items it uses — the exact betting construction (the default) beside the asymptotic Wald one.

The board: 16 models whose per-item scores are i.i.d. Bernoulli(p_j), p linear from 0.75 to 0.60 (and from 0.55 to
0.40), a bank of N = 500 items scored in a uniform random order (each run draws its bank fresh, so the truth is
p_j), a look every 50 items, alpha = 0.1, both modes: ``best`` (threshold 0.02 above the lowest arm, half-width
0.02) and ``precision`` (threshold 0, half-width 0.05). A run *misses* when any model's interval excludes its p_j at
any look up to the model's stop. Constructions:

* ``betting`` — what ``select --target distribution`` runs: the distribution group
  (:func:`certeval.estimators.groups.make_group`) with its default :class:`~certeval.estimators.distribution.selection.
  SequentialSelection` (i.i.d. betting CSs at alpha/16, ``exact``);
* ``wald-pocock`` / ``wald-obf`` — the group-sequential Wald construction (``asymptotic``; the default before),
  Pocock or O'Brien–Fleming boundary on the planned looks of 50.

Reported per cell: misses / runs, the rate with its Wilson 95% interval, the bound alpha + 2 SE (SE =
sqrt(alpha (1 - alpha) / runs)) and whether the rate is within it, the fraction of the 16 x N cells scored, and how
often the best arm was dropped.

    python -m benchmarks select_coverage --workers 2   # 1,000 runs a cell, cells spread over 2 processes
    python -m benchmarks select_coverage --grid 257    # the betting CSs on 257 candidate means (4x faster)
    python -m benchmarks select_coverage --quick       # 5 runs a cell on a 200-item bank (_quick/: it runs)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402
from benchmarks.gst_coverage import wilson  # noqa: E402
from certeval.estimators import BankSpec  # noqa: E402
from certeval.estimators.bank.wor_streams import STREAM_GRID  # noqa: E402
from certeval.estimators.distribution.selection import (  # noqa: E402
    SelectionIntervals,
    SelectionRule,
    SequentialSelection,
)
from certeval.estimators.groups import GroupRequest, make_group  # noqa: E402

ALPHA = 0.1
ARMS = 16
LOOK = 50
BOARDS = ((0.75, 0.60), (0.55, 0.40))
MODES = {"best": (0.02, 0.02), "precision": (None, 0.05)}  # mode: (threshold above the lowest arm, half-width)
CONSTRUCTIONS = ("betting", "wald-pocock", "wald-obf")


def _selector(construction: str, mode: str, threshold: float, halfwidth: float, n: int, grid: int):
    """(update(start, stop, block), the SequentialSelection) for one run."""
    labels = tuple(f"m{j}" for j in range(ARMS))
    if construction == "betting":
        group = make_group(GroupRequest("select", labels, target="distribution", confidence=1 - ALPHA,
                                        threshold=threshold, halfwidth=halfwidth, mode=mode, look_size=LOOK))
        group.start(BankSpec(n), np.arange(n))  # the scores are i.i.d.: the bank's order is the random order
        assert group.interval_claim()["validity"] == "exact"
        if grid != STREAM_GRID:  # the same selection on a coarser grid of candidate means (resolution 1/(grid-1))
            group.estimator_ = SequentialSelection(labels, n_total=n, rule=SelectionRule(threshold, halfwidth, ALPHA, mode),
                                                   intervals=SelectionIntervals(grid_size=grid))
        return group.update, group.estimator_
    spending = construction.split("-")[1]
    sel = SequentialSelection(labels, n_total=n, rule=SelectionRule(threshold, halfwidth, ALPHA, mode),
                              intervals=SelectionIntervals("group-sequential", spending, LOOK))
    return (lambda start, stop, block: sel.update(block)), sel


def cell(board: tuple[float, float], mode: str, construction: str, runs: int, n: int, seed: int,
         grid: int = STREAM_GRID) -> dict:
    p = np.linspace(board[0], board[1], ARMS)
    above, halfwidth = MODES[mode]
    threshold = 0.0 if above is None else board[1] + above
    misses = best_dropped = 0
    used = []
    t0 = time.process_time()
    for r in range(runs):
        rng = np.random.default_rng([seed, r])  # the same banks for every construction of a board
        x = (rng.random((ARMS, n)) < p[:, None]).astype(float)
        update, sel = _selector(construction, mode, threshold, halfwidth, n, grid)
        missed = False
        for start in range(0, n, LOOK):
            if not sel.running.any():
                break
            update(start, min(start + LOOK, n), x[:, start:start + LOOK])
            missed |= bool(((sel.lower > p + 1e-12) | (sel.upper < p - 1e-12)).any())
        out = sel.result()
        misses += missed
        best_dropped += out.models[0].status in ("below", "not-best")
        used.append(out.fraction_used)
    lo, hi = wilson(misses, runs)
    bound = ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / runs)
    return {"board": list(board), "mode": mode, "construction": construction, "threshold": threshold,
            "halfwidth": halfwidth, "runs": runs, "misses": misses, "rate": misses / runs, "wilson95": [lo, hi],
            "alpha_plus_2se": bound, "within": misses / runs <= bound, "best_dropped": best_dropped,
            "fraction_used": float(np.mean(used)), "cpu_s_per_run": (time.process_time() - t0) / runs,
            "validity": out.validity, "grid": grid if construction == "betting" else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks select_coverage", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=None, help="runs per cell (default 1000; --quick 5)")
    ap.add_argument("--items", type=int, default=None, help="bank size N (default 500; --quick 200)")
    ap.add_argument("--workers", type=int, default=1, help="processes the cells are spread over (default 1)")
    ap.add_argument("--grid", type=int, default=STREAM_GRID,
                    help=f"candidate means per betting CS (default {STREAM_GRID}, what select runs; coarser is faster)")
    ap.add_argument("--seed", type=int, default=54)
    args = ap.parse_args(argv)
    runs = args.runs or (5 if args.quick else 1000)
    n = args.items or (200 if args.quick else 500)
    jobs = [(board, mode, construction, runs, n, args.seed + b, args.grid) for b, board in enumerate(BOARDS)
            for mode in MODES for construction in CONSTRUCTIONS]
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        cells = list(pool.map(cell, *zip(*jobs)))
    for row in cells:
        board = row["board"]
        print(f"{board[0]:.2f}->{board[1]:.2f} {row['mode']:9s} {row['construction']:11s} misses {row['misses']:4d}/"
              f"{runs} rate {row['rate']:.3f} [{row['wilson95'][0]:.3f}, {row['wilson95'][1]:.3f}] "
              f"(<= {row['alpha_plus_2se']:.3f}: {row['within']})  used {row['fraction_used']:.3f}  "
              f"best dropped {row['best_dropped']}  {row['validity']}", flush=True)
    path = write_result("select_coverage", {
        "seed": args.seed, "grid": args.grid, "alpha": ALPHA, "arms": ARMS, "n_items": n, "look_every": LOOK,
        "miss": "some model's interval excludes its expected score at one or more looks", "cells": cells},
        args.quick)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
