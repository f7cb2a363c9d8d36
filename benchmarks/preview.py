"""How well the cost preview (``rank|select --dry-run --history``) predicts the cells a run scores.

    python -m benchmarks preview           # four leaderboards, a few minutes on 2 cores
    python -m benchmarks preview --quick   # helm_mmlu only, few reps

Each bank's models are split at random into two halves: the first half are "your" models, the second the
history. ``predicted`` is the preview from the history half (:func:`certeval.reports.preview.preview_cost`, its median and
range); ``realised`` is the mean fraction of cells scored by runs of the same request on your half (each a fresh
item order, the same engine). Writes ``benchmarks/results/preview.json``; ``error`` = predicted − realised.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402

BANKS = ("helm_mmlu", "vlm_ocrbench", "vlm_hallusionbench", "openllm_arc")
REQUESTS = {  # what a user asks: rank at two tolerances, and the best model within 0.02
    "rank epsilon 0.05": {"kind": "rank", "epsilon": 0.05},
    "rank epsilon 0.1": {"kind": "rank", "epsilon": 0.1},
    "select top-1 within 0.02": {"kind": "select", "threshold": 0.0, "halfwidth": 0.02, "top": 1},
}


def case(dataset: str, name: str, request: dict, preview_reps: int, realised_reps: int, seed: int) -> dict:
    from certeval.backtests.comparative import load_matrix
    from certeval.estimators.groups import GroupRequest
    from certeval.reports.preview import preview_cost

    matrix, models, spec = load_matrix(f"bundled:{dataset}")
    order = np.random.default_rng(seed).permutation(len(models))
    yours, history = order[: len(models) // 2], order[len(models) // 2:]
    ask = GroupRequest(labels=(), look_size=50, **request)
    start = time.perf_counter()
    predicted = preview_cost(ask, spec, matrix[history], len(yours), reps=preview_reps, seed=seed)
    preview_s = time.perf_counter() - start
    realised = preview_cost(replace(ask), spec, matrix[yours], len(yours), reps=realised_reps, seed=seed + 1)
    return {"dataset": dataset, "request": name, "your_models": len(yours), "history_models": len(history),
            "items": int(matrix.shape[1]), "predicted": predicted.fraction,
            "predicted_range": [min(predicted.fractions), max(predicted.fractions)],
            "realised": float(np.mean(realised.fractions)), "realised_runs": list(realised.fractions),
            "error": predicted.fraction - float(np.mean(realised.fractions)), "preview_s": round(preview_s, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks preview")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    banks = BANKS[:1] if args.quick else BANKS
    reps = (2, 1) if args.quick else (5, 3)
    rows = []
    for dataset in banks:
        for name, request in REQUESTS.items():
            rows.append(case(dataset, name, request, reps[0], reps[1], args.seed))
            print(json.dumps(rows[-1]), flush=True)
    summary = {"max_abs_error": max(abs(r["error"]) for r in rows),
               "within_0.1": sum(abs(r["error"]) <= 0.1 for r in rows), "cases": len(rows)}
    print(json.dumps(summary))
    print(f"wrote {write_result('preview', {'cases': rows, 'summary': summary}, args.quick, seed=args.seed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
