"""How close certeval's exact intervals come to the frontier of their kind, at a fixed number of items.

For every bundled bank (plain bank mean as the estimand, so that every interval answers the same question),
half the models are history and each rep evaluates one of the other half (rep r: model r mod M, its own seed).
At n = 50 / 100 / 200 items (where n ≤ N/2) the half-widths of, on the same draws:

* ``history-uniform-draws`` — certeval's exact history CS fed the uniform draws (``propose_shared_order``; equal weights), bets
  tuned to the horizon n (``bet_horizon``), refitted every batch of 10;
* ``history-own-draws`` — the same method choosing its own draws (the Neyman mix on the predicted residual spread
  where it predicts that to narrow the interval, else ∝ weight);
* ``history-weight-draws`` — the same method drawing ∝ weight (``uniform_mix=1``) from the same random stream as
  ``history-own-draws``: the paired baseline for the draw law (common random numbers, so the ratio is not drowned
  in the rep-to-rep spread of two independent draws);
* ``uniform`` — certeval's exact CS without history on the uniform draws (``bet_horizon`` = n);
* ``ppi++`` — PPI++ from the peer package ``ppi-python`` (``ppi_py.ppi_mean_ci``, power-tuned λ; Angelopoulos
  et al. 2023): asymptotic, fixed n, for an infinite population; the predictor is the history's item mean (fixed),
  the unlabelled items are the bank's other items;
* ``clt-fpc`` — the CLT interval with the finite-population correction on the uniform draws (no history);
* ``e-limit`` — the e-value limit: the interval of the best constant bet with the true variance of the residual
  ``x − λ* f`` over the bank (λ* = the best coefficient; an oracle no real run has),
  ``sqrt(2 v ln(2/δ) (1/n − 1/N))`` (the Gaussian approximation of a betting CS at its tuned horizon; see
  :func:`certeval.estimators.single.bounds.bet_sizes`).

and ``allocation_bound``: the most any allocation of draws can narrow an interval on this bank, the Neyman factor
``E σ_j / sqrt(E σ_j²)`` (Cochran 1977, §5.5), with σ_j the spread of item j's residual ``x − f`` over the
evaluated models (an oracle: no run knows it) and with the predicted ``sqrt(f(1 − f))`` the method uses — before
the importance weights widen the range a bounded betting CS pays for.

Reported: the median half-width of each over reps, the ratios history ÷ e-limit and history ÷ PPI++ (median of
per-rep ratios), and the coverage of the exact ones with a look after every batch of 10 (peeking). PPI++ runs only
when ``ppi-python`` is installed (a benchmark-only dependency: ``pip install numba ppi-python``); without it the
column says so.

    python -m benchmarks frontier            # 9 banks, n = 50/100/200, 60 reps each (tens of minutes, 2 cores)
    python -m benchmarks frontier --quick    # one bank, n = 50, 2 reps (seconds)
"""

from __future__ import annotations

import argparse
import math
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: no BLAS oversubscription

import numpy as np  # noqa: E402
from scipy.stats import norm  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402
from certeval.backtests.ray_fanout import dataset_arrays  # noqa: E402
from certeval.estimators import make_method  # noqa: E402

DATASETS = ("chembench", "helm_mmlu", "helm_raft", "helm_v023", "openllm_arc", "openllm_tiny",
            "vlm_hallusionbench", "vlm_ocrbench", "opencompass_large")
SIZES = (50, 100, 200)
BATCH = 10
EXACT = ("history-uniform-draws", "history-own-draws", "history-weight-draws", "uniform")


def _ppi():
    try:
        import ppi_py
    except ImportError:
        return None
    return ppi_py


def allocation_bound(matrix: np.ndarray, f: np.ndarray) -> dict[str, float]:
    """Neyman's best width factor ``E σ / sqrt(E σ²)`` over any allocation, with the residual spread of each item
    over the evaluated models (oracle) and with the spread the predictions imply."""
    oracle = (matrix - f[None, :]).std(axis=0)
    predicted = np.sqrt(np.maximum(f * (1.0 - f), 0.01))
    return {k: float(s.mean() / np.sqrt(np.mean(s**2))) for k, s in (("oracle", oracle), ("predicted", predicted))}


def _paired_ratio(own: list[float], base: list[float]) -> dict[str, float]:
    """Geometric mean over reps of own ÷ base (the same random stream) and its standard error on the log scale."""
    logs = np.log(np.maximum(np.asarray(own), 1e-12) / np.maximum(np.asarray(base), 1e-12))
    return {"geometric_mean": float(np.exp(logs.mean())),
            "log_se": float(logs.std(ddof=1) / math.sqrt(logs.size)) if logs.size > 1 else None}


def e_limit(x: np.ndarray, f: np.ndarray, n: int, delta: float) -> float:
    """``sqrt(2 v ln(2/δ) (1/n − 1/N))`` with v the bank variance of ``x − λ* f`` (λ* the best coefficient)."""
    cov = np.cov(x, f)
    lam = cov[0, 1] / cov[1, 1] if cov[1, 1] > 0 else 0.0
    v = float(np.var(x - lam * f))
    return math.sqrt(2.0 * v * math.log(2.0 / delta) * max(1.0 / n - 1.0 / x.size, 0.0))


