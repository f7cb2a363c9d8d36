"""Ranking and selection on the bank target: cells used, family-wise error against the exact bank order,
tie groups, round time by look, and one run of all 1,989 openllm_tiny models through Prefect + Ray.

    python -m benchmarks ranking                 # the full set (about an hour on 2 busy cores)
    python -m benchmarks ranking --quick         # seconds: one rep (rank on helm_v023: 7 models; select on helm_mmlu), no pipeline
    python -m benchmarks ranking --skip-pipeline # everything but the pipeline run
    python -m benchmarks ranking --select-only   # only the selection cases, into the stored result
    python -m benchmarks ranking --epsilon-only --epsilons 0.05,0.1 --no-strict --epsilon-reps helm_mmlu=200
                                                 # only the epsilon cases (reps per bank), into the stored result

Writes ``benchmarks/results/ranking.json``:

* ``rank``: per (dataset, margin) the bank-target ranking replayed over random item orders
  (:func:`certeval.backtests.comparative.rank_backtest`): fraction of model x item cells scored,
  models leaving before the bank is exhausted, tie groups, family-wise error rate of the ordering
  statements against the exact bank differences (Wilson 95% upper bound beside it);
* ``select``: best-arm (top-K within epsilon) identification, cells and error rate;
* ``epsilon`` (``--epsilon-only``): ``rank --epsilon E`` beside strict verdicts at margin E on the same item orders,
  cells, tie groups and family-wise error of the statements made, on four leaderboards;
* ``round_time``: seconds per look of the incremental bank and distribution estimators, and of the
  distribution target's former replay of every look from look 1 (reference), on openllm_arc's 320 models;
* ``pipeline``: ``certeval rank`` on all openllm_tiny models (replay actors, embedded Prefect, local Ray):
  wall time, peak memory of the process tree, fraction of cells, tie groups.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402

RANK_CASES = [("helm_mmlu", 0.02, 200), ("helm_mmlu", 0.1, 200), ("openllm_arc", 0.02, 20), ("openllm_tiny", 0.02, 1)]
SELECT_CASES = [("helm_mmlu", 1, 0.02, 200), ("helm_mmlu", 3, 0.02, 100), ("helm_mmlu", 5, 0.02, 100),
                ("helm_mmlu", 1, 0.0, 100), ("openllm_arc", 1, 0.02, 20), ("openllm_tiny", 1, 0.02, 2)]
QUICK_RANK = [("helm_v023", 0.02, 1)]  # --quick checks that the benchmark runs and writes its JSON (7 models: 4 s)
EPSILONS = (0.025, 0.05, 0.1)
EPSILON_CASES = [("helm_mmlu", 3), ("vlm_ocrbench", 1), ("vlm_hallusionbench", 1), ("openllm_arc", 1)]
QUICK_SELECT = [("helm_mmlu", 1, 0.02, 1)]


def wilson_upper(k: int, n: int, z: float = 1.959964) -> float:
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(centre + half)


def _load(dataset: str):
    """The bundled bank's matrix (every model), model names and the estimand's item weights."""
    from certeval.backtests.comparative import load_matrix

    matrix, models, spec = load_matrix(f"bundled:{dataset}")
    return matrix, models, spec.weights()


def _backtest(dataset: str, request: dict, reps: int, seed: int, looks_every: int):
    """The bank-target comparative backtest of ``dataset`` (every model) with ``request``'s rule."""
    from certeval.backtests.comparative import ComparativeBacktest, load_matrix
    from certeval.estimators.groups import GroupRequest

    matrix, models, spec = load_matrix(f"bundled:{dataset}")
    return ComparativeBacktest(matrix, tuple(models), spec, GroupRequest(labels=tuple(models), **request),
                               reps=reps, seed=seed, looks_every=looks_every)


