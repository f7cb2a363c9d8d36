"""What useless history costs: items to a half-width with the history's items permuted, against no history.

The ``history`` method weighs its history by what it has shown it predicts (``HistoryMethod.history_trust``: the
out-of-sample slope of the scores on the history's predictions, James–Stein-shrunk towards none), so history that
predicts nothing should cost at most a few percent more items than running without it. Per bank and goal, the same
reps (rep r evaluates model r mod M with its own seed; half the other models are history) stop at the goal:

* ``uniform`` — no history (one betting CS on the estimand, per-sub-dataset running means as controls);
* ``history`` — the held-out half's history;
* ``history-permuted`` — the same history with its items shuffled in every rep (it says nothing true).

Reported: mean items of each, ``history-permuted ÷ uniform`` (the cost of useless history; bound 1.05) with its
standard error (delta method over independent reps), ``history ÷ uniform``, and coverage at the stop.

``--paired``: the paired comparison's CS (``compare --history``:
:class:`~certeval.estimators.paired_history.PairDifferenceMethod`) at 100 items of a shared order drawn ∝ weight,
for random pairs of models, with both models' history, with both permuted, and with a prior that predicts nothing
(the history's grand mean everywhere, no factors: the run without history in the same class); the width ratios to
that, and the same with the trust fixed at 1 (the history followed whatever it shows: the weighting switched off).
Written to ``useless_history_paired.json``.

    python -m benchmarks useless_history            # helm_mmlu, openllm_arc, vlm_ocrbench; goals 0.1, 0.05; 100 reps
    python -m benchmarks useless_history --paired   # the same banks, 60 pairs each at 100 items (a minute)
    python -m benchmarks useless_history --quick    # one bank, one goal, 4 reps (seconds)
"""

from __future__ import annotations

import argparse
import math
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: no BLAS oversubscription

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402
from certeval.backtest.ray_fanout import Cell, dataset_arrays, history_cell, run_cells  # noqa: E402

DATASETS = ("helm_mmlu", "openllm_arc", "vlm_ocrbench")
GOALS = ("halfwidth:0.1", "halfwidth:0.05")
LABELS = ("uniform", "history", "history-permuted")


def _ratio(num: list[float], den: list[float]) -> dict[str, float]:
    """Ratio of means with its delta-method standard error (independent samples)."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    r = a.mean() / b.mean()
    se = r * math.sqrt(a.var(ddof=1) / a.size / a.mean() ** 2 + b.var(ddof=1) / b.size / b.mean() ** 2)
    return {"ratio": float(r), "se": float(se)}


PAIR_ITEMS, PAIR_LABELS = 100, ("history", "permuted", "blind")


def paired_widths(name: str, pairs: int, seed: int, trust_fixed: bool = False) -> dict:
    """Median width ratios to the no-information prior of ``compare --history``'s CS at ``PAIR_ITEMS`` items."""
    from dataclasses import replace

    from certeval.estimators.paired_history import PairDifferenceMethod, PairPrior

    data = dataset_arrays(name, features=False, history=True)
    prior, w, models = data.history, data.spec.weights(), len(data.models)
    blind = replace(prior, item_mean=np.full(prior.n_items, float(prior.item_mean.mean())), factors=prior.factors * 0)
    method_cls = PairDifferenceMethod
    if trust_fixed:  # the weighting switched off: the history's prediction is the control variate, as before
        method_cls = type("UntrustingPair", (PairDifferenceMethod,), {"history_trust": lambda self, h, z: 1.0})
    widths = {lab: [] for lab in PAIR_LABELS}
    for r in range(pairs):
        rng = np.random.default_rng([seed, r])
        a, b = rng.choice(models, 2, replace=False)
        order = np.argsort(rng.exponential(size=w.size) / w)[:PAIR_ITEMS]  # successive sampling ∝ weight
        permuted = (prior.permuted(np.random.default_rng([seed, r, 1])), prior.permuted(np.random.default_rng([seed, r, 2])))
        for lab, (pa, pb) in zip(PAIR_LABELS, ((prior, prior), permuted, (blind, blind))):
            method = method_cls(confidence=0.95, subset_intervals=False, bet_horizon=PAIR_ITEMS).start(
                replace(data.spec, history=PairPrior(pa, pb)))
            for s in range(0, PAIR_ITEMS, 10):
                items = order[s:s + 10]
                method.propose_shared_order(items)
                method.update_pair(items, data.matrix[a][items], data.matrix[b][items])
            est = method.result()
            widths[lab].append(est.upper - est.lower)
    base = np.asarray(widths["blind"])
    return {lab: float(np.median(np.asarray(v) / base)) for lab, v in widths.items() if lab != "blind"}


