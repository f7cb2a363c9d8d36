"""How few cells could ANY valid ranking use? An optimistic oracle bound per bank and margin.

For the bank target a ranking at margin D makes, for each pair, one of the statements "a>b", "b>a" or
"equivalent within D". Even under the most lenient reading (indifference zone: "a>b" once the interval of
mu_a - mu_b excludes 0, "equivalent" once it lies inside (-D, D)), a pair whose exact difference is delta
is settled only once its interval's half-width is below ``max(|delta|, D - |delta|)``; a model leaves only
when every pair with |delta| < D is settled (the pairs farther apart are ignored here: that only lowers
the bound).

The oracle is given far more than any real procedure has: it knows each pair's exact difference and
standard deviation, uses the fixed-n normal interval (no anytime-validity cost, no variance estimate)
with the finite-population correction ``sqrt((N - n) / (N - 1))``, and pays only a per-model Bonferroni
``z_{1 - alpha / (2M)}`` (a real ranking needs a family over pairs). For each model the smallest fraction
of the bank (grid of 2 %) at which all its close pairs settle is its fraction of cells; their mean is
the bound. Estimand: the bank's weighted mean (mean of sub-dataset means where the bank has them), as
everywhere in certeval.

    python -m benchmarks ranking_bound           # helm_mmlu, openllm_arc, openllm_tiny at margins 0.02, 0.05, 0.1
    python -m benchmarks ranking_bound --quick   # helm_mmlu only
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from scipy.stats import norm

from benchmarks._meta import write_result

DATASETS = ("helm_mmlu", "openllm_arc", "openllm_tiny")
MARGINS = (0.02, 0.05, 0.1)
GRID = np.linspace(0.02, 1.0, 50)


def bank_list(name: str) -> tuple[list[str], np.ndarray]:
    """Model names and ``y = N w x`` (models x items): lists whose plain means are the bank means."""
    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

    frame = load_scores(f"bundled:{name}")
    models = sorted(frame["model"].unique())
    bank = bank_from_scores(frame)
    x = score_matrix(frame, models, bank)
    w = bank.spec().weights()
    return models, x * (x.shape[1] * w)[None, :]


def oracle_fractions(y: np.ndarray, margin: float, alpha: float = 0.05) -> np.ndarray:
    """Per model, the smallest fraction of the bank at which the oracle settles all its close pairs."""
    m, n_total = y.shape
    mu = y.mean(axis=1)
    z = norm.ppf(1.0 - alpha / (2 * m))
    need = np.zeros(m)
    for a in range(m):
        close = np.flatnonzero((np.abs(mu - mu[a]) < margin) & (np.arange(m) != a))
        if close.size == 0:
            continue
        d = y[a][None, :] - y[close]
        delta = np.abs(d.mean(axis=1))
        sd = d.std(axis=1, ddof=1)
        target = np.maximum(delta, margin - delta)
        need[a] = first_settled_fraction(z, sd, target, n_total)
    return need


def first_settled_fraction(z: float, sd: np.ndarray, target: np.ndarray, n_total: int) -> float:
    """The smallest fraction of the bank (on :data:`GRID`) at which the normal interval ``z·sd/√n`` with the
    finite-population correction is below ``target`` for every pair; 1 if none."""
    for f in GRID:
        n = max(2, int(round(f * n_total)))
        half = z * sd / np.sqrt(n) * np.sqrt((n_total - n) / (n_total - 1))
        if (half < target).all():
            return f
    return 1.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks ranking_bound", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--alpha", type=float, default=0.05)
    args = p.parse_args(argv)
    rows = []
    for name in (("helm_mmlu",) if args.quick else DATASETS):
        models, y = bank_list(name)
        for margin in MARGINS:
            need = oracle_fractions(y, margin, args.alpha)
            rows.append({"dataset": name, "models": len(models), "items": y.shape[1], "margin": margin,
                         "alpha": args.alpha, "oracle_fraction_cells": float(need.mean()),
                         "oracle_median_model_fraction": float(np.median(need)),
                         "models_needing_over_0.6": float((need > 0.6).mean())})
            print(f"[ranking_bound] {name} margin {margin}: cells >= {need.mean():.3f}", file=sys.stderr)
    path = write_result("ranking_bound", {"alpha": args.alpha, "rows": rows,
                                          "note": "optimistic oracle (see module docstring): a lower bound on the "
                                                  "fraction of cells of any ranking whose statements are all true "
                                                  "with probability >= 1 - alpha, without history"}, args.quick)
    print(f"ranking_bound -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