def rank_case(dataset: str, margin: float, reps: int, seed: int, looks_every: int = 50) -> dict:
    from certeval.backtests.comparative import rank_backtest

    bt = _backtest(dataset, {"kind": "rank", "margin": margin}, reps, seed, looks_every)
    start = time.perf_counter()
    out = rank_backtest(bt)
    s = out["summary"]
    errors = int(round(s["family_wise_error_rate"] * reps))
    first = out["rankings"][0]
    return {"dataset": dataset, "models": s["models"], "pairs": s["pairs"], "items": s["n_items"], "margin": margin,
            "reps": reps, "looks_every": looks_every, "fraction_cells": s["fraction_used"],
            "models_leaving_early": s["models_leaving_early"], "tie_groups_mean": s["tie_groups_mean"],
            "tie_group_sizes_rep0": [len(g) for g in first["tie_groups"]],
            "fwer": s["family_wise_error_rate"], "fwer_wilson_upper": wilson_upper(errors, reps),
            "wall_s_per_rep": s["wall_s_per_rep"], "wall_s": time.perf_counter() - start}


def epsilon_case(dataset: str, epsilon: float, reps: int, seed: int, looks_every: int = 50,
                 strict: bool = True) -> dict:
    """``rank --epsilon`` replayed, beside strict verdicts at margin = epsilon on the same orders (the baseline;
    ``strict=False`` leaves it out). Family-wise error with its Wilson 95% upper bound."""
    from certeval.backtests.comparative import rank_backtest

    row: dict = {"dataset": dataset, "epsilon": epsilon, "reps": reps, "looks_every": looks_every}
    for name, request in (("epsilon", {"kind": "rank", "epsilon": epsilon}),
                          ("strict", {"kind": "rank", "margin": epsilon}))[:2 if strict else 1]:
        start = time.perf_counter()
        s = rank_backtest(_backtest(dataset, request, reps, seed, looks_every))["summary"]
        errors = int(round(s["family_wise_error_rate"] * reps))
        row.update({"models": s["models"], "items": s["n_items"], f"{name}_fraction_cells": s["fraction_used"],
                    f"{name}_tie_groups_mean": s["tie_groups_mean"], f"{name}_fwer": s["family_wise_error_rate"],
                    f"{name}_fwer_wilson_upper": wilson_upper(errors, reps),
                    f"{name}_kendall_tau": s["kendall_tau_mean"],
                    f"{name}_wall_s": round(time.perf_counter() - start, 1)})
        if name == "epsilon":
            row["epsilon_guarantee"] = s["guarantee"]
    if strict:
        row["cells_ratio_epsilon_to_strict"] = row["epsilon_fraction_cells"] / row["strict_fraction_cells"]
    return row


def neighbour_case(dataset: str, epsilon: float, reps: int, seed: int, looks_every: int = 50) -> dict:
    """``rank --epsilon`` replayed with the neighbour construction (the default) and the all-pairs one
    (``--ranking all-pairs``) on the same orders (rep r's order depends only on the dataset, the models and r):
    cells, tie groups, Kendall τ, family-wise error (Wilson 95% upper), wall and CPU seconds of each."""
    from certeval.backtests.comparative import rank_backtest

    row: dict = {"dataset": dataset, "epsilon": epsilon, "reps": reps, "looks_every": looks_every}
    for name, construction in (("neighbours", "neighbours"), ("all_pairs", "all-pairs")):
        start, cpu = time.perf_counter(), time.process_time()
        s = rank_backtest(_backtest(dataset, {"kind": "rank", "epsilon": epsilon, "ranking": construction}, reps,
                                    seed, looks_every))["summary"]
        errors = int(round(s["family_wise_error_rate"] * reps))
        row.update({"models": s["models"], "items": s["n_items"], f"{name}_fraction_cells": s["fraction_used"],
                    f"{name}_tie_groups_mean": s["tie_groups_mean"], f"{name}_fwer": s["family_wise_error_rate"],
                    f"{name}_fwer_wilson_upper": wilson_upper(errors, reps),
                    f"{name}_kendall_tau": s["kendall_tau_mean"], f"{name}_wall_s": round(time.perf_counter() - start, 1),
                    f"{name}_cpu_s": round(time.process_time() - cpu, 1), f"{name}_guarantee": s["guarantee"]})
    row["cells_ratio_neighbours_to_all_pairs"] = row["neighbours_fraction_cells"] / row["all_pairs_fraction_cells"]
    return row


NEIGHBOUR_CASES = [("helm_mmlu", 20), ("vlm_ocrbench", 10), ("vlm_hallusionbench", 10), ("openllm_arc", 5)]


