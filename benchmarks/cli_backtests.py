"""The ``certeval backtest`` tables of docs/results_single.md, regenerated on the one backtest driver.

Each row is what ``certeval backtest --scores S [--items I] --method M [--strata ...] [--features ...] --goal
halfwidth:0.05 --reps R --seed 0`` prints (the same function, :func:`certeval.backtests.single.run_single_backtest`),
plus the rows of docs/results_single.md measured with ``method_params`` (adaptive's strata / combine, which the CLI
exposes as ``--strata``).

    python -m benchmarks cli_backtests            # every row (tens of minutes on 2 cores)
    python -m benchmarks cli_backtests --quick    # 2 models x 2 reps of two rows
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from benchmarks._meta import write_result  # noqa: E402

GOAL = "halfwidth:0.05"
# (bank, method, method_params, features, reps, what the docs call the row)
ROWS = [
    ("helm_mmlu", "adaptive", {}, "auto", 20, "adaptive"),
    ("helm_mmlu", "uniform", {}, "auto", 20, "uniform"),
    ("helm_mmlu", "seq", {}, "auto", 20, "seq"),
    ("helm_mmlu", "static", {}, "auto", 20, "static"),
    ("helm_mmlu", "cer-eval", {}, "factors", 5, "cer-eval --features factors"),
    ("helm_mmlu", "adaptive", {"strata": "subsets", "combine": "joint"}, "factors", 20, "subsets / joint"),
    ("helm_mmlu", "adaptive", {"strata": "features", "combine": "joint"}, "factors", 20, "features / joint"),
    ("helm_mmlu", "adaptive", {"strata": "features", "combine": "joint", "min_stratum_size": 30}, "factors", 20,
     "features, >= 30 items per cluster / joint"),
    ("vlm_hallusionbench", "adaptive", {}, "auto", 10, "adaptive"),
    ("vlm_hallusionbench", "cer-eval", {}, "auto", 10, "cer-eval"),
    ("vlm_hallusionbench", "seq", {}, "auto", 10, "seq"),
    ("vlm_hallusionbench", "static", {}, "auto", 10, "static"),
    ("vlm_hallusionbench", "uniform", {}, "auto", 10, "uniform"),
    ("vlm_hallusionbench", "adaptive", {"strata": "subsets", "combine": "joint"}, "auto", 10, "subsets / joint"),
    ("vlm_hallusionbench", "adaptive", {"strata": "features", "combine": "joint"}, "auto", 10, "features / joint"),
    ("vlm_hallusionbench", "adaptive", {"strata": "features", "combine": "joint", "min_stratum_size": 30}, "auto",
     10, "features, >= 30 items per cluster / joint"),
]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks cli_backtests", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    from certeval.backtests.single import SingleBacktestOptions, run_single_backtest
    from certeval.estimators import parse_goal
    from certeval.inputs.banks import bank_from_scores, load_items, load_scores

    rows = ROWS[:2] if args.quick else ROWS
    loaded = {}
    out = []
    for bank_name, method, params, features, reps, label in rows:
        if bank_name not in loaded:
            scores = load_scores(f"bundled:{bank_name}")
            items = load_items(f"bundled:{bank_name}.items") if bank_name == "vlm_hallusionbench" else None
            all_models = sorted(scores["model"].unique())
            # HallusionBench: every 17th of its 170 models (10), as the docs' table; HELM-MMLU: all 44
            models = all_models[::17] if bank_name == "vlm_hallusionbench" else all_models
            loaded[bank_name] = (scores, bank_from_scores(scores, items), all_models, models)
        scores, bank, all_models, models = loaded[bank_name]
        if args.quick:
            models, reps = models[:2], 2
        t0 = time.perf_counter()
        options = SingleBacktestOptions(method, parse_goal(GOAL), reps=reps, seed=args.seed, method_params=params,
                                        features=features)
        res = run_single_backtest(scores, bank, list(models), options, all_models=all_models)
        row = {"bank": bank_name, "label": label, "method": method, "method_params": params, "features": features,
               "models": len(models), "reps": reps, "wall_s": round(time.perf_counter() - t0, 1),
               "mean_fraction_scored": res["summary"]["mean_fraction_scored"],
               "coverage": res["summary"]["coverage"], "reached": res["summary"]["reached"],
               "mean_halfwidth": sum(m["mean_halfwidth"] for m in res["models"]) / len(res["models"])}
        out.append(row)
        print(f"[cli_backtests] {bank_name} {label}: fraction {row['mean_fraction_scored']:.3f} coverage "
              f"{row['coverage']:.3f} ({row['wall_s']} s)", file=sys.stderr, flush=True)
    path = write_result("cli_backtests", {"goal": GOAL, "confidence": 0.95, "seed": args.seed, "rows": out},
                        args.quick, seed=args.seed)
    print(f"cli_backtests -> {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
