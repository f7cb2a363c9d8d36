"""What useless history costs: items to a half-width with the history's items permuted, against no history.

The ``history`` method weighs its history by what it has shown it predicts (``HistoryMethod.measured_trust``: the
out-of-sample slope of the scores on the history's predictions, 0 until a one-sided test at level
``TRUST_TEST_LEVEL`` finds it positive, then James–Stein-shrunk towards none), so history that predicts nothing
should cost at most a few percent more items than running without it. Per bank and goal, rep r evaluates model
r mod M (half the other models are history), stopping at the goal, three ways on ONE seed (paired):

* ``uniform`` — no history: ``uniform``'s exact CS, its draws ∝ weight made the way ``history`` makes its ∝ weight
  draws (exponential keys over the undrawn items, one call per batch, from the same seed), so as long as
  ``history`` draws ∝ weight both score the very same items and differ only in their intervals;
* ``history`` — the held-out half's history;
* ``history-permuted`` — the same history with its items shuffled in every rep (it says nothing true).

Reported: mean items of each, ``history-permuted ÷ uniform`` (the cost of useless history; bound 1.05) with its
paired standard error (delta method on the per-rep pairs), ``history ÷ uniform``, and coverage at the stop.

``--paired``: the paired comparison's CS (``compare --history``:
:class:`~certeval.estimators.history.paired.PairDifferenceMethod`) at 100 items of a shared order drawn ∝ weight,
for random pairs of models, with both models' history, with both permuted, and with a prior that predicts nothing
(the history's grand mean everywhere, no factors: the run without history in the same class); the width ratios to
that, and the same with the trust fixed at 1 (the history followed whatever it shows: the weighting switched off).
Written to ``useless_history_paired.json``.

``--rank``: ``rank --history --epsilon 0.05`` (:class:`~certeval.estimators.history.ranking.HistoryRanking`, one
trust ρ for every model and pair) on helm_mmlu and vlm_ocrbench, the models split at random in half (history half,
ranked half), looks of 50 items of one order drawn ∝ weight per rep, three ways on the same orders: with the history,
with it permuted, and the plain all-pairs :class:`~certeval.estimators.bank.ranking.BankRanking` (``rank --epsilon
--ranking all-pairs``, the construction the history ranking adds its controls to). Fraction of model × item cells,
paired ratios to the plain ranking, and reps with a listing the exact means contradict. Written to
``useless_history_rank.json``.

    python -m benchmarks useless_history            # helm_mmlu, openllm_arc, vlm_ocrbench; goals 0.1, 0.05; 100 reps
    python -m benchmarks useless_history --datasets vlm_ocrbench --goals halfwidth:0.1 --reps 1000 \
        --name useless_history_vlm_ocrbench          # one cell with a small standard error
    python -m benchmarks useless_history --paired   # the same banks, 60 pairs each at 100 items (a minute)
    python -m benchmarks useless_history --rank     # helm_mmlu 20 reps, vlm_ocrbench 5 (minutes)
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
from certeval.backtests.cells import bank_truth, rep_seed
from certeval.backtests.ray_fanout import dataset_arrays  # noqa: E402
from certeval.estimators.single.uniform import UniformMethod  # noqa: E402

DATASETS = ("helm_mmlu", "openllm_arc", "vlm_ocrbench")
GOALS = ("halfwidth:0.1", "halfwidth:0.05")
LABELS = ("uniform", "history", "history-permuted")


def _ratio(num: list[float], den: list[float]) -> dict[str, float]:
    """Ratio of means of paired samples (rep i of each on one seed), with its delta-method standard error:
    ``se = sd(a_i − R b_i) / (√n · mean(b))``."""
    a, b = np.asarray(num, dtype=float), np.asarray(den, dtype=float)
    r = a.mean() / b.mean()
    se = float(np.std(a - r * b, ddof=1)) / math.sqrt(a.size) / b.mean()
    return {"ratio": float(r), "se": se}


class KeyedUniform(UniformMethod):
    """``uniform`` whose draws ∝ weight are made as ``history``'s ∝ weight draws are: one exponential key per
    undrawn item (bank order) per batch, the k smallest of key/w (successive sampling ∝ w, Efraimidis & Spirakis
    2006). The same law as ``uniform``'s own draws, so the same CS; from the seed a ``history`` rep draws with, the
    same items while that rep draws ∝ weight."""

    def _choose(self, k: int, rng: np.random.Generator):
        avail = self.available()
        keys = rng.exponential(size=avail.size) / self.bank_.weights()[avail]
        items = avail[np.argsort(keys, kind="stable")[:k]]
        self.propose_shared_order(items)  # joint CS: the draws' laws are logged as a shared order's (∝ w)
        return items, None


def _replay(method, spec, row: np.ndarray, goal, batch: int, rng: np.random.Generator):
    """One rep of ``method`` (an instance) until the goal decides: the engine's rounds with scores by lookup."""
    from certeval.engine import SingleModelRounds, lookup, run_until_decided

    method.start(spec)
    rounds = SingleModelRounds({"model": method}, goal, n_items=spec.n_items, batch_size=batch)
    run_until_decided(rounds, lookup({"model": row}), lambda _label: rng)
    return method.result()


