"""Where the cells of ``rank --epsilon E`` go: the fixed-n normal oracle, decomposed step by step into what an
anytime-valid per-pair construction must pay.

Every pair (a, b) of an ε-ranking is settled once its interval for ``Δ = mu_a - mu_b`` certifies one listing:
lower bound > -E or upper bound < E, i.e. (for an interval centred near Δ) once its half-width is below
``E + |Δ|``. A model leaves once all its pairs are settled; its fraction of cells is the largest settling
point of its pairs; the cells of the ranking are the mean over models. Each oracle below knows every pair's
exact Δ and standard deviation σ (of the per-item difference, bank weights folded in as in ``ranking_bound``)
and differs from the previous one in exactly one respect:

* ``fixed_model``: fixed-n normal interval ``z σ sqrt((N - n)/(n (N - 1)))`` with z at ``1 - α/(2M)`` (a
  per-model Bonferroni), looks on a grid of 2 % of the bank — ``ranking_bound``'s oracle read with
  ε-statements: the reference of issue 25's "within 1.25×";
* ``fixed_pair``: the same, z at ``1 - α/(2P)``: the union bound over the P pairs a per-pair construction pays (d);
* ``anytime_pair``: an anytime-valid interval at level α/P, the best of its class: the supermartingale
  ``exp(λ Σ α_i (X_i - ν_i(m)) - λ² σ² Σ α_i² / 2)`` (sub-Gaussian with the TRUE σ, bets ``λ α_i``
  proportional to the without-replacement slope ``α_i = N/(N - i + 1)``), each side at α/(2P), with λ tuned
  for each pair to the very n where it must settle — half-width ``sqrt(2 σ² ln(2P/α) / Σ_{i<=n} α_i²)``.
  No predictable λ of a variance-known sub-Gaussian test does better at that n (a) — it ignores the bounded
  support, which a betting CS can exploit, so it is a yardstick for this construction class, not a theorem
  about every valid procedure;
* ``anytime_pair_looks``: the same at looks every 50 items (b) — certeval's backtest granularity.

Two more rows price the construction ``rank --epsilon`` now uses (:mod:`certeval.estimators.bank.epsilon_tests`: two
one-sided tests per pair whose nulls are disjoint, each at α/P): ``fixed_pair_one_sided`` (z at ``1 - α/P``) and
``anytime_tests_looks`` (``ln(P/α)`` in place of ``ln(2P/α)``, looks every 50 items).

What the measured method adds (``benchmarks/results/ranking.json`` → ``epsilon``): σ and Δ plugged in
predictably, bounded-support betting instead of a sub-Gaussian bound (c). These oracles are YARDSTICKS, not lower
bounds: each centres the interval on the exact Δ, while a real pair with |Δ| < E settles at whichever boundary
its noise favours first (the earlier of two crossings), and a betting test on bounded data can gain more per draw
than the sub-Gaussian rate; the measured cells on vlm_ocrbench come in below ``anytime_tests_looks``.

    python -m benchmarks.epsilon_bound           # helm_mmlu, vlm_ocrbench, vlm_hallusionbench, openllm_arc; E 0.05, 0.1
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from scipy.stats import norm

from benchmarks._meta import write_result
from benchmarks.ranking_bound import bank_list

DATASETS = ("helm_mmlu", "vlm_ocrbench", "vlm_hallusionbench", "openllm_arc")
EPSILONS = (0.05, 0.1)
LOOKS_EVERY = 50


def _pair_stats(y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every pair's (a, b, |Δ|, σ) over the bank list ``y`` (models x items)."""
    m, _ = y.shape
    a, b = np.triu_indices(m, k=1)
    mu = y.mean(axis=1)
    sq = (y @ y.T) / y.shape[1]
    var = np.diag(sq)[a] + np.diag(sq)[b] - 2 * sq[a, b] - (mu[a] - mu[b]) ** 2
    n = y.shape[1]
    sd = np.sqrt(np.maximum(var, 0.0) * n / (n - 1))
    return a, b, np.abs(mu[a] - mu[b]), sd


