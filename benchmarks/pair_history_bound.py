"""How much can a model-specific history prediction help a *pair*? A variance bound for ``rank --history``.

For an ε-ranking the cells are decided by the pairs whose interval must shrink below ``|Δ| + ε``; the
interval's half-width scales with the standard deviation of what is sampled, so the cells a pair needs scale
about with its variance. With history, the sampled value is the paired difference minus its prediction,
``(x_a − x_b) − (p_a − p_b)``. Here, per bank, the models are split at random in half: the history half fits
the factor model (:func:`~certeval.estimators.history.prior.fit_history_prior`); each model of the other half gets the
posterior-mean prediction of every item from

* ``oracle``: the factor model's fit on ALL of that model's own items (no predictor of this family can do better
  on the bank; it even sees the item it predicts), and
* ``realistic``: the fit on a random 30% of its items, the variance measured on the other 70%, and
* ``ridge_on_history`` (another family: any linear combination of the history models' own item scores — the
  nearest models, their average, …): each ranked model's scores ridge-regressed on the history models' scores of
  a random half of the items, the variance measured on the other half; the best of a few ridge penalties is kept
  (chosen on the measured half: optimistic on purpose), and
* ``boosting_on_history`` (a nonlinear family): gradient-boosted trees on the same features and halves.

Reported per bank: the ratio ``Var(d − d̂) / Var(d)`` over the ranked pairs, its mean over the *binding* pairs
(``|Δ| < ε + 0.02``) and over all; and a fixed-n oracle fraction of cells for the ε-ranking (per model the
smallest bank fraction, on a 2% grid, at which the normal interval with finite-population correction and
per-model Bonferroni ``z_{1−α/(2M)}`` settles every pair, ``half-width < |Δ| + ε``), with and without the
variance reduction: the most any history ranking of this kind could save, before anytime-validity costs.
``yardsticks``: at ε = 0.05 and 0.1, :mod:`benchmarks.epsilon_bound`'s per-pair one-sided oracles (fixed-n, and
anytime-valid at looks of 50) on the ranked half with the plain SDs and with the ``oracle`` fit's residual SDs —
where issue 25's "below the fixed-n oracle with half the models as history" could be met by this construction.

    python -m benchmarks pair_history_bound           # helm_mmlu, vlm_ocrbench; 5 splits each
    python -m benchmarks pair_history_bound --quick   # helm_mmlu, 1 split
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
from scipy.stats import norm

from benchmarks._meta import write_result
from benchmarks.ranking_bound import bank_list, first_settled_fraction

DATASETS = ("helm_mmlu", "vlm_ocrbench")
EPSILON = 0.05
REALISTIC_SHARE = 0.3


def _predictions(prior, y_rank: np.ndarray, scale: np.ndarray, rng: np.random.Generator, share: float | None):
    """Per ranked model the predicted ``y`` of every item and the mask of items the fit did NOT see."""
    m, n = y_rank.shape
    x = y_rank / scale[None, :]
    pred, unseen = np.empty((m, n)), np.ones((m, n), dtype=bool)
    for k in range(m):
        items = np.arange(n) if share is None else np.sort(rng.choice(n, int(round(share * n)), replace=False))
        pred[k] = prior.predict(items, x[k, items]) * scale
        if share is not None:
            unseen[k, items] = False
    return pred, unseen


def _epsilon_fractions(y: np.ndarray, var: np.ndarray, epsilon: float, alpha: float) -> np.ndarray:
    """Per model the fixed-n oracle fraction of cells (see the module docstring); ``var`` per pair (M x M)."""
    m, n_total = y.shape
    mu = y.mean(axis=1)
    z = norm.ppf(1.0 - alpha / (2 * m))
    need = np.zeros(m)
    for a in range(m):
        others = np.arange(m) != a
        target = np.abs(mu[others] - mu[a]) + epsilon
        need[a] = first_settled_fraction(z, np.sqrt(var[a, others]), target, n_total)
    return need


RIDGE_PENALTIES = (1.0, 10.0, 30.0, 100.0, 300.0)


def _ridge_case(y_hist: np.ndarray, yr: np.ndarray, a: np.ndarray, b: np.ndarray, binding: np.ndarray,
                rng: np.random.Generator) -> dict:
    """Binding pairs' variance ratio when each ranked model is predicted by a ridge regression on the history
    models' item scores, fitted on half the items and measured on the other half (best penalty kept)."""
    n = yr.shape[1]
    items = rng.permutation(n)
    fit, test = items[: n // 2], items[n // 2:]
    x = np.column_stack([np.ones(n), y_hist.T])
    penalty = np.diag([0.0] + [1.0] * y_hist.shape[0])
    d = (yr[a] - yr[b])[:, test]
    var_ref = d.var(axis=1, ddof=1)
    best = None
    for lam in RIDGE_PENALTIES:
        beta = np.linalg.solve(x[fit].T @ x[fit] + lam * penalty, x[fit].T @ yr[:, fit].T)
        pred = (x @ beta).T[:, test]
        var_res = (d - (pred[a] - pred[b])).var(axis=1, ddof=1)
        ratio = np.where(var_ref > 1e-6, var_res / np.maximum(var_ref, 1e-12), 1.0)
        value = float(ratio[binding].mean()) if binding.any() else float("nan")
        if best is None or value < best["var_ratio_binding_mean"]:
            best = {"penalty": lam, "var_ratio_binding_mean": value, "var_ratio_all_mean": float(ratio.mean())}
    return best


def _boosting_case(y_hist: np.ndarray, yr: np.ndarray, w: np.ndarray, a: np.ndarray, b: np.ndarray,
                   binding: np.ndarray, rng: np.random.Generator) -> dict:
    """Binding pairs' variance ratio when each ranked model is predicted by gradient-boosted trees (a nonlinear
    family) on the history models' item scores, fitted on half the items and measured on the other half."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    n = yr.shape[1]
    items = rng.permutation(n)
    fit, test = items[: n // 2], items[n // 2:]
    features = y_hist.T
    pred = np.empty_like(yr, dtype=float)
    for k in range(yr.shape[0]):
        model = HistGradientBoostingRegressor(max_iter=100, learning_rate=0.05, max_leaf_nodes=8,
                                              min_samples_leaf=10, random_state=0)
        pred[k] = model.fit(features[fit], yr[k, fit]).predict(features)
    wt = w[test] / w[test].sum()  # the estimand's weights on the measured half
    d = (yr[a] - yr[b])[:, test]
    r = d - (pred[a] - pred[b])[:, test]
    var_ref = (d**2) @ wt - (d @ wt) ** 2
    var_res = (r**2) @ wt - (r @ wt) ** 2
    ratio = np.where(var_ref > 1e-9, var_res / np.maximum(var_ref, 1e-12), 1.0)
    return {"var_ratio_binding_mean": float(ratio[binding].mean()) if binding.any() else float("nan"),
            "var_ratio_all_mean": float(ratio.mean())}


YARDSTICK_EPSILONS = (0.05, 0.1)
YARDSTICK_ROWS = ("fixed_pair_one_sided", "anytime_tests_looks")


def _yardsticks(yr: np.ndarray, sd_history: np.ndarray, alpha: float) -> dict:
    """The ε-ranking oracles of :mod:`benchmarks.epsilon_bound` on the ranked half, with the pairs' plain SDs and
    with the residual SDs of the best prediction of this family (fitted on all the model's own items): what
    ``rank --epsilon --history`` could reach in the construction class it uses (one-sided tests at α/P)."""
    from benchmarks.epsilon_bound import oracle_cells

    out = {}
    for eps in YARDSTICK_EPSILONS:
        plain = oracle_cells(yr, eps, alpha)
        hist = oracle_cells(yr, eps, alpha, sd_override=sd_history)
        out[str(eps)] = {f"{k}_{lab}": cells[k] for k in YARDSTICK_ROWS
                         for lab, cells in (("plain", plain), ("history", hist))}
    return out


def bound_case(name: str, splits: int, seed: int, alpha: float = 0.05) -> dict:
    from certeval.estimators.history.prior import fit_history_prior

    models, y = bank_list(name)
    m, n = y.shape
    from certeval.inputs.banks import bank_from_scores, load_scores

    bank = bank_from_scores(load_scores(f"bundled:{name}"))
    scale = n * bank.spec().weights()  # y = scale * x
    rows = []
    rng = np.random.default_rng(seed)
    for split in range(splits):
        perm = rng.permutation(m)
        hist, rank = np.sort(perm[: m // 2]), np.sort(perm[m // 2:])
        prior = fit_history_prior(y[hist] / scale[None, :])
        yr = y[rank]
        a, b = np.triu_indices(len(rank), k=1)
        d = yr[a] - yr[b]
        var_plain = d.var(axis=1, ddof=1)
        delta = np.abs(d.mean(axis=1))
        binding = delta < EPSILON + 0.02
        out = {"split": split, "ranked_models": int(len(rank)), "history_models": int(len(hist)),
               "pairs": int(len(a)), "binding_pairs": int(binding.sum())}
        for label, share in (("oracle", None), ("realistic", REALISTIC_SHARE)):
            pred, unseen = _predictions(prior, yr, scale, rng, share)
            r = d - (pred[a] - pred[b])
            both = unseen[a] & unseen[b]
            if share is None:
                var_res = r.var(axis=1, ddof=1)
                var_ref = var_plain
            else:  # measured on the items neither model's fit saw
                var_res = np.array([r[p, both[p]].var(ddof=1) for p in range(len(a))])
                var_ref = np.array([d[p, both[p]].var(ddof=1) for p in range(len(a))])
            # pairs with (almost) identical scores have no variance to reduce: their ratio counts as 1
            ratio = np.where(var_ref > 1e-6, var_res / np.maximum(var_ref, 1e-12), 1.0)
            full_var = np.zeros((len(rank), len(rank)))
            full_var[a, b] = full_var[b, a] = var_plain * ratio
            plain_var = np.zeros_like(full_var)
            plain_var[a, b] = plain_var[b, a] = var_plain
            f_hist = _epsilon_fractions(yr, full_var, EPSILON, alpha)
            f_plain = _epsilon_fractions(yr, plain_var, EPSILON, alpha)
            if label == "oracle":
                out["yardsticks"] = _yardsticks(yr, np.sqrt(var_plain * ratio), alpha)
            out[label] = {"var_ratio_binding_mean": float(ratio[binding].mean()) if binding.any() else None,
                          "var_ratio_binding_median": float(np.median(ratio[binding])) if binding.any() else None,
                          "var_ratio_all_mean": float(ratio.mean()),
                          "var_ratio_binding_pooled": float(var_res[binding].sum() / var_ref[binding].sum())
                          if binding.any() else None,
                          "oracle_fixed_n_cells_plain": float(f_plain.mean()),
                          "oracle_fixed_n_cells_history": float(f_hist.mean()),
                          "cells_saving": float(1.0 - f_hist.mean() / f_plain.mean())}
        out["ridge_on_history"] = _ridge_case(y[hist], yr, a, b, binding, rng)
        xs = y / scale[None, :]  # the scores in [0, 1], weighted by the estimand as the engine draws them
        out["boosting_on_history"] = _boosting_case(xs[hist], xs[rank], bank.spec().weights(), a, b, binding, rng)
        rows.append(out)
        print(f"[pair_history_bound] {name} split {split}: ridge binding ratio "
              f"{out['ridge_on_history']['var_ratio_binding_mean']:.3f}; boosting "
              f"{out['boosting_on_history']['var_ratio_binding_mean']:.3f}; "
              + ", ".join(f"{k} binding ratio {out[k]['var_ratio_binding_mean']:.3f} all {out[k]['var_ratio_all_mean']:.3f}"
                          f" cells {out[k]['oracle_fixed_n_cells_plain']:.3f}->{out[k]['oracle_fixed_n_cells_history']:.3f}"
                          for k in ("oracle", "realistic")), file=sys.stderr)

    def avg(label: str, key: str) -> float:
        vals = [r[label][key] for r in rows if r[label][key] is not None]
        return float(np.mean(vals)) if vals else float("nan")

    summary = {lab: {k: avg(lab, k) for k in rows[0][lab]}
               for lab in ("oracle", "realistic", "ridge_on_history", "boosting_on_history")}
    summary["yardsticks"] = {eps: {k: float(np.mean([r["yardsticks"][eps][k] for r in rows]))
                                   for k in rows[0]["yardsticks"][eps]} for eps in rows[0]["yardsticks"]}
    return {"dataset": name, "models": m, "items": n, "epsilon": EPSILON, "alpha": alpha, "splits": splits,
            "summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks pair_history_bound", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--splits", type=int, default=5)
    args = p.parse_args(argv)
    cases = [bound_case(name, 1 if args.quick else args.splits, args.seed)
             for name in (("helm_mmlu",) if args.quick else DATASETS)]
    path = write_result("pair_history_bound", {
        "cases": cases, "realistic_share": REALISTIC_SHARE,
        "note": "variance ratio Var(d - dhat)/Var(d) of the ranked pairs' paired differences with the factor model "
                "fitted on the history half; 'oracle' fits each model on all its items (upper bound for this "
                "predictor family), 'realistic' on 30% (ratio on the other 70%), 'ridge_on_history' any linear combination of the "
                "history models' item scores fitted on half the items (ratio on the other half, best penalty). Cells: fixed-n normal oracle of "
                "the epsilon-ranking with and without the reduction (a lower bound on any valid procedure)"}, args.quick)
    print(f"pair_history_bound -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