def select_case(dataset: str, top: int, eps: float, reps: int, seed: int) -> dict:
    """``select`` replayed; where the rule reads pair CSs (top-K > 1 or ε = 0), beside the same orders with every
    pair at α/(2P) (the level before the union bound counted only the pairs of a top-K set)."""
    import certeval.estimators.bank.selection as bs
    from certeval.backtests.comparative import select_backtest

    def run() -> dict:
        bt = _backtest(dataset, {"kind": "select", "threshold": 0.0, "halfwidth": eps, "top": top}, reps, seed, 25)
        return select_backtest(bt)["summary"]

    start = time.perf_counter()
    s = run()
    errors = int(round(s["error_rate"] * reps))
    row = {"dataset": dataset, "models": s["models"], "items": s["n_items"], "top": top, "epsilon": eps, "reps": reps,
           "fraction_cells": s["fraction_used"], "error_rate": s["error_rate"],
           "error_wilson_upper": wilson_upper(errors, reps), "wall_s": time.perf_counter() - start}
    if top > 1 or eps == 0:
        saved = bs.top_pairs
        bs.top_pairs = lambda m, k: m * (m - 1) // 2  # the baseline: Bonferroni over all P pairs
        try:
            row["fraction_cells_pairs_at_all_p"] = run()["fraction_used"]
        finally:
            bs.top_pairs = saved
    return row


def round_time(dataset: str = "openllm_arc", batch: int = 25, looks: int = 20, seed: int = 0) -> dict:
    """Seconds per look of a paired run's group estimator: the incremental bank estimator (update + result),
    the incremental distribution estimator (:class:`~certeval.estimators.distribution.ranking.SequentialRanking`, update
    + result), and — for reference — ``rank_models`` over every look so far (what a paired run on the
    distribution target recomputed each round before)."""
    from certeval.estimators.bank.ranking import BankRanking
    from certeval.estimators.bank.wor_streams import weighted_order
    from certeval.estimators.distribution.ranking import RankingOptions, SequentialRanking, rank_models

    matrix, models, weights = _load(dataset)
    n = matrix.shape[1]
    order = weighted_order(weights, np.random.default_rng(seed))  # the paired run's order: ∝ weight
    x, w = matrix[:, order], weights[order]
    bank = BankRanking(models, margin=0.02).start(w)
    dist = SequentialRanking(models, n_total=n, options=RankingOptions(margin=0.02))
    bank_s, dist_s, replay_s = [], [], []
    for k in range(looks):
        cols = np.arange(k * batch, (k + 1) * batch)
        t = time.perf_counter()
        bank.update(cols, np.where(bank.model_open[:, None], x[:, cols], np.nan))
        bank.result()
        bank_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        dist.update(x[:, cols])
        dist_s.append(time.perf_counter() - t)
        if k in (0, looks - 1):
            t = time.perf_counter()
            rank_models(x[:, :(k + 1) * batch], models, [batch * (j + 1) for j in range(k + 1)],
                        options=RankingOptions(margin=0.02))
            replay_s.append(time.perf_counter() - t)
    return {"dataset": dataset, "models": len(models), "batch": batch, "bank_s_per_look": bank_s,
            "bank_look1_s": bank_s[0], "bank_look20_s": bank_s[-1], "distribution_s_per_look": dist_s,
            "distribution_look1_s": dist_s[0], "distribution_look20_s": dist_s[-1],
            "distribution_replay_look1_s": replay_s[0], "distribution_replay_look20_s": replay_s[-1]}


def pipeline_run(dataset: str = "openllm_tiny", margin: float = 0.02, timeout: int = 2400) -> dict:
    """``certeval rank`` over every model of the dataset, in a child process (peak RSS of children)."""
    from certeval.inputs.banks import load_scores

    models = sorted(load_scores(f"bundled:{dataset}")["model"].unique())
    out_dir = tempfile.mkdtemp(prefix="certeval-rank-bench-")
    cmd = [sys.executable, "-m", "certeval", "rank", "--json", "--margin", str(margin), "--output", out_dir,
           "--run-id", "rank-all", "--batch-size", "50"]
    for m in models:
        cmd += ["--model", f"replay:bundled:{dataset}#{m}"]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=out_dir)
    except subprocess.TimeoutExpired:
        return {"dataset": dataset, "models": len(models), "error": f"timed out after {timeout} s"}
    wall = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if proc.returncode not in (0, 1):
        return {"dataset": dataset, "error": proc.stderr[-2000:], "returncode": proc.returncode, "wall_s": wall}
    res = json.loads(proc.stdout)
    ranking = res["ranking"]
    checked = pipeline_statement_errors(res["run_folder"], dataset, margin)
    return {"dataset": dataset, "models": len(models), "margin": margin, "returncode": proc.returncode,
            "wall_s": wall, "pipeline_wall_s": res["pipeline"]["wall_s"], "rounds": res["rounds"],
            "peak_rss_mb_largest_child": peak_kb / 1024, "fraction_cells": ranking["fraction_used"],
            "tie_groups": len(ranking["tie_groups"]), "n_pairs": ranking["n_pairs"],
            "n_pairs_decided": ranking["n_pairs_decided"], "target": res["target"], "run_folder": res["run_folder"],
            **checked}


