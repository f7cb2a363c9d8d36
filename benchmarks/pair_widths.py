"""Bank-target pair intervals: the earlier construction and today's, on the same banks, side by side.

    python -m benchmarks pair_widths [--quick] [--reps R]

For every bundled bank (estimand: the bank's mean of sub-dataset means where it has sub-datasets), ten models
(seeded pick; all of them where a bank has fewer), their P pairs at level alpha/P (a ranking's Bonferroni level),
n = 50 / 100 / 200 items (n ≤ N/2):

* ``before`` — a uniform item order and the empirical-Bernstein CS on ``u_j (x_aj − x_bj) / max u`` (the
  construction paired runs used until this change; ``u_j = N w_j``);
* ``eb-by-weight`` — the order drawn ∝ weight, the same empirical-Bernstein CS without rescaling;
* ``betting-by-weight`` — the order drawn ∝ weight and the betting streams paired runs use now
  (:class:`certeval.estimators.bank.wor_streams.BettingStreams`).

Reported: the median over pairs and orders of each half-width (difference scale), the ratios to ``before``, and
the share of pairs whose betting interval missed the exact bank difference at some look (every 10 items;
each at alpha/P). Writes ``benchmarks/results/pair_widths.json`` (``--quick``: ``_quick/``, one bank, n = 100).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from benchmarks._meta import write_result
from certeval.estimators.bank.wor_streams import BettingStreams, WorStreams, weighted_order
from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

DATASETS = ("helm_mmlu", "helm_raft", "helm_v023", "vlm_hallusionbench", "vlm_ocrbench", "opencompass_large",
            "openllm_tiny", "openllm_arc", "chembench")
SIZES = (50, 100, 200)
MODELS = 10
ALPHA = 0.05


def _bank(name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    frame = load_scores(f"bundled:{name}")
    bank = bank_from_scores(frame)
    models = sorted(frame["model"].unique())
    size = min(MODELS, len(models))
    picks = [models[i] for i in np.random.default_rng(seed).choice(len(models), size, replace=False)]
    x = score_matrix(frame, picks, bank)
    keep = ~np.isnan(x).any(axis=0)
    sub = bank.subsets[keep] if bank.subsets is not None else None
    if sub is None:
        w = np.full(int(keep.sum()), 1.0 / keep.sum())
    else:
        counts = np.bincount(sub)
        w = 1.0 / ((counts > 0).sum() * counts[sub])
    return x[:, keep], w


def _halfwidths(streams, z_order, w_order, n, scale=1.0, truth=None, every=10):
    """Half-widths (difference scale) after n items; whether each stream covered ``truth`` at every look."""
    covered = np.ones(len(z_order), dtype=bool)
    for start in range(0, n, every):
        streams.absorb(z_order[:, start:min(start + every, n)], w_order[start:min(start + every, n)])
        if truth is not None:
            _, lo, up = streams.bounds()
            covered &= (2 * lo - 1 - 1e-12 <= truth) & (truth <= 2 * up - 1 + 1e-12)
    _, lo, up = streams.bounds()
    return scale * (up - lo), covered


def run_bank(name: str, reps: int, seed: int, sizes: tuple[int, ...] = SIZES) -> list[dict]:
    x, w = _bank(name, seed)
    n_items = w.size
    ii, jj = np.triu_indices(len(x), k=1)
    delta = ALPHA / len(ii)
    diff = x[ii] - x[jj]
    truth = diff @ w
    u = w * n_items
    c = float(u.max())
    rows = []
    for n in (s for s in sizes if s <= n_items // 2):
        half = {"before": [], "eb-by-weight": [], "betting-by-weight": []}
        covered = []
        for r in range(reps):
            rng = np.random.default_rng([seed, n, r])
            perm = rng.permutation(n_items)  # before: uniform order, values rescaled by max u
            z = (diff[:, perm] * u[perm] / c + 1) / 2
            hw, _ = _halfwidths(WorStreams(len(ii), n_items, delta), z, np.full(n_items, 1.0 / n_items), n, scale=c)
            half["before"].append(np.minimum(hw, 1.0))  # paired runs clipped the interval to [-1, 1]
            order = weighted_order(w, rng)
            z = (diff[:, order] + 1) / 2
            hw, _ = _halfwidths(WorStreams(len(ii), n_items, delta), z, w[order], n)
            half["eb-by-weight"].append(hw)
            hw, ok = _halfwidths(BettingStreams(len(ii), n_items, delta), z, w[order], n, truth=truth)
            half["betting-by-weight"].append(hw)
            covered.append(ok)
        med = {k: float(np.median(np.concatenate(v))) for k, v in half.items()}
        rows.append({"dataset": name, "n": n, "n_items": n_items, "reps": reps, "pairs": len(ii),
                     "median_halfwidth": med,
                     "betting_vs_before": med["betting-by-weight"] / med["before"],
                     "eb_by_weight_vs_before": med["eb-by-weight"] / med["before"],
                     "betting_miscoverage_with_peeking": float(1.0 - np.mean(covered))})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks pair_widths", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="item orders per bank and n (default 8; --quick 1)")
    p.add_argument("--seed", type=int, default=2026)
    args = p.parse_args(argv)
    reps = args.reps or (1 if args.quick else 8)
    names = ["openllm_tiny"] if args.quick else list(DATASETS)
    sizes = (100,) if args.quick else SIZES
    rows = [row for name in names for row in run_bank(name, reps, args.seed, sizes)]
    summary = {str(n): {"betting_vs_before_median": float(np.median([r["betting_vs_before"] for r in rows
                                                                     if r["n"] == n])),
                        "betting_vs_before_max": max(r["betting_vs_before"] for r in rows if r["n"] == n),
                        "worst_miscoverage": max(r["betting_miscoverage_with_peeking"] for r in rows if r["n"] == n)}
               for n in SIZES if any(r["n"] == n for r in rows)}
    path = write_result("pair_widths", {"seed": args.seed, "reps": reps, "alpha_per_pair": f"{ALPHA}/pairs",
                                        "rows": rows, "summary": summary}, args.quick)
    print(f"pair_widths -> {path}")
    for n, s in summary.items():
        print(f"n={n}: betting / before median {s['betting_vs_before_median']:.2f}, "
              f"max {s['betting_vs_before_max']:.2f}; worst miscoverage {s['worst_miscoverage']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