def exact_run(name: str, spec, x: np.ndarray, order: np.ndarray | None, n: int, confidence: float,
              rng: np.random.Generator) -> tuple[float, bool]:
    """Half-width after n items and whether every look (each batch of 10) covered the bank mean."""
    params = {"confidence": confidence, "bet_horizon": n}
    if name == "uniform":
        method = make_method("uniform", **params)
    else:
        law = {"uniform_mix": 1.0} if name == "history-weight-draws" else {}
        method = make_method("history", subset_intervals=False, **law, **params)
    method.start(spec)
    truth, covered = float(x.mean()), True
    while method.n_scored < n:
        if order is not None:
            items = order[method.n_scored:method.n_scored + BATCH]
            method.propose_shared_order(items)
        else:
            items = method.propose(min(BATCH, n - method.n_scored), rng).items
        method.update(items, x[items])
        est = method.result()
        covered &= est.lower - 1e-12 <= truth <= est.upper + 1e-12
    est = method.result()
    return 0.5 * (est.upper - est.lower), bool(covered)


def run_bank(name: str, sizes: tuple[int, ...], reps: int, confidence: float, seed: int) -> list[dict]:
    from dataclasses import replace

    data = dataset_arrays(name, features=None, history=True, mean_of_means=False)
    spec = replace(data.spec, history=data.history)
    f = np.clip(data.history.item_mean, 0.0, 1.0)
    n_items = spec.n_items
    delta = 1.0 - confidence
    ppi_py = _ppi()
    rows = []
    for n in (s for s in sizes if s <= n_items // 2):
        per = {k: [] for k in (*EXACT, "ppi++", "clt-fpc", "e-limit")}
        cover = {k: [] for k in EXACT}
        for r in range(reps):
            rng = np.random.default_rng([seed, n, r])
            x = data.matrix[r % len(data.models)]
            order = rng.permutation(n_items)
            for label in EXACT:
                own_rng = np.random.default_rng([seed, n, r, 1])  # the same stream for both own-draw laws
                half, ok = exact_run(label, spec, x, order if label in ("uniform", "history-uniform-draws") else None,
                                     n, confidence, own_rng)
                per[label].append(half)
                cover[label].append(ok)
            drawn, rest = order[:n], order[n:]
            xs = x[drawn]
            per["clt-fpc"].append(norm.ppf(1 - delta / 2) * xs.std(ddof=1) / math.sqrt(n)
                                  * math.sqrt((n_items - n) / (n_items - 1)))
            per["e-limit"].append(e_limit(x, f, n, delta))
            if ppi_py is not None:
                lo, hi = ppi_py.ppi_mean_ci(xs, f[drawn], f[rest], alpha=delta)
                per["ppi++"].append(0.5 * float(np.ravel(hi)[0] - np.ravel(lo)[0]))
        hist = np.asarray(per["history-uniform-draws"])
        row = {"dataset": name, "n": n, "n_items": n_items, "reps": reps,
               "allocation_bound": allocation_bound(data.matrix, f),
               "median_halfwidth": {k: (float(np.median(v)) if v else None) for k, v in per.items()},
               "coverage_with_peeking": {k: float(np.mean(v)) for k, v in cover.items()},
               "history_vs_e_limit": float(np.median(hist / np.asarray(per["e-limit"]))),
               "own_vs_uniform_draws": float(np.median(np.asarray(per["history-own-draws"]) / hist)),
               "own_vs_weight_draws": _paired_ratio(per["history-own-draws"], per["history-weight-draws"]),
               "history_vs_ppi": (float(np.median(hist / np.asarray(per["ppi++"]))) if per["ppi++"] else None)}
        rows.append(row)
        print(f"[frontier] {name} n={n}: " + " ".join(f"{k} {v:.4f}" for k, v in row["median_halfwidth"].items()
                                                      if v is not None)
              + f" | hist/e-limit {row['history_vs_e_limit']:.2f} hist/ppi {row['history_vs_ppi'] or float('nan'):.2f}"
              f" own/uniform-draws {row['own_vs_uniform_draws']:.2f}"
              f" own/weight-draws {row['own_vs_weight_draws']['geometric_mean']:.3f}", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks frontier", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="reps per bank and n (default 60; --quick 2)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--confidence", type=float, default=0.95)
    p.add_argument("--datasets", default=None, help="comma-separated subset of the bundled datasets")
    args = p.parse_args(argv)
    reps = args.reps or (2 if args.quick else 60)
    names = args.datasets.split(",") if args.datasets else (["helm_v023"] if args.quick else list(DATASETS))
    sizes = SIZES[:1] if args.quick else SIZES
    rows = [row for name in names for row in run_bank(name, sizes, reps, args.confidence, args.seed)]
    summary = {}
    for n in sizes:
        mine = [r for r in rows if r["n"] == n]
        if not mine:
            continue
        ppi = [r["history_vs_ppi"] for r in mine if r["history_vs_ppi"] is not None]
        summary[str(n)] = {
            "history_vs_e_limit_max": max(r["history_vs_e_limit"] for r in mine),
            "history_vs_e_limit_median": float(np.median([r["history_vs_e_limit"] for r in mine])),
            "history_vs_ppi_median": float(np.median(ppi)) if ppi else None,
            "history_vs_ppi_max": max(ppi) if ppi else None,
            "own_draws_narrower_on": sum(r["own_vs_uniform_draws"] < 1 for r in mine), "banks": len(mine),
            "own_vs_weight_draws_max": max(r["own_vs_weight_draws"]["geometric_mean"] for r in mine),
            "own_narrower_than_weight_draws_on": sum(r["own_vs_weight_draws"]["geometric_mean"] < 1 for r in mine),
            "min_coverage_with_peeking": min(min(r["coverage_with_peeking"].values()) for r in mine),
        }
    path = write_result("frontier", {"seed": args.seed, "reps": reps, "confidence": args.confidence,
                                     "estimand": "plain bank mean", "ppi_python": _ppi() is not None,
                                     "rows": rows, "summary": summary}, args.quick)
    print(f"frontier -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