def pipeline_statement_errors(run_folder: str, dataset: str = "openllm_tiny", margin: float = 0.02) -> dict:
    """Ordering statements of a stored rank run (pairs.parquet or results.json pairs) against the exact
    bank differences: the family-wise check of that one run."""
    import pandas as pd

    from certeval.backtests.paired_rows import _statement_errors
    from certeval.estimators.distribution.comparison import VERDICTS

    matrix, models, weights = _load(dataset)
    exact = dict(zip(models, matrix @ weights))
    path = os.path.join(run_folder, "pairs.parquet")
    if os.path.exists(path):
        pairs = pd.read_parquet(path)
    else:
        with open(os.path.join(run_folder, "results.json")) as fh:
            pairs = pd.DataFrame(json.load(fh)["pairs"])
    diff = pairs["model_a"].map(exact).to_numpy() - pairs["model_b"].map(exact).to_numpy()
    code = pairs["verdict"].map({v: k for k, v in enumerate(VERDICTS)}).to_numpy()
    wrong = _statement_errors(code, diff, margin)
    n_total = int(matrix.shape[1])
    return {"wrong_statements": int(wrong.sum()), "pairs_decided_before_exhaustion":
            int((pairs["n_items"] < n_total).sum())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks ranking")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip-pipeline", action="store_true")
    p.add_argument("--pipeline-only", metavar="FILE", default=None,
                   help="only the pipeline run, its JSON written to FILE (run it apart on a busy machine)")
    p.add_argument("--pipeline-from", metavar="FILE", default=None,
                   help="take the pipeline measurement from a --pipeline-only FILE instead of running it")
    p.add_argument("--merge", action="store_true", help="with --pipeline-from: only add it to the stored result")
    p.add_argument("--round-time-only", action="store_true", help="only re-measure round_time, into the stored result")
    p.add_argument("--select-only", action="store_true",
                   help="only the selection cases, into the stored result")
    p.add_argument("--neighbours-only", action="store_true",
                   help="only the neighbour vs all-pairs epsilon-rankings on the same orders (epsilon 0.05), into the "
                        "stored result's epsilon_neighbours; --epsilon-reps sets the reps per bank")
    p.add_argument("--datasets", default=None,
                   help="with --neighbours-only: only these banks (comma-separated); the others' stored rows stay")
    p.add_argument("--epsilon-only", action="store_true",
                   help="only the epsilon-ranking cases (rank --epsilon beside strict verdicts), into the stored result")
    p.add_argument("--epsilon-reps", metavar="DATASET=N", action="append", default=[],
                   help="with --epsilon-only: reps for DATASET (repeatable; default: EPSILON_CASES)")
    p.add_argument("--epsilons", default=None,
                   help="with --epsilon-only: comma-separated epsilons (default 0.025,0.05,0.1)")
    p.add_argument("--no-strict", action="store_true", help="with --epsilon-only: skip the strict-verdict baseline")
    p.add_argument("--output-name", default="ranking", help="with --epsilon-only: the result's name (default ranking)")
    args = p.parse_args(argv)
    if args.select_only:
        from benchmarks._meta import read_result

        stored = read_result("ranking", args.quick) or {}
        stored.pop("meta", None)
        stored["select"] = [select_case(d, top, eps, reps, args.seed)
                            for d, top, eps, reps in (QUICK_SELECT if args.quick else SELECT_CASES)]
        print(f"wrote {write_result('ranking', stored, args.quick, seed=args.seed)}")
        return 0
    if args.neighbours_only:
        from benchmarks._meta import read_result

        stored = read_result("ranking", args.quick) or {}
        stored.pop("meta", None)
        reps_for = dict(item.split("=") for item in args.epsilon_reps)
        cases = [("helm_mmlu", 1)] if args.quick else [(d, int(reps_for.get(d, r))) for d, r in NEIGHBOUR_CASES]
        only = set(args.datasets.split(",")) if args.datasets else None
        epsilons = (0.05,) if args.epsilons is None else tuple(float(e) for e in args.epsilons.split(","))
        # with --datasets the other banks' stored rows stay
        stored["epsilon_neighbours"] = [r for r in stored.get("epsilon_neighbours", [])
                                        if only is not None and r["dataset"] not in only]
        cases = [c for c in cases if only is None or c[0] in only]
        for dataset, reps in cases:
            for eps in epsilons:
                stored["epsilon_neighbours"].append(neighbour_case(dataset, eps, reps, args.seed))
                print(json.dumps({k: v for k, v in stored["epsilon_neighbours"][-1].items()
                                  if not k.endswith("guarantee")}), flush=True)
                write_result("ranking", stored, args.quick, seed=args.seed)  # each case as it lands
        print(f"wrote {write_result('ranking', stored, args.quick, seed=args.seed)}")
        return 0
    if args.epsilon_only:
        from benchmarks._meta import read_result

        stored = read_result(args.output_name, args.quick) or {}
        stored.pop("meta", None)
        cases = [("helm_mmlu", 1)] if args.quick else EPSILON_CASES
        reps_for = dict(item.split("=") for item in args.epsilon_reps)
        cases = [(d, int(reps_for.get(d, r))) for d, r in cases]
        epsilons = EPSILONS if args.epsilons is None else tuple(float(e) for e in args.epsilons.split(","))
        stored["epsilon"] = []
        for dataset, reps in cases:
            for eps in epsilons:
                stored["epsilon"].append(epsilon_case(dataset, eps, reps, args.seed, strict=not args.no_strict))
                print(json.dumps(stored["epsilon"][-1]), flush=True)
        print(f"wrote {write_result(args.output_name, stored, args.quick, seed=args.seed)}")
        return 0
    if args.round_time_only:
        from benchmarks._meta import read_result

        stored = read_result("ranking", args.quick)
        if stored is None:
            raise SystemExit("no stored ranking result to add round_time to; run without --round-time-only")
        stored.pop("meta", None)
        stored["round_time"] = round_time(looks=3 if args.quick else 20)
        print(f"wrote {write_result('ranking', stored, args.quick, seed=args.seed)}")
        return 0
    if args.pipeline_from and args.merge:  # add a pipeline measurement to the stored result
        from benchmarks._meta import read_result

        stored = read_result("ranking", args.quick)
        if stored is None:
            raise SystemExit("no stored ranking result to merge into; run without --merge")
        stored.pop("meta", None)
        with open(args.pipeline_from) as fh:
            stored["pipeline"] = json.load(fh)
        print(f"wrote {write_result('ranking', stored, args.quick, seed=args.seed)}")
        return 0
    if args.pipeline_only:
        with open(args.pipeline_only, "w") as fh:
            json.dump(pipeline_run(), fh, indent=1)
        return 0
    payload: dict = {"seed": args.seed, "target": "bank", "alpha": 0.05}
    payload["rank"] = [rank_case(d, m, r, args.seed) for d, m, r in (QUICK_RANK if args.quick else RANK_CASES)]
    payload["select"] = [select_case(d, k, e, r, args.seed)
                         for d, k, e, r in (QUICK_SELECT if args.quick else SELECT_CASES)]
    payload["round_time"] = round_time(looks=3 if args.quick else 20)
    if args.quick:  # a smoke of the ε-rankings' two constructions (the full rows: --epsilon-only, --neighbours-only)
        payload["epsilon_neighbours"] = [neighbour_case("helm_mmlu", 0.05, 1, args.seed)]
    if args.pipeline_from:
        with open(args.pipeline_from) as fh:
            payload["pipeline"] = json.load(fh)
    elif not (args.quick or args.skip_pipeline):
        payload["pipeline"] = pipeline_run()
    path = write_result("ranking", payload, args.quick, seed=args.seed)
    print(json.dumps({k: v for k, v in payload.items() if k != "round_time"}, indent=1, default=str)[:4000])
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
