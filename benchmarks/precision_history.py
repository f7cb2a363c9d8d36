"""``rank --goal halfwidth:E --history``: leaderboard precision with and without history, on the same orders.

Per order, a bank's models are split at random in half: the history half fits one factor model
(:func:`~certeval.estimators.history.prior.fit_history_prior`), the other half is the leaderboard — every model's bank mean
within ±E at α = 0.05 — run on one item order drawn ∝ weight, looks of ``--look`` items, twice:
:class:`~certeval.estimators.history.paired.HistoryPrecision` (each model's ``certify --history`` interval) and the
plain :class:`~certeval.estimators.bank.precision.BankPrecision`. Reported: the fraction of model × item cells, the
ratio history / plain (order by order), and the runs in which some interval missed its exact bank mean (with its
Wilson 95% upper bound).

    python -m benchmarks precision_history           # helm_mmlu 20 orders, vlm_ocrbench 5; E = 0.05 and 0.1
    python -m benchmarks precision_history --quick   # helm_mmlu, 2 orders
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from benchmarks._meta import write_result

ALPHA, LOOK = 0.05, 20
CASES = (("helm_mmlu", 20), ("vlm_ocrbench", 5))


def _play(board, x: np.ndarray, order: np.ndarray, look: int) -> dict:
    t0 = time.perf_counter()
    for s in range(0, order.size, look):
        board.update(order[s:s + look], x[:, order[s:s + look]])
        if not board.active:
            break
    intervals = board.model_intervals()
    return {"intervals": intervals, "seconds": time.perf_counter() - t0}


def precision_case(name: str, orders: int, seed: int, halfwidth: float, look: int) -> dict:
    from benchmarks.pair_history import _bank, half_split
    from certeval.estimators.bank.precision import BankPrecision
    from certeval.estimators.history.paired import HistoryPrecision

    models, x, spec = _bank(name)
    w = spec.weights()
    rng = np.random.default_rng(seed)
    rows = []
    for k in range(orders):
        names, xr, prior, order = half_split(models, x, w, rng)
        exact = xr @ w
        row = {"order": k}
        for label, board in (("history", HistoryPrecision(names, [prior] * len(names), spec, halfwidth=halfwidth,
                                                          alpha=ALPHA).start()),
                             ("plain", BankPrecision(names, halfwidth=halfwidth, alpha=ALPHA).start(w))):
            out = _play(board, xr, order, look)
            iv = np.array([out["intervals"][n] for n in names])
            row[label] = {"fraction_cells": float(iv[:, 3].sum() / xr.size), "seconds": out["seconds"],
                          "all_cover": bool(((iv[:, 1] <= exact + 1e-9) & (exact <= iv[:, 2] + 1e-9)).all()),
                          "max_halfwidth": float(((iv[:, 2] - iv[:, 1]) / 2).max())}
        row["ratio"] = row["history"]["fraction_cells"] / row["plain"]["fraction_cells"]
        rows.append(row)
        print(f"[precision_history] {name} order {k}: history {row['history']['fraction_cells']:.3f} "
              f"plain {row['plain']['fraction_cells']:.3f} ratio {row['ratio']:.3f}", file=sys.stderr, flush=True)
    from benchmarks.ranking import wilson_upper

    misses = {lab: sum(not r[lab]["all_cover"] for r in rows) for lab in ("history", "plain")}
    return {"dataset": name, "models": len(models), "items": int(x.shape[1]), "ranked_models": len(models) - len(models) // 2,
            "halfwidth": halfwidth, "alpha": ALPHA, "look_items": look, "orders": orders,
            "mean_fraction_cells": {lab: float(np.mean([r[lab]["fraction_cells"] for r in rows]))
                                    for lab in ("history", "plain")},
            "mean_ratio": float(np.mean([r["ratio"] for r in rows])),
            "runs_with_a_miss": misses, "miss_wilson_upper": {k: wilson_upper(v, orders) for k, v in misses.items()},
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks precision_history", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--halfwidths", default="0.05,0.1", help="comma-separated E values (default %(default)s)")
    p.add_argument("--look", type=int, default=LOOK)
    args = p.parse_args(argv)
    cases = (("helm_mmlu", 2),) if args.quick else CASES
    out = [precision_case(name, orders, args.seed, float(e), args.look) for name, orders in cases
           for e in args.halfwidths.split(",")]
    path = write_result("precision_history", {"cases": out}, args.quick)
    print(f"precision_history -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