def main_paired(names: list[str], pairs: int, seed: int, quick: bool) -> int:
    rows = []
    for name in names:
        row = {"dataset": name, "pairs": pairs, "items": PAIR_ITEMS, "width_vs_no_information": paired_widths(
            name, pairs, seed), "trust_fixed_at_1": paired_widths(name, pairs, seed, trust_fixed=True)}
        rows.append(row)
        print(f"[useless_history] paired {name}: {row}", file=sys.stderr, flush=True)
    path = write_result("useless_history_paired", {"seed": seed, "rows": rows}, quick)
    print(f"useless_history_paired -> {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks useless_history", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="reps per cell (default 100; --quick 4)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--datasets", default=None, help="comma-separated bundled datasets")
    p.add_argument("--paired", action="store_true", help="the paired comparison's widths instead (see above)")
    args = p.parse_args(argv)
    reps = args.reps or (4 if args.quick else 100)
    names = args.datasets.split(",") if args.datasets else (["openllm_arc"] if args.quick else list(DATASETS))
    if args.paired:
        return main_paired(names, args.reps or (4 if args.quick else 60), args.seed, args.quick)
    goals = GOALS[:1] if args.quick else GOALS
    rows = []
    for name in names:
        data = dataset_arrays(name, features=False, history=True)
        n = data.spec.n_items
        batch = max(10, n // 100)
        for goal in goals:
            cells = [Cell(name, "uniform", goal, reps, batch), history_cell(name, goal, reps, batch),
                     history_cell(name, goal, reps, batch, permute=True)]
            out = run_cells({name: data}, cells, args.seed)
            items = {lab: [r["n_scored"] for r in out if r["method"] == lab] for lab in LABELS}
            row = {"dataset": name, "goal": goal, "n_items": n, "reps": reps,
                   "mean_items": {lab: float(np.mean(v)) for lab, v in items.items()},
                   "coverage": {lab: float(np.mean([r["covered"] for r in out if r["method"] == lab]))
                                for lab in LABELS},
                   "permuted_vs_uniform": _ratio(items["history-permuted"], items["uniform"]),
                   "history_vs_uniform": _ratio(items["history"], items["uniform"])}
            rows.append(row)
            print(f"[useless_history] {name} {goal}: " + " ".join(f"{k} {v:.1f}" for k, v in row["mean_items"].items())
                  + f" | permuted/uniform {row['permuted_vs_uniform']['ratio']:.3f} "
                  f"± {row['permuted_vs_uniform']['se']:.3f} history/uniform {row['history_vs_uniform']['ratio']:.3f}",
                  file=sys.stderr, flush=True)
    perm = [r["permuted_vs_uniform"]["ratio"] for r in rows]
    summary = {"permuted_vs_uniform_max": float(np.max(perm)), "permuted_vs_uniform_median": float(np.median(perm)),
               "pooled_permuted_vs_uniform": float(np.mean(perm)),
               "min_coverage": float(min(min(r["coverage"].values()) for r in rows))}
    path = write_result("useless_history", {"seed": args.seed, "reps": reps, "goals": list(goals), "rows": rows,
                                            "summary": summary}, args.quick)
    print(f"useless_history -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
