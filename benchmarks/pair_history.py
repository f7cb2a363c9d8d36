"""``rank --history`` vectorised over the pairs: cells with and without history, and one run at 188 models.

* ``cells``: per bank (helm_mmlu, vlm_ocrbench) the models are split at random in half; the history half fits
  one factor model (:func:`~certeval.estimators.history.prior.fit_history_prior`), the other half is ranked with
  ε-statements (ε = 0.05, alpha = 0.05) on random item orders drawn ∝ weight, looks of 50 items, three ways on
  the same orders: :class:`~certeval.estimators.history.ranking.HistoryRanking`, the plain
  :class:`~certeval.estimators.bank.ranking.BankRanking` as ``rank`` builds it (betting CSs up to tens of models,
  empirical-Bernstein beyond), and the plain ranking with betting CSs forced (the history ranking's
  construction, so the difference is the history alone). Fraction of model × item cells scored, wall time,
  whether every decided pair's interval covered its exact bank difference, and the certified ε-listings the exact
  differences contradict (reps with one: the family-wise error, with its Wilson 95% upper bound). ``--epsilons``,
  ``--looks`` (items, or below 1 a fraction of the bank: 0.02 is the fixed-n oracle's own grid) and ``--datasets``
  choose the cases; ``--name`` the result file.
* ``scale``: ``HistoryRanking`` on all 188 vlm_ocrbench models, each model's prior fitted on the 187 others (what
  ``rank --history bundled:vlm_ocrbench`` of every model fits: the model itself left out), in a subprocess:
  peak resident memory (``ru_maxrss``), wall time, cells; and the plain ranking on the same order.

    python -m benchmarks pair_history           # 3 reps per bank, and the 188-model run (about 15 minutes)
    python -m benchmarks pair_history --quick   # helm_mmlu, 1 rep, no scale run
    python -m benchmarks.pair_history --datasets helm_mmlu --reps 200 --epsilons 0.05,0.1 --looks 0.02,50 \
        --skip-scale --name pair_history_helm_mmlu    # issue 25's table (docs/ranking.md)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402

EPSILON, ALPHA, LOOK = 0.05, 0.05, 50  # EPSILON: the default of --epsilons
DATASETS = ("helm_mmlu", "vlm_ocrbench")


def _bank(name: str):
    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

    frame = load_scores(f"bundled:{name}")
    models = sorted(frame["model"].unique())
    bank = bank_from_scores(frame)
    return models, score_matrix(frame, models, bank), bank.spec()


def half_split(models: list, x: np.ndarray, w: np.ndarray, rng: np.random.Generator):
    """One rep: the models split at random in half, the history half's factor model, the other half's names and
    scores, and an item order drawn ∝ weight: (names, scores, prior, order)."""
    from certeval.estimators.bank.wor_streams import weighted_order
    from certeval.estimators.history.prior import fit_history_prior

    perm = rng.permutation(len(models))
    hist, ranked = np.sort(perm[: len(models) // 2]), np.sort(perm[len(models) // 2:])
    prior = fit_history_prior(x[hist])
    return [models[k] for k in ranked], x[ranked], prior, weighted_order(w, rng)


def look_size(look: float, n_items: int) -> int:
    """Items per look: ``look`` itself, or below 1 that fraction of the bank (0.02: the oracle's own 2% grid)."""
    return max(1, int(round(look * n_items))) if look < 1 else int(look)


def _replay(rank, x: np.ndarray, order: np.ndarray, w: np.ndarray, look: int = LOOK) -> dict:
    from certeval.backtests.paired_rows import epsilon_errors

    t0 = time.perf_counter()
    for s in range(0, order.size, look):
        rank.update(order[s:s + look], x[:, order[s:s + look]])
        if not rank.model_open.any():
            break
    seconds = time.perf_counter() - t0
    mu = x @ w
    delta = mu[rank.pa] - mu[rank.pb]
    decided = rank.verdict != 0
    covered = bool(np.all((rank.lower[decided] <= delta[decided] + 1e-9)
                          & (delta[decided] <= rank.upper[decided] + 1e-9)))
    return {"fraction_cells": float(rank.model_used.sum() / (x.shape[0] * x.shape[1])), "seconds": seconds,
            "all_decided_intervals_cover": covered,
            "wrong_listings": epsilon_errors(rank.result(), rank.names, mu)}  # listings the exact means contradict


def cells_case(name: str, reps: int, seed: int, epsilon: float = EPSILON, look: float = LOOK) -> dict:
    import certeval.estimators.bank.wor_streams as ws
    from certeval.estimators.bank.ranking import BankRanking
    from certeval.estimators.history.ranking import HistoryRanking

    models, x, spec = _bank(name)
    w = spec.weights()
    look = look_size(look, x.shape[1])
    rng = np.random.default_rng(seed)
    rows = []
    for rep in range(reps):
        names, xr, prior, order = half_split(models, x, w, rng)
        row = {"rep": rep, "ranked_models": len(names), "history_models": len(models) - len(names)}
        row["history"] = _replay(HistoryRanking(names, [prior] * len(names), spec, alpha=ALPHA, epsilon=epsilon),
                                 xr, order, w, look)
        row["plain"] = _replay(BankRanking(names, alpha=ALPHA, epsilon=epsilon).start(w), xr, order, w, look)
        saved = ws.BETTING_CELLS
        ws.BETTING_CELLS = ws.CONTROLLED_BETTING_CELLS  # the history ranking's construction, without history
        try:
            row["plain_betting"] = _replay(BankRanking(names, alpha=ALPHA, epsilon=epsilon).start(w), xr, order, w,
                                           look)
        finally:
            ws.BETTING_CELLS = saved
        rows.append(row)
        print(f"[pair_history] {name} eps {epsilon} look {look} rep {rep}: " + ", ".join(
            f"{k} {row[k]['fraction_cells']:.3f} ({row[k]['seconds']:.1f}s)" for k in ("history", "plain", "plain_betting")),
            file=sys.stderr, flush=True)
    from benchmarks.ranking import wilson_upper

    mean = {k: float(np.mean([r[k]["fraction_cells"] for r in rows])) for k in ("history", "plain", "plain_betting")}
    wrong = {k: sum(r[k]["wrong_listings"] > 0 for r in rows) for k in mean}
    return {"dataset": name, "models": len(models), "items": int(x.shape[1]), "epsilon": epsilon, "alpha": ALPHA,
            "look_items": look, "reps": reps, "mean_fraction_cells": mean,
            "reps_with_a_wrong_listing": wrong,
            "family_wise_error_wilson_upper": {k: wilson_upper(v, reps) for k, v in wrong.items()},
            "saving_vs_plain": 1.0 - mean["history"] / mean["plain"],
            "saving_vs_plain_betting": 1.0 - mean["history"] / mean["plain_betting"],
            "all_covered": all(r[k]["all_decided_intervals_cover"] for r in rows for k in mean), "rows": rows}


def scale_child(seed: int, plain: bool) -> dict:
    """One run on every vlm_ocrbench model (in its own process, for its peak memory)."""
    from certeval.estimators.bank.ranking import BankRanking
    from certeval.estimators.bank.wor_streams import weighted_order
    from certeval.estimators.history.prior import fit_history_prior
    from certeval.estimators.history.ranking import HistoryRanking

    models, x, spec = _bank("vlm_ocrbench")
    w = spec.weights()
    order = weighted_order(w, np.random.default_rng(seed))
    t0 = time.perf_counter()
    if plain:
        rank = BankRanking(models, alpha=ALPHA, epsilon=EPSILON).start(w)
        fit_s = 0.0
    else:
        keep = np.ones(len(models), dtype=bool)
        priors = []
        for k in range(len(models)):  # leave the model out of its own history
            keep[k] = False
            priors.append(fit_history_prior(x[keep]))
            keep[k] = True
        fit_s = time.perf_counter() - t0
        rank = HistoryRanking(models, priors, spec, alpha=ALPHA, epsilon=EPSILON)
    out = _replay(rank, x, order, w)
    out.update({"models": len(models), "pairs": len(rank.pa), "items": int(x.shape[1]),
                "construction": rank.pairs.CONSTRUCTION, "prior_fit_seconds": fit_s,
                "wall_seconds": time.perf_counter() - t0,
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})
    return out


def scale_case(seed: int) -> dict:
    out = {"history_source": "each model's prior fitted on the other 187 vlm_ocrbench models (leave-one-out, as "
                             "rank --history bundled:vlm_ocrbench fits it); NOT held-out models",
           "epsilon": EPSILON, "alpha": ALPHA, "look_items": LOOK, "seed": seed}
    for label, flag in (("history", []), ("plain", ["--plain"])):
        cmd = [sys.executable, "-m", "benchmarks.pair_history", "--scale-child", "--seed", str(seed), *flag]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        out[label] = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"[pair_history] 188 models {label}: {out[label]}", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks pair_history", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--reps", type=int, default=3, help="item orders per bank (the first bank's count)")
    p.add_argument("--reps-others", type=int, default=None, help="item orders on the banks after the first")
    p.add_argument("--epsilons", default=str(EPSILON), help="comma-separated ε values (default %(default)s)")
    p.add_argument("--looks", default=str(LOOK),
                   help="comma-separated items per look; a value below 1 is a fraction of the bank (default %(default)s)")
    p.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated banks (default %(default)s)")
    p.add_argument("--name", default="pair_history", help="result file name under benchmarks/results/")
    p.add_argument("--skip-scale", action="store_true")
    p.add_argument("--scale-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.scale_child:
        print(json.dumps(scale_child(args.seed, args.plain)))
        return 0
    epsilons = [float(v) for v in args.epsilons.split(",")]
    looks = [float(v) for v in args.looks.split(",")]
    banks = ("helm_mmlu",) if args.quick else tuple(args.datasets.split(","))
    cases = [cells_case(name, 1 if args.quick else (args.reps if k == 0 else (args.reps_others or args.reps)),
                        args.seed, eps, look)
             for k, name in enumerate(banks) for look in looks for eps in epsilons]
    result = {"cells": cases}
    if not (args.quick or args.skip_scale):
        result["scale"] = scale_case(args.seed)
    path = write_result(args.name, result, args.quick)
    print(f"pair_history -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
