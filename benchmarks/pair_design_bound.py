"""Could ``rank --history`` save cells by *where* it draws, rather than by what it predicts? A fixed-n bound.

A shared order drawn ∝ ``w_j r_j`` instead of ∝ ``w_j`` (importance sampling, Horvitz–Thompson), with rates from
the history's item means ``p_j`` — Neyman's allocation mixed with the proportional one,

    ``r_j ∝ (1 − η) sqrt(p_j (1 − p_j)) / Σ_k w_k sqrt(p_k (1 − p_k)) + η``,   ``Σ_j w_j r_j = 1``,

draws first the items recorded models disagree on, where a pair's difference ``d_j = x_aj − x_bj`` can be
non-zero. At a fixed number of draws the variance of the pair's estimate changes by

    ``(Σ_j w_j d_j² / r_j − Δ²) / (Σ_j w_j d_j² − Δ²)``

(the with-replacement ratio; the ranking's cells at fixed n scale about with it). Per bank, the models are split at
random in half; the history half's factor model gives ``p`` (:func:`~certeval.estimators.history.prior.fit_history_prior`,
its item means), and the ratio is averaged over the ranked half's *binding* pairs (``|Δ| < 0.07``: the pairs an
ε = 0.05 ranking must settle last). Reported per η with the floor ``ρ = min r``: an exact (betting) test must keep
its capital nonnegative whatever item comes next, so an importance weight up to ``1/ρ`` caps every bet at ``ρ``
times the cap without the design — a cost this fixed-n ratio does not count.

    python -m benchmarks pair_design_bound           # the four banks of issue 25, 5 splits each
    python -m benchmarks pair_design_bound --quick   # helm_mmlu, 1 split
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from benchmarks._meta import write_result

DATASETS = ("helm_mmlu", "vlm_ocrbench", "vlm_hallusionbench", "openllm_arc")
MIXES = (0.3, 0.5, 0.8)
BINDING = 0.07


def design_rates(p: np.ndarray, w: np.ndarray, mix: float) -> np.ndarray:
    """The rates of the module docstring (``Σ w r = 1``)."""
    spread = np.sqrt(np.clip(p, 0.0, 1.0) * (1.0 - np.clip(p, 0.0, 1.0)))
    rates = (1.0 - mix) * spread / float(w @ spread) + mix
    return rates / float(w @ rates)


def bound_case(name: str, splits: int, seed: int) -> dict:
    from benchmarks.pair_history import _bank
    from certeval.estimators.history.prior import fit_history_prior

    models, x, spec = _bank(name)
    w = spec.weights()
    m = len(models)
    rng = np.random.default_rng(seed)
    rows = []
    for split in range(splits):
        perm = rng.permutation(m)
        hist, ranked = np.sort(perm[: m // 2]), np.sort(perm[m // 2:])
        p = fit_history_prior(x[hist]).item_mean
        a, b = np.triu_indices(len(ranked), k=1)
        d = x[ranked][a] - x[ranked][b]
        delta = d @ w
        keep = (np.abs(delta) < BINDING) & ((d**2) @ w - delta**2 > 1e-9)
        d, delta = d[keep], delta[keep]
        plain = (d**2) @ w - delta**2
        row = {"split": split, "binding_pairs": int(keep.sum())}
        for mix in MIXES:
            r = design_rates(p, w, mix)
            ratio = ((d**2) @ (w / r) - delta**2) / plain
            row[str(mix)] = {"var_ratio_binding_mean": float(ratio.mean()), "floor": float(r.min())}
        rows.append(row)
        print(f"[pair_design_bound] {name} split {split}: " + ", ".join(
            f"eta {mix}: ratio {row[str(mix)]['var_ratio_binding_mean']:.3f} floor {row[str(mix)]['floor']:.2f}"
            for mix in MIXES), file=sys.stderr, flush=True)
    summary = {str(mix): {k: float(np.mean([r[str(mix)][k] for r in rows]))
                          for k in ("var_ratio_binding_mean", "floor")} for mix in MIXES}
    return {"dataset": name, "models": m, "items": int(x.shape[1]), "splits": splits, "summary": summary,
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks pair_design_bound", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--splits", type=int, default=5)
    args = p.parse_args(argv)
    banks = ("helm_mmlu",) if args.quick else DATASETS
    cases = [bound_case(name, 1 if args.quick else args.splits, args.seed) for name in banks]
    path = write_result("pair_design_bound", {
        "cases": cases, "binding_abs_difference": BINDING, "mixes": list(MIXES),
        "note": "fixed-n variance ratio of a pair's estimate when the shared order is drawn proportional to weight "
                "times a history disagreement rate (importance sampling) instead of proportional to weight; "
                "binding pairs of the ranked half; floor = the smallest rate (an exact test's bets shrink by it)"},
        args.quick)
    print(f"pair_design_bound -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
