"""Family-wise error of the neighbour ε-ranking with peeking, on hard boards: chains of models whose exact bank
means step down by ε + 0.002 (each adjacent pair has exactly one true listing, and the false one's null sits
0.002 from its boundary), with a control that drops the multiplicity correction.

A board: ``chains`` chains of ``length`` models on ``items`` items (scores 0/1). In a chain, model k+1 is model k
with ``(ε + 0.002)·N`` of its correct answers turned wrong (nested, so the pair's differences are all of one sign:
a low-variance paired difference that the pair tests settle fast — where a test at its boundary is most tempted);
the chains start at random abilities and are independent. Each run draws a board and an item order, looks every
``look`` items and stops models as soon as the rule allows (peeking). A run *fails* when any certificate the
ranking made was false at any look — a model CS that misses its exact bank mean (the running intersection misses it
at the end) or a pair test that rejected a true null — or the final listing is wrong by more than ε; this is the
event the union bound controls, and it contains every wrong statement. At level α the failure rate must be at most
α; the control — every model CS at (model share)·α and every pair's tests at (1 − share)·α, no division by M or P —
must exceed the bound.

    python -m benchmarks neighbour_fwer               # 300 runs at α = 0.1, both engines, and the control
    python -m benchmarks neighbour_fwer --quick       # 10 runs, betting tests only, reported (too few to judge)

Writes ``benchmarks/results/neighbour_fwer.json``.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from scipy import stats

EPSILON = 0.05
GAP = EPSILON + 0.002


def chain_board(seed: int, chains: int = 3, length: int = 5, items: int = 500) -> np.ndarray:
    """``(chains·length, items)`` 0/1 scores; exact bank means step down by GAP along each chain."""
    rng = np.random.default_rng(seed)
    step = int(round(GAP * items))
    assert abs(step / items - GAP) < 1e-12, "items must make GAP·items an integer"
    rows = []
    for _ in range(chains):
        top = rng.uniform(0.55 + GAP * (length - 1), 0.95)
        base = (rng.random(items) < top).astype(float)
        need = step * (length - 1) - int(base.sum()) + 1
        if need > 0:  # enough correct answers to take away
            base[rng.choice(np.flatnonzero(base == 0), need, replace=False)] = 1.0
        ones = rng.permutation(np.flatnonzero(base == 1))
        row = base.copy()
        rows.append(row.copy())
        for k in range(1, length):
            row[ones[(k - 1) * step:k * step]] = 0.0
            rows.append(row.copy())
    return np.asarray(rows)


def run_once(x: np.ndarray, seed: int, alpha: float, correction: str, pair_tests: str, look: int) -> dict:
    """One ranking of board ``x`` on a random order with a look every ``look`` items."""
    from certeval.backtests.paired_rows import epsilon_errors
    from certeval.estimators.bank.neighbour_ranking import NeighbourRanking

    m, n = x.shape
    names = [f"m{k:03d}" for k in range(m)]
    exact = x.mean(axis=1)
    order = np.random.default_rng(seed).permutation(n)
    rank = NeighbourRanking(names, alpha=alpha, epsilon=EPSILON, correction=correction,
                            pair_tests=pair_tests).start(np.full(n, 1.0 / n))
    for start in range(0, n, look):
        idx = order[start:start + look]
        rank.update(idx, x[:, idx])
        if not rank.model_open.any():
            break
    miss = (rank.model_lower > exact + 1e-12) | (rank.model_upper < exact - 1e-12)
    d = exact[rank.pa] - exact[rank.pb]
    false_tests = (rank.rej_a & (d < -EPSILON - 1e-9)) | (rank.rej_b & (d > EPSILON + 1e-9))
    wrong = epsilon_errors(rank.result(), names, exact)
    return {"cs_miss": int(miss.sum()), "false_tests": int(false_tests.sum()), "wrong_listings": int(wrong),
            "cells": float(rank.model_used.sum()) / (m * n), "opened": int(rank.n_opened),
            "failed": bool(miss.any() or false_tests.any() or wrong)}


def family_wise(runs: int, alpha: float, correction: str, pair_tests: str = "auto", look: int = 25,
                seed: int = 0, **board) -> dict:
    """``runs`` boards and orders; the failure count, its rate and the binomial bound at 1 in 1,000."""
    rows = [run_once(chain_board(seed * 100_003 + r, **board), seed * 7 + r, alpha, correction, pair_tests, look)
            for r in range(runs)]
    failures = sum(r["failed"] for r in rows)
    return {"runs": runs, "alpha": alpha, "correction": correction, "pair_tests": pair_tests, "look": look,
            "failures": failures, "failure_rate": failures / runs,
            "bound_0999": float(stats.binom.ppf(0.999, runs, alpha)),
            "wilson_upper_95": wilson_upper(failures, runs),
            "cs_misses": sum(r["cs_miss"] > 0 for r in rows),
            "false_test_runs": sum(r["false_tests"] > 0 for r in rows),
            "wrong_listing_runs": sum(r["wrong_listings"] > 0 for r in rows),
            "cells_mean": float(np.mean([r["cells"] for r in rows])),
            "opened_mean": float(np.mean([r["opened"] for r in rows]))}


def wilson_upper(k: int, n: int, z: float = 1.96) -> float:
    p = k / n
    return float((p + z * z / (2 * n) + z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))) / (1 + z * z / n))


def main(argv: list[str] | None = None) -> int:
    from benchmarks._meta import write_result

    p = argparse.ArgumentParser(prog="python -m benchmarks neighbour_fwer", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--runs", type=int, default=None)
    p.add_argument("--alpha", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    runs = args.runs or (10 if args.quick else 300)
    out = {"epsilon": EPSILON, "gap": GAP, "board": {"chains": 3, "length": 5, "items": 500}, "results": []}
    configs = (("bonferroni", "betting"), ("bonferroni", "look"), ("none", "betting"), ("none", "look"))
    for correction, engine in (configs[::2] if args.quick else configs):
        t = time.perf_counter()
        res = family_wise(runs, args.alpha, correction, engine, seed=args.seed)
        res["wall_s"] = time.perf_counter() - t
        out["results"].append(res)
        print(f"[neighbour_fwer] {correction:10s} {engine:7s}: {res['failures']}/{runs} failed "
              f"(bound {res['bound_0999']:.0f}), cells {res['cells_mean']:.3f}, {res['wall_s']:.0f} s",
              file=sys.stderr)
    valid = [r for r in out["results"] if r["correction"] == "bonferroni"]
    control = [r for r in out["results"] if r["correction"] == "none"]
    out["passed"] = (all(r["failures"] <= r["bound_0999"] for r in valid)
                     and all(r["failures"] > r["bound_0999"] for r in control))
    path = write_result("neighbour_fwer", out, args.quick, seed=args.seed)
    print(f"neighbour_fwer -> {path}")
    return 0 if out["passed"] or args.quick else 1


if __name__ == "__main__":
    sys.exit(main())