def paired_reps(data, goal_text: str, reps: int, seed: int, batch: int) -> dict[str, list[tuple[int, bool]]]:
    """(items scored, covered) per label and rep, every label of a rep on the same seed (module docstring)."""
    from dataclasses import replace

    from certeval.estimators import method_for_goal, parse_goal

    goal = parse_goal(goal_text)
    out: dict[str, list[tuple[int, bool]]] = {lab: [] for lab in LABELS}
    for rep in range(reps):
        model_idx = rep % len(data.models)
        row = data.matrix[model_idx]
        ss = rep_seed(seed, data.name, data.models[model_idx], "useless_history", rep)
        perm_seed, truth = ss.spawn(1)[0], bank_truth(data.spec, row)
        for lab in LABELS:
            if lab == "uniform":
                method, spec = KeyedUniform(**method_for_goal("uniform", goal).get_params()), data.spec
            else:
                method = method_for_goal("history", goal, subset_intervals=False)
                prior = data.history.permuted(np.random.default_rng(perm_seed)) if lab != "history" else data.history
                spec = replace(data.spec, history=prior)
            est = _replay(method, spec, row, goal, batch, np.random.default_rng(ss))
            out[lab].append((int(est.n_scored), bool(est.lower - 1e-9 <= truth <= est.upper + 1e-9)))
    return out


PAIR_ITEMS, PAIR_LABELS = 100, ("history", "permuted", "blind")


def paired_widths(name: str, pairs: int, seed: int, trust_fixed: bool = False) -> dict:
    """Median width ratios to the no-information prior of ``compare --history``'s CS at ``PAIR_ITEMS`` items."""
    from dataclasses import replace

    from certeval.estimators.history.paired import PairDifferenceMethod, PairPrior

    data = dataset_arrays(name, features=None, history=True)
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


RANK_LABELS, RANK_EPSILON, RANK_LOOK = ("history", "permuted", "plain"), 0.05, 50
RANK_REPS = {"helm_mmlu": 20, "vlm_ocrbench": 5}


def rank_cells(name: str, reps: int, seed: int) -> dict:
    """Cells of ``rank --history`` with the history, with it permuted, and of the plain ranking, on the same orders."""
    from benchmarks.pair_history import ALPHA, _bank, half_split
    from benchmarks.pair_history import _replay as replay_rank
    from certeval.estimators.bank.ranking import BankRanking
    from certeval.estimators.history.ranking import HistoryRanking

    models, x, spec = _bank(name)
    w = spec.weights()
    rng = np.random.default_rng(seed)
    runs: dict[str, list[dict]] = {lab: [] for lab in RANK_LABELS}
    trust: dict[str, list[float]] = {"history": [], "permuted": []}
    for rep in range(reps):
        names, xr, prior, order = half_split(models, x, w, rng)
        priors = {"history": prior, "permuted": prior.permuted(np.random.default_rng([seed, rep]))}
        for lab in RANK_LABELS:
            if lab == "plain":
                rank = BankRanking(names, alpha=ALPHA, epsilon=RANK_EPSILON).start(w)
            else:
                rank = HistoryRanking(names, [priors[lab]] * len(names), spec, alpha=ALPHA, epsilon=RANK_EPSILON)
            runs[lab].append(replay_rank(rank, xr, order, w, RANK_LOOK))
            if lab in trust:
                trust[lab].append(float(rank.trust))
        print(f"[useless_history] rank {name} rep {rep}: " + " ".join(
            f"{lab} {runs[lab][-1]['fraction_cells']:.3f}" for lab in RANK_LABELS), file=sys.stderr, flush=True)
    cells = {lab: [r["fraction_cells"] for r in v] for lab, v in runs.items()}
    return {"dataset": name, "models": len(models), "items": int(x.shape[1]), "epsilon": RANK_EPSILON,
            "alpha": ALPHA, "look_items": RANK_LOOK, "reps": reps,
            "mean_fraction_cells": {lab: float(np.mean(v)) for lab, v in cells.items()},
            "permuted_vs_plain": _ratio(cells["permuted"], cells["plain"]),
            "history_vs_plain": _ratio(cells["history"], cells["plain"]),
            "final_trust_median": {lab: float(np.median(v)) for lab, v in trust.items()},
            "reps_with_a_wrong_listing": {lab: sum(r["wrong_listings"] > 0 for r in v) for lab, v in runs.items()},
            "all_decided_intervals_cover": all(r["all_decided_intervals_cover"] for v in runs.values() for r in v)}


