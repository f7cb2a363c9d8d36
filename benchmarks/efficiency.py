"""Sample efficiency on the real recorded data: items needed to reach a precision goal.

For every bundled dataset and every single-model method (static, seq, cer-eval, uniform,
adaptive, faq) and several half-width goals, replay ``reps`` runs (rep r evaluates the r-th
held-out model in turn, with its own seed) and report: mean items scored when the goal was
met, the ratio to ``uniform`` (certeval's uniform-order betting confidence sequence) and to
the uniform-order method with the *same* guarantee type (Cer-Eval vs Seq, adaptive vs
uniform, FAQ vs faq-uniform), and the measured coverage of the bank's true mean at the stopping
time (Wilson 95% interval over reps). Cer-Eval's features are item factors from the held-out
half of the models (mean score + SVD components), since 7 of 9 datasets have no item text.

FAQ (Wu et al. 2026, arXiv:2601.20251) gets the logistic factor model fitted on the same history half (K and λ by
3-fold CV, 1-SE rule; cached under ``.cache/faq/``; fitted only when ``faq`` is run) and
its anytime interval (``ci=anytime``: a stop-when-the-goal-is-met run peeks at every look, so
the fixed-budget intervals do not hold there; the confidence sequence is *asymptotic*, not
exact like the betting ones). ``faq-uniform`` is the same estimator and interval on one
constant item factor, so it learns the model's overall accuracy and nothing about items:
q_j = 0.9 w_j + 0.1/N (exactly uniform, and the estimate the plain sample mean, for the
bank-mean estimand). ``faq-uniform-half`` (on request) has zero factors instead: a constant
plug-in of 1/2, which pins its interval's variance at the worst case 1/4. FAQ draws with
replacement: its items are model calls, the distinct items scored (a re-drawn item's score is
cached; ``mean_draws`` counts draws), and a rep stops at 10·N draws (N = bank size) if the goal
is not met by then (``reached_rate``).

The estimand is the bank's mean-of-means over subsets (Arviv et al. 2026, eq. 1) for every method, or with
``--estimand bank-mean`` the plain bank mean (Cer-Eval's setting; written as ``efficiency_bank_mean``).
Batch size is 1% of the bank (at least 10 items), so a stopping point is known to ±1%.

    python -m benchmarks efficiency            # full: 200 reps per cell on Ray (2 CPUs)
    python -m benchmarks efficiency --quick    # four datasets, 1 rep, one goal (±0.1), in-process
    python -m benchmarks efficiency --methods faq,faq-uniform,uniform --ratio-only faq-uniform,uniform --append
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: no BLAS oversubscription

from benchmarks._meta import ROOT, read_result, write_result  # noqa: E402
from certeval.backtests.cells import FAQ_LABELS, FAQ_MAX_DRAWS_PER_ITEM, Cell, faq_cell, faq_planned_draws, history_cell
from certeval.backtests.ray_fanout import FanOut, FaqFit, dataset_arrays, run_cells
from certeval.backtests.summary import summarise
from certeval.estimators import parse_goal  # noqa: E402
from certeval.estimators.faq.querying import GUARANTEES as FAQ_GUARANTEES  # noqa: E402
from certeval.inputs.banks import bundled_datasets  # noqa: E402

# faq-uniform is FAQ's same-guarantee baseline: without it faq's cells have no same-guarantee ratio
METHODS = ("static", "seq", "cer-eval", "uniform", "adaptive", "history", "history-permuted", "faq", "faq-uniform")
HISTORY_LABELS = {"history": False, "history-permuted": True}  # label -> items shuffled (useless history)
FAQ_CACHE = ROOT / ".cache" / "faq"
# --quick runs faq only where the CV fit takes about a second (5-50 s elsewhere on a fresh checkout);
# helm_v023 has just 3 history models
QUICK_FAQ_DATASETS = ("helm_v023",)
# --quick proves the benchmark runs: many items, many models, a mean of sub-dataset means, and faq's fit
QUICK_DATASETS = ("helm_mmlu", "openllm_tiny", "opencompass_large", *QUICK_FAQ_DATASETS)
GOALS = ("halfwidth:0.1", "halfwidth:0.05", "halfwidth:0.02")


def batch_size_for(n_items: int) -> int:
    return max(10, n_items // 100)


def make_cell(dataset: str, method: str, goal: str, reps: int, batch_size: int) -> Cell:
    """One table cell; ``faq`` and its baselines get their arrays from the dataset at replay time."""
    faq_kinds = {label: kind for kind, label in FAQ_LABELS.items()}
    if method in faq_kinds:
        return faq_cell(dataset, goal, reps, batch_size, factors=faq_kinds[method])
    if method in HISTORY_LABELS:
        return history_cell(dataset, goal, reps, batch_size, permute=HISTORY_LABELS[method])
    return Cell(dataset, method, goal, reps, batch_size)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks efficiency", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="a few reps, one goal, in-process (minutes)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--reps", type=int, default=None, help="reps per cell (default 200; --quick 1)")
    p.add_argument("--datasets", default=None, help="comma-separated subset of the bundled datasets")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--goals", default=None, help="comma-separated goals (default halfwidth 0.1,0.05,0.03,0.02)")
    p.add_argument("--no-ray", action="store_true", help="run in-process instead of on local Ray")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster instead of a local one")
    p.add_argument("--estimand", choices=("mean-of-means", "bank-mean"), default="mean-of-means",
                   help="mean of sub-dataset means (default; result 'efficiency') or the plain bank mean "
                        "(result 'efficiency_bank_mean')")
    p.add_argument("--ratio-only", default=None,
                   help="with --append: methods run only as same-rep baselines for the ratios, not stored")
    p.add_argument("--append", action="store_true",
                   help="keep the stored result's cells for other methods/datasets and replace only those rerun")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    reps = args.reps or (1 if quick else 200)
    goals = tuple(args.goals.split(",")) if args.goals else (("halfwidth:0.1",) if quick else GOALS)
    methods = tuple(args.methods.split(","))
    names = args.datasets.split(",") if args.datasets else (list(QUICK_DATASETS) if quick else bundled_datasets())
    use_ray = not (args.no_ray or quick)
    faq_methods = set(FAQ_LABELS.values()) & set(methods)

    def runs(method: str, name: str) -> bool:
        return method not in faq_methods or not quick or name in QUICK_FAQ_DATASETS

    t0 = time.perf_counter()
    datasets = {}
    for name in names:
        # only faq needs the factor model (its baselines' factors are constants): fit it only then
        datasets[name] = dataset_arrays(name, max_eval_models=4 if quick else None,
                                        mean_of_means=args.estimand == "mean-of-means",
                                        faq=FaqFit(cache=FAQ_CACHE) if "faq" in methods and runs("faq", name) else None,
                                        history=bool(set(HISTORY_LABELS) & set(methods)))
    load_s = time.perf_counter() - t0
    cells = []
    for name, data in datasets.items():
        for goal in goals:
            for method in methods:
                if not runs(method, name):
                    continue
                # the same reps in every cell: coverage is the claim, and 200 reps resolve 0.95 to about ±0.03
                cells.append(make_cell(name, method, goal, reps, batch_size_for(data.spec.n_items)))
    t1 = time.perf_counter()
    last = [0.0]

    def progress(done: int, total: int, what: str) -> None:
        now = time.perf_counter()
        if now - last[0] > 20 or done == total:
            last[0] = now
            print(f"[efficiency] {done}/{total} chunks, {now - t1:.0f} s ({what})", file=sys.stderr, flush=True)

    fan_out = FanOut(use_ray=use_ray, ray_address=args.ray_address, chunk_reps=10 if quick else 25)
    rows = run_cells(datasets, cells, args.seed, fan_out=fan_out, record_errors=True, progress=progress)
    run_s = time.perf_counter() - t1
    summary = summarise(rows, baseline="uniform")
    result_name = "efficiency" if args.estimand == "mean-of-means" else "efficiency_bank_mean"
    previous = read_result(result_name, quick) if args.append else None
    if previous:
        # methods named in --ratio-only ran only so that ratios compare the same reps (same models,
        # same count); their cells are not merged, and the merged cells keep their in-run ratios
        ratio_only = set(args.ratio_only.split(",")) if args.ratio_only else set()
        new = [c for c in summary if c["method"] not in ratio_only]
        for c in new:
            c["note"] = f"{c['reps']} reps; ratios against the baselines re-run on the same reps"
        rerun = {(c["dataset"], c["method"], c["goal"]) for c in new}
        kept = [c for c in previous.get("cells", []) if (c["dataset"], c["method"], c["goal"]) not in rerun]
        order = {n: i for i, n in enumerate(METHODS)}
        summary = sorted(kept + new, key=lambda c: (c["dataset"], c["goal"], order.get(c["method"], 99)))
        payload_extra = {"first_run_meta": previous.get("first_run_meta") or previous.get("meta"),
                         "first_run_wall_s": previous.get("first_run_wall_s") or previous.get("wall_s"),
                         "appended": previous.get("appended", []) + [" ".join(sys.argv[1:])]}
        # keep what earlier faq cells were run with (setup, factor fits) for datasets not rerun now
        for name, notes in (previous.get("datasets") or {}).items():
            if "faq" in notes and name in datasets:
                datasets[name].notes.setdefault("faq", notes["faq"])
    else:
        payload_extra = {}
    faq_info = faq_setup(datasets, goals, quick) if faq_methods else None
    if previous and previous.get("faq"):
        faq_info = merge_faq_setup(previous["faq"], faq_info)
    payload = {
        "seed": args.seed,
        "reps_per_cell": reps,
        "goals": list(goals),
        "methods": list(methods),
        "estimand": ("bank mean-of-means over subsets (Arviv et al. 2026 eq. 1)" if args.estimand == "mean-of-means"
                     else "plain bank mean (every item 1/N; Cer-Eval's setting)") + ", confidence 0.95",
        "batch_size": "max(10, n_items // 100)",
        "ray": use_ray,
        "wall_s": {"load": load_s, "replay": run_s},
        # --append: notes of datasets not rerun now stay (their stored cells were made with them)
        "datasets": {**((previous or {}).get("datasets") or {}), **{name: d.notes for name, d in datasets.items()}},
        **({"faq": faq_info} if faq_info else {}),
        "cells": summary,
        **payload_extra,
    }
    path = write_result(result_name, payload, quick, seed=args.seed)
    bad = [c for c in summary if c.get("errors")]
    print(f"efficiency: {len(summary)} cells, {len(rows)} reps in {run_s:.0f} s -> {path}")
    for c in bad:
        print(f"  {c['dataset']}/{c['method']}/{c['goal']}: {c['errors']} reps raised "
              f"({c.get('first_error', '')})", file=sys.stderr)
    return 0


def faq_setup(datasets: dict, goals: tuple[str, ...], quick: bool) -> dict:
    """What the faq / faq-uniform cells ran with (recorded next to the cells)."""
    names = [n for n in datasets if not quick or n in QUICK_FAQ_DATASETS]
    return {
        "interval": "ci=anytime: " + FAQ_GUARANTEES["anytime"] + " (asymptotic, not exact)",
        "policy": "hybrid policy with the defaults tau=0.1, beta0=1, rho=gamma=0; draws with replacement",
        "planned_draws": {name: {g: faq_planned_draws(parse_goal(g), datasets[name].spec) for g in goals}
                          for name in names},
        "planned_draws_rule": "where the anytime CS is tuned to be tightest: the draws at which it would reach the "
                              "goal under the worst-case variance of uniform sampling, at most the draw cap",
        "faq_uniform": "the same estimator and interval on one constant item factor (prior N(0, 4) on the logit of "
                       "the overall accuracy): q_j = 0.9 w_j + 0.1/N (uniform within each sub-dataset; exactly 1/N, "
                       "and the plain sample mean, for the bank-mean estimand); the plug-in learns the overall "
                       "accuracy only",
        "faq_uniform_half": "(if run) zero item factors: the same q, a constant plug-in 1/2",
        "items": "items = model calls = distinct items scored (a re-drawn item's score is cached); mean_draws "
                 f"counts draws; a rep stops at {FAQ_MAX_DRAWS_PER_ITEM}·N draws if the goal is not met by then "
                 "and is then not 'reached'",
        "datasets": names,
    }


def merge_faq_setup(old: dict, new: dict | None) -> dict:
    """--append: the stored faq setup, updated with this run's datasets and goals."""
    if new is None:
        return old
    planned = {name: dict(goals) for name, goals in (old.get("planned_draws") or {}).items()}
    for name, goals in new["planned_draws"].items():
        planned.setdefault(name, {}).update(goals)
    return {**old, **new, "planned_draws": planned,
            "datasets": sorted(set(old.get("datasets") or []) | set(new["datasets"]))}


if __name__ == "__main__":
    sys.exit(main())