def settle_fraction(half_at: np.ndarray, grid: np.ndarray, target: np.ndarray, n_total: int) -> np.ndarray:
    """Per pair, the first grid point (items) whose half-width ``half_at[g] * sd`` is below the target, as a
    fraction of the bank (1 at exhaustion). ``half_at``: half-width per unit σ at each grid point."""
    # half-widths fall with n: the first grid point with half_at < target / sd
    ratio = np.where(target > 0, target, 0.0)
    out = np.ones(target.shape)
    for g in range(len(grid) - 1, -1, -1):  # walking down keeps the first (smallest) point that settles
        ok = half_at[g] < ratio
        out[ok] = grid[g] / n_total
    return out


def oracle_cells(y: np.ndarray, epsilon: float, alpha: float = 0.05,
                 sd_override: np.ndarray | None = None) -> dict[str, float]:
    """Every oracle's cells for ``y``; ``sd_override`` (per pair, ``np.triu_indices`` order) replaces the pairs'
    standard deviations — a control variate's residual SD, for the history yardstick."""
    m, n_total = y.shape
    p = m * (m - 1) // 2
    a, b, delta, sd = _pair_stats(y)
    if sd_override is not None:
        sd = sd_override
    target = (epsilon + delta) / np.maximum(sd, 1e-12)  # half-width needed, in units of σ
    fpc = lambda n: np.sqrt((n_total - n) / (n * (n_total - 1.0)))  # noqa: E731
    grid2 = np.unique(np.maximum(2, np.round(np.linspace(0.02, 1.0, 50) * n_total).astype(int)))
    grid50 = np.unique(np.r_[np.arange(LOOKS_EVERY, n_total, LOOKS_EVERY), n_total])
    i = np.arange(1, n_total + 1, dtype=float)
    a2 = np.cumsum((n_total / (n_total - i + 1.0)) ** 2)  # Σ α_i² through n

    def anytime(grid: np.ndarray) -> np.ndarray:
        h = np.sqrt(2.0 * np.log(2.0 * p / alpha) / a2[grid - 1])
        h[grid == n_total] = 0.0
        return h

    def fixed(z: float, grid: np.ndarray) -> np.ndarray:
        return z * fpc(grid.astype(float))

    rows = {"fixed_model": fixed(norm.ppf(1 - alpha / (2 * m)), grid2),
            "fixed_pair": fixed(norm.ppf(1 - alpha / (2 * p)), grid2),
            "anytime_pair": anytime(grid2), "anytime_pair_looks": anytime(grid50),
            "fixed_pair_one_sided": fixed(norm.ppf(1 - alpha / p), grid2),
            "anytime_tests_looks": anytime(grid50) * np.sqrt(np.log(p / alpha) / np.log(2.0 * p / alpha))}
    out = {}
    for name, half in rows.items():
        grid = grid50 if name.endswith("looks") else grid2
        f = settle_fraction(half, grid, target, n_total)
        need = np.zeros(m)
        np.maximum.at(need, a, f)
        np.maximum.at(need, b, f)
        out[name] = float(need.mean())
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.epsilon_bound", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--alpha", type=float, default=0.05)
    args = p.parse_args(argv)
    rows = []
    for name in (("helm_mmlu",) if args.quick else DATASETS):
        models, y = bank_list(name)
        for eps in EPSILONS:
            cells = oracle_cells(y, eps, args.alpha)
            ref = cells["fixed_model"]
            rows.append({"dataset": name, "models": len(models), "items": y.shape[1], "epsilon": eps,
                         "alpha": args.alpha, **{f"cells_{k}": v for k, v in cells.items()},
                         **{f"ratio_{k}": v / ref for k, v in cells.items()},
                         "target_1.25x_fixed_model": 1.25 * ref})
            print(f"[epsilon_bound] {name} eps {eps}: " + ", ".join(f"{k} {v:.3f}" for k, v in cells.items()),
                  file=sys.stderr)
    path = write_result("epsilon_bound", {"alpha": args.alpha, "rows": rows, "note": __doc__.split("\n\n")[1]},
                        args.quick)
    print(f"epsilon_bound -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