def main_rank(names: list[str], reps: int | None, seed: int, quick: bool) -> int:
    rows = [rank_cells(name, reps or RANK_REPS.get(name, 10), seed) for name in names]
    for row in rows:
        print(f"[useless_history] rank {row['dataset']}: {row['mean_fraction_cells']} permuted/plain "
              f"{row['permuted_vs_plain']} history/plain {row['history_vs_plain']}", file=sys.stderr, flush=True)
    path = write_result("useless_history_rank", {"seed": seed, "rows": rows}, quick)
    print(f"useless_history_rank -> {path}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks useless_history", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="reps per cell (default 100; --quick 4)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--datasets", default=None, help="comma-separated bundled datasets")
    p.add_argument("--goals", default=None, help="comma-separated goals (default halfwidth:0.1,halfwidth:0.05)")
    p.add_argument("--name", default="useless_history", help="result file name (benchmarks/results/NAME.json)")
    p.add_argument("--paired", action="store_true", help="the paired comparison's widths instead (see above)")
    p.add_argument("--rank", action="store_true", help="rank --history's cells instead (see above)")
    args = p.parse_args(argv)
    reps = args.reps or (4 if args.quick else 100)
    names = args.datasets.split(",") if args.datasets else (["openllm_arc"] if args.quick else list(DATASETS))
    if args.rank:
        rank_names = args.datasets.split(",") if args.datasets else (["helm_mmlu"] if args.quick else list(RANK_REPS))
        return main_rank(rank_names, args.reps or (2 if args.quick else None), args.seed, args.quick)
    if args.paired:
        return main_paired(names, args.reps or (4 if args.quick else 60), args.seed, args.quick)
    goals = tuple(args.goals.split(",")) if args.goals else (GOALS[:1] if args.quick else GOALS)
    rows = []
    for name in names:
        data = dataset_arrays(name, features=None, history=True)
        n = data.spec.n_items
        batch = max(10, n // 100)
        for goal in goals:
            out = paired_reps(data, goal, reps, args.seed, batch)
            items = {lab: [v[0] for v in out[lab]] for lab in LABELS}
            row = {"dataset": name, "goal": goal, "n_items": n, "reps": reps, "batch": batch,
                   "mean_items": {lab: float(np.mean(v)) for lab, v in items.items()},
                   "coverage": {lab: float(np.mean([v[1] for v in out[lab]])) for lab in LABELS},
                   "permuted_vs_uniform": _ratio(items["history-permuted"], items["uniform"]),
                   "history_vs_uniform": _ratio(items["history"], items["uniform"]),
                   "same_items_as_uniform": float(np.mean(np.equal(items["history-permuted"], items["uniform"])))}
            rows.append(row)
            print(f"[useless_history] {name} {goal}: " + " ".join(f"{k} {v:.1f}" for k, v in row["mean_items"].items())
                  + f" | permuted/uniform {row['permuted_vs_uniform']['ratio']:.3f} "
                  f"± {row['permuted_vs_uniform']['se']:.3f} history/uniform {row['history_vs_uniform']['ratio']:.3f}",
                  file=sys.stderr, flush=True)
    perm = [r["permuted_vs_uniform"]["ratio"] for r in rows]
    summary = {"permuted_vs_uniform_max": float(np.max(perm)), "permuted_vs_uniform_median": float(np.median(perm)),
               "pooled_permuted_vs_uniform": float(np.mean(perm)),
               "min_coverage": float(min(min(r["coverage"].values()) for r in rows))}
    path = write_result(args.name, {"seed": args.seed, "reps": reps, "goals": list(goals), "paired": True,
                                    "rows": rows, "summary": summary}, args.quick)
    print(f"{args.name} -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
