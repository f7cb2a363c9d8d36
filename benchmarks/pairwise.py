"""Pairwise group-sequential comparison on real recorded scores: items used and pairs separated.

    python -m benchmarks.pairwise [--quick]

Random model pairs x random item orders on bundled ``vlm_ocrbench`` and ``openllm_arc``;
looks every 100 items, two-sided alpha = 0.05, paired vs unpaired (Arviv et al.'s pooled)
statistic, Pocock and HSD(1) boundaries, and the anytime-valid confidence sequence.
Writes ``benchmarks/results/pairwise.json`` (``--quick``: ``benchmarks/results/_quick/``).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from benchmarks._meta import write_result
from certeval.backtests.comparative import ComparativeBacktest, compare_backtest
from certeval.estimators.distribution.comparison import ComparisonDesign
from certeval.estimators.groups import GroupRequest
from certeval.estimators.protocol import BankSpec
from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

DATASETS = ("vlm_ocrbench", "openllm_arc")
VARIANTS = (
    ("unpaired", "pocock", "group-sequential"),
    ("paired", "pocock", "group-sequential"),
    ("paired", "hsd:1", "group-sequential"),
    ("paired", "pocock", "anytime"),
)


def _git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except Exception:  # no git here: the JSON says so
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="30 pairs x 2 orders, written under results/_quick")
    parser.add_argument("--seed", type=int, default=20261101)
    args = parser.parse_args(argv)
    n_pairs, reps = (30, 2) if args.quick else (300, 10)
    results = []
    start = time.time()
    for name in DATASETS:
        scores = load_scores(f"bundled:{name}")
        bank = bank_from_scores(scores)
        models = sorted(scores["model"].unique())
        matrix = score_matrix(scores, models, bank)
        for statistic, spending, guarantee in VARIANTS:
            design = ComparisonDesign(alpha=0.05, statistic=statistic, spending=spending, guarantee=guarantee,
                                      look_size=100)
            t0 = time.time()
            request = GroupRequest(kind="compare", labels=(), target="distribution", confidence=0.95,
                                   look_size=100, design=design)
            out = compare_backtest(ComparativeBacktest(matrix, tuple(models), BankSpec(n_items=matrix.shape[1]),
                                                       request, reps=reps, seed=args.seed, looks_every=100,
                                                       n_pairs=n_pairs))
            s = out["summary"]
            row = {"dataset": name, "statistic": statistic, "spending": spending, "guarantee": guarantee,
                   "pairs": s["pairs"], "orders": reps, "n_items": s["n_items"],
                   "fraction_used": round(s["fraction_used"], 4), "separated": round(s["separated"], 4),
                   "separated_before_exhaustion": round(s["separated_before_exhaustion"], 4),
                   "full_bank_separated": round(s["full_bank_separated"], 4),
                   "agreement_with_full_bank": round(s["agreement"], 4),
                   "directional_error_rate": round(s["directional_error_rate"], 5),
                   "seconds": round(time.time() - t0, 2)}
            results.append(row)
            print(json.dumps(row), flush=True)
    payload = {
        "benchmark": "pairwise group-sequential comparison (certeval.backtests.comparative.compare_backtest)",
        "setup": {"alpha": 0.05, "sides": 2, "looks_every": 100, "pairs": n_pairs, "orders": reps,
                  "seed": args.seed, "truth": "fixed-sample z-test on the full bank, same statistic",
                  "subsets": "ignored (plain bank mean)"},
        "results": results,
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "python": sys.version.split()[0],
                    "cpus": __import__("os").cpu_count()},
        "versions": {"numpy": np.__version__, "scipy": __import__("scipy").__version__,
                     "certeval": __import__("certeval").__version__},
        "git_commit": _git_commit(),
        "seconds": round(time.time() - start, 1),
    }
    path = write_result("pairwise", payload, args.quick, seed=args.seed)  # with meta: command, time, machine
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
