"""gst's miss rate with peeking: how often its repeated CI misses the truth at any of its looks.

``gst`` (:class:`certeval.estimators.distribution.sequential.GroupSequentialMean`) reports ``mean ± c_k·se`` at look k with
an *estimated* standard error: a Wald interval per look, widened by a group-sequential boundary. This measures
how often that misses at some look, at confidence 0.9 (nominal miss rate 0.1), with a look every 20 items up to
400 items, on Bernoulli(p) scores for p in {0.01, 0.05, 0.5}:

* ``distribution`` target: the truth is p; each run scores 400 i.i.d. Bernoulli(p) items (a bank of 400 drawn
  fresh per run, scored in full, so the information fractions are ``n / 400``);
* ``bank`` target: the truth is the mean of the run's bank of 400 such items (the last look, at exhaustion, is
  exact with zero width; the earlier ones are not).

The runs are vectorised: item order is a uniform permutation, so the first n scores of a run are its bank's first n
columns; each look's interval is computed from certeval's own :func:`~certeval.estimators.distribution.sequential.mean_of_means`
and :func:`~certeval.estimators.distribution.sequential.boundary_multiplier` (the method's spending ``ld-pocock``), and the
first runs of every cell are replayed through the method object itself to check the vectorised intervals equal
the method's. Reported per cell: misses, runs, the rate and its Wilson 95% interval.

    python -m benchmarks gst_coverage            # 1,000 runs a cell
    python -m benchmarks gst_coverage --quick    # 100 runs a cell (_quick/)
"""

from __future__ import annotations

import argparse
import math
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402
from certeval.estimators import BankSpec  # noqa: E402
from certeval.estimators.distribution.sequential import GroupSequentialMean, boundary_multiplier, mean_of_means  # noqa: E402

CONFIDENCE = 0.9
LOOK = 20
N = 400
PS = (0.01, 0.05, 0.5)
TARGETS = ("distribution", "bank")
SPENDING = "ld-pocock"
CHECKED = 5  # runs per cell replayed through the method object


def wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion k / n."""
    phat = k / n
    den = 1.0 + z * z / n
    centre = (phat + z * z / (2 * n)) / den
    half = z * math.sqrt(phat * (1 - phat) / n + z * z / (4 * n * n)) / den
    return max(0.0, centre - half), min(1.0, centre + half)


def look_intervals(x: np.ndarray, target: str) -> tuple[np.ndarray, np.ndarray]:
    """(runs, looks) lower and upper bounds of gst's interval at every look, vectorised over runs."""
    looks = list(range(LOOK, N + 1, LOOK))
    lower = np.empty((x.shape[0], len(looks)))
    upper = np.empty_like(lower)
    for k, n in enumerate(looks):
        mean, var = mean_of_means(x[:, :n])
        if target == "bank" and n == N:
            lower[:, k] = upper[:, k] = mean
            continue
        c = boundary_multiplier(SPENDING, 1.0 - CONFIDENCE, looks[:k + 1], N, LOOK, sides=2)
        half = c * np.sqrt(var)
        lower[:, k], upper[:, k] = np.maximum(0.0, mean - half), np.minimum(1.0, mean + half)
    return lower, upper


def method_intervals(row: np.ndarray, target: str) -> tuple[np.ndarray, np.ndarray, str]:
    """The same run through GroupSequentialMean itself (scores in column order)."""
    method = GroupSequentialMean(confidence=CONFIDENCE, target=target, spending=SPENDING, look_size=LOOK)
    method.start(BankSpec(N))
    lows, ups = [], []
    for start in range(0, N, LOOK):
        items = np.arange(start, start + LOOK)
        method.update(items, row[items])
        est = method.result()
        lows.append(est.lower)
        ups.append(est.upper)
    return np.array(lows), np.array(ups), est.validity


def cell(p: float, target: str, runs: int, rng: np.random.Generator) -> dict:
    x = (rng.random((runs, N)) < p).astype(float)
    lower, upper = look_intervals(x, target)
    truth = np.full(runs, p) if target == "distribution" else x.mean(axis=1)
    missed = ((lower > truth[:, None] + 1e-12) | (upper < truth[:, None] - 1e-12)).any(axis=1)
    validity = None
    for r in range(min(CHECKED, runs)):
        lo, up, validity = method_intervals(x[r], target)
        if not (np.allclose(lo, lower[r], atol=1e-12) and np.allclose(up, upper[r], atol=1e-12)):
            raise AssertionError(f"vectorised intervals differ from the method's (p={p}, {target}, run {r})")
    misses = int(missed.sum())
    lo, hi = wilson(misses, runs)
    return {"target": target, "p": p, "runs": runs, "misses": misses, "rate": misses / runs,
            "wilson95": [lo, hi], "nominal": round(1 - CONFIDENCE, 12), "validity": validity}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks gst_coverage", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--runs", type=int, default=None, help="runs per cell (default 1000; --quick 100)")
    ap.add_argument("--seed", type=int, default=44)
    args = ap.parse_args(argv)
    runs = args.runs or (100 if args.quick else 1000)
    cells = []
    for target in TARGETS:
        for i, p in enumerate(PS):
            rng = np.random.default_rng([args.seed, TARGETS.index(target), i])
            row = cell(p, target, runs, rng)
            cells.append(row)
            print(f"{target:12s} p={p:<5g} misses {row['misses']:4d}/{runs}  rate {row['rate']:.3f}  "
                  f"Wilson 95% [{row['wilson95'][0]:.3f}, {row['wilson95'][1]:.3f}]  (nominal {row['nominal']:g})",
                  flush=True)
    path = write_result("gst_coverage", {
        "seed": args.seed, "confidence": CONFIDENCE, "look_every": LOOK, "n_max": N, "spending": SPENDING,
        "miss": "the interval excludes the truth at one or more looks", "cells": cells}, args.quick)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
