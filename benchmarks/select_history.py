"""``select --history`` and ``select``: cells of top-1 selection within ε with the boundary tests, against the
pair-CS rule they replaced, side by side.

Per rep the bank's models are split at random in half; the history half fits one factor model
(:func:`~certeval.estimators.history.prior.fit_history_prior`), the other half runs top-1 selection within ε = 0.02
(alpha = 0.05, threshold 0) on a fresh item order drawn ∝ weight, looks of 50 items, three ways on the same order:

* ``history``: :class:`~certeval.estimators.history.paired.HistorySelection` (what ``select --history`` runs:
  per-model history CSs at α/2M, the rule's "not the best" tests at α/4 and ε-listing tests at α/4(M − 1));
* ``plain``: :class:`~certeval.estimators.bank.selection.BankSelection` without history (what ``select`` does);
* ``pair_cs``: the baseline, ``BankSelection`` with its boundary tests off — LUCB's stop and drops on a
  two-sided CS per pair at α/2P (what ``select`` ran before the tests).

Fraction of model × item cells scored, and whether the run erred: the selected model's exact bank mean below the
best's minus ε, or a model dropped as ``not-best`` that is the exact best. The error rate's Wilson upper bound is
at 95%.

    python -m benchmarks select_history            # helm_mmlu, 100 reps (about 2 minutes on 2 cores)
    python -m benchmarks select_history --quick    # 3 reps
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402

EPSILON, ALPHA, LOOK, DATASET = 0.02, 0.05, 50, "helm_mmlu"
WAYS = ("history", "plain", "pair_cs")


def wilson_upper(errors: int, n: int, z: float = 1.959964) -> float:
    """The upper end of the Wilson score interval (95%) for a binomial proportion."""
    if n == 0:
        return 1.0
    p = errors / n
    centre = p + z * z / (2 * n)
    spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return min(1.0, (centre + spread) / (1 + z * z / n))


def run_one(sel, x: np.ndarray, order: np.ndarray, w: np.ndarray) -> dict:
    t0 = time.perf_counter()
    rule = getattr(sel, "rule", sel)
    for s in range(0, order.size, LOOK):
        live = rule.status == "running"
        cols = order[s:s + LOOK]
        sel.update(cols, np.where(live[:, None], x[:, cols], np.nan))
        if rule.finished:
            break
    res = sel.result()
    mu = x @ w
    best = float(mu.max())
    names = list(rule.names)
    chosen = [mu[names.index(n)] for n in res.selected]
    wrong_pick = len(chosen) != 1 or chosen[0] < best - EPSILON - 1e-12
    wrong_drop = any(m.status == "not-best" and mu[names.index(m.model)] >= best - 1e-12 for m in res.models)
    return {"fraction_cells": res.fraction_used, "seconds": round(time.perf_counter() - t0, 2),
            "error": bool(wrong_pick or wrong_drop), "selected": list(res.selected)}


def main(argv: list[str] | None = None) -> int:
    from benchmarks.pair_history import _bank, half_split
    from certeval.estimators.bank.selection import BankSelection
    from certeval.estimators.history.paired import HistorySelection

    class PairCSSelection(BankSelection):  # the baseline: the rule with its top-1 tests off
        TESTED = False

    p = argparse.ArgumentParser(prog="python -m benchmarks select_history", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    reps = 3 if args.quick else args.reps
    models, x, spec = _bank(DATASET)
    w = spec.weights()
    rng = np.random.default_rng(args.seed)
    rows = []
    for rep in range(reps):
        names, xr, prior, order = half_split(models, x, w, rng)
        make = {"history": lambda: HistorySelection(names, [prior] * len(names), spec, alpha=ALPHA,
                                                    epsilon=EPSILON).start(),
                "plain": lambda: BankSelection(names, alpha=ALPHA, epsilon=EPSILON).start(w),
                "pair_cs": lambda: PairCSSelection(names, alpha=ALPHA, epsilon=EPSILON).start(w)}
        row = {"rep": rep, "models": len(names), "history_models": len(models) - len(names)}
        for way in WAYS:
            sel = make[way]()
            row[way] = run_one(sel, xr, order, w)
        rows.append(row)
        print(f"[select_history] rep {rep}: " + ", ".join(
            f"{k} {row[k]['fraction_cells']:.3f}{' ERR' if row[k]['error'] else ''}" for k in WAYS),
            file=sys.stderr, flush=True)
    summary = {}
    for way in WAYS:
        cells = np.array([r[way]["fraction_cells"] for r in rows])
        errors = sum(r[way]["error"] for r in rows)
        se = float(cells.std(ddof=1) / math.sqrt(cells.size)) if cells.size > 1 else None
        summary[way] = {"mean_fraction_cells": float(cells.mean()), "se_fraction_cells": se,
                        "min": float(cells.min()), "max": float(cells.max()), "errors": int(errors),
                        "error_rate": errors / len(rows), "error_wilson_upper_95": wilson_upper(errors, len(rows))}
    for way in ("history", "plain"):  # paired by order against the baseline
        ratio = np.array([r[way]["fraction_cells"] / r["pair_cs"]["fraction_cells"] for r in rows])
        summary[f"{way}_over_pair_cs"] = {"mean": float(ratio.mean()), "se": float(
            ratio.std(ddof=1) / math.sqrt(ratio.size)) if ratio.size > 1 else None}
    out = {"dataset": DATASET, "models": len(models), "items": int(x.shape[1]), "epsilon": EPSILON, "alpha": ALPHA,
           "top": 1, "look_items": LOOK, "reps": reps, "summary": summary, "rows": rows}
    print(summary, file=sys.stderr)
    print(f"wrote {write_result('select_history', out, args.quick, seed=args.seed)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
