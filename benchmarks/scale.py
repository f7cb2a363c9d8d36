"""Scale: rank many models of ``bundled:openllm_tiny``, and select the best of a 10,000 × 10,000 synthetic
table, through the Prefect + Ray pipeline on 2 cores.

For each model count M the ``rank`` flow (certeval.flows.pipeline.rank_flow) runs on
``replay:bundled:openllm_tiny#<model>`` specs (the first M models by name; M = 1,989 is
all of them) in a fresh process. The synthetic run is the ``select`` flow (best model within
ε = 0.02, bank target) over ``replay:synthetic:10000x10000:2026#m<k>`` — 10⁸ cells generated on demand
from the location (:mod:`certeval.inputs.synthetic`), never stored; it checks the model selected against the
exact bank means. (A *ranking* of 10,000 models is out of reach here: its all-pairs confidence sequences
hold 5·10⁷ pairs — docs/ranking.md.) The wall time is split by timing the bodies of the
pipeline's steps (``Run.embed/restore/select/infer/update/decide/store_round/compact_cache/results``,
patched with timers in this process only) and Ray start-up:

* controller = embed + restore + select + update + decide (statistics), storage = load_bank +
  store_round + compact_cache + results (reads and writes of the run folder and score caches),
* ray = start-models + infer (replay inference itself is microseconds per item, so infer is
  Ray round trips and actor scheduling), stop = stop-models,
* prefect = wall − all of the above (flow/task orchestration). The runs share one ``prefect server
  start`` on 127.0.0.1, up before any timing as a team's server is (``--embedded-prefect``: each run
  starts Prefect's embedded server, and that start-up counts as Prefect).

The reference point is the same ranking computed in-process on the score matrix
(:func:`certeval.estimators.distribution.ranking.rank_models` at the same looks): its time is what the
statistics cost without any orchestration.

Replay models of one file share ``replicas`` actors, so M = 1,989 runs in one Ray actor
(``--max-items`` caps the large counts if wanted; ``--large-batch`` sets their round size).

    python -m benchmarks scale                  # M = 10, 30, 1989 and the synthetic select, 1 node and 3 nodes
    python -m benchmarks scale --sizes 1989     # the 1,989-model ranking only, 1 vs 3 nodes
    python -m benchmarks scale --quick          # M = 4, 1 node

ε-rankings at leaderboard scale (``epsilon_ranking`` in the JSON; ``--epsilon-only`` runs just these): the
neighbour ε-ranking (:class:`certeval.estimators.bank.neighbour_ranking.NeighbourRanking`, ε = 0.05, α = 0.05) of
1,000 / 2,000 / 10,000 synthetic models × 10,000 items (:mod:`certeval.inputs.synthetic`'s Rasch table, items correlated
through their difficulty; rows generated as 0/1 bytes in the child, 10⁸ cells = 100 MB) fed looks of
``--epsilon-look`` items of one uniform order, in-process as the backtest engine feeds them; and
``certeval backtest rank --scores bundled:openllm_tiny --epsilon 0.05 --reps 1`` (1,989 models, the
product's own path; the stored numbers were measured with its older spelling ``--goal rank:0 --epsilon 0.05``, whose
rep drew its order from another seed rule). Each in a fresh process: wall, CPU seconds (the process's own), peak RSS (ru_maxrss, the
score table included), fraction of cells, pairs opened, tie groups, Kendall τ, and wrong listings against the
exact bank order (pairs in two groups listed more than ε the wrong way round). ``--quick``: 60 × 600 only.
``spread:MxN:W`` sources (``--epsilon-sources``) are Rasch boards whose expected means are evenly spaced over a
width W: M and W grown together keep the density of the board fixed (the time should then grow about as M).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from benchmarks._meta import write_result  # noqa: E402

SIZES = (10, 30, 1989)
# Replay models of one scores file share ``replicas`` Ray actors (certeval.hosting.pool.group_models),
# each holding the table once as a dense matrix (8 MB for openllm_tiny), so memory no longer grows
# with the model count. Ranking M models compares M(M-1)/2 pairs (1,977,066 at M = 1,989) on the
# Gram-matrix path of certeval.estimators.distribution.ranking.
DATASET = "openllm_tiny"


EPS_SIZES = ("synthetic:1000x10000:2026", "synthetic:2000x10000:2026", "synthetic:10000x10000:2026",
             "bundled:openllm_tiny")
EPS_QUICK = ("synthetic:60x600:2026",)  # --quick: the child runs (a board of 60 models)
EPS_EPSILON, EPS_ALPHA = 0.05, 0.05

SYNTHETIC = "synthetic:10000x10000:2026"  # certeval.inputs.synthetic: a Rasch table generated on demand, never stored
SYNTHETIC_EPSILON = 0.02


def _child(m: int, batch: int, seed: int, out_json: str, max_items: int | None = None,
           ray_address: str | None = None, replicas: int = 1, location: str | None = None) -> None:
    """Run the rank flow for the first ``m`` models of openllm_tiny (or, with a ``synthetic:`` ``location``,
    the select flow — best model within SYNTHETIC_EPSILON — over its first ``m`` models) with step timers;
    write timings to ``out_json``."""
    from certeval.runtime.envsetup import prepare_env

    prepare_env()
    import numpy as np

    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix
    from certeval.runs import run as run_mod
    from certeval.runs import steps as steps_mod

    timers: dict[str, float] = {}

    def timed(name, fn):
        def wrapper(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                timers[name] = timers.get(name, 0.0) + time.perf_counter() - t
        return wrapper

    for name in ("embed", "restore", "select", "infer", "update", "decide", "store_round", "compact_cache", "results"):
        setattr(run_mod.Run, name, timed(name, getattr(run_mod.Run, name)))
    for name in ("start_models", "stop_models", "load_bank"):
        task = getattr(steps_mod, name)
        task.fn = timed(name, task.fn)

    from certeval.flows.pipeline import rank_flow, select_flow
    from certeval.requests import request_for
    from certeval.runs.plan import claim_run, make_plan

    synthetic = location is not None
    if synthetic:
        from certeval.inputs.synthetic import synthetic_scores

        models = list(synthetic_scores(location).model_names[:m])
        specs = [f"replay:{location}#{x}" for x in models]
    else:
        frame = load_scores(f"bundled:{DATASET}")
        models = sorted(frame["model"].unique())[:m]
        specs = [f"replay:bundled:{DATASET}#{x}" for x in models]
    out_dir = tempfile.mkdtemp(prefix="certeval-scale-")
    t0 = time.perf_counter()
    extra = dict(top=1, halfwidth=SYNTHETIC_EPSILON) if synthetic else {}
    plan, prepared = make_plan(request_for(
        "select" if synthetic else "rank", models=specs, output=out_dir, run_id=f"scale-{m}", batch_size=batch,
        seed=seed, max_items=max_items, ray_address=ray_address, replicas=replicas, **extra))
    plan_s = time.perf_counter() - t0
    prepared = prepared.claimed(claim_run(plan))
    bank = prepared.bank
    t1 = time.perf_counter()
    results = (select_flow if synthetic else rank_flow)(plan, prepared=prepared)
    wall = time.perf_counter() - t1
    entries = results.get("models", [{}])
    rounds = max(1, int(np.ceil(max((e.get("n_scored") or 0) for e in entries) / batch)))
    placement = (results.get("pipeline") or {}).get("placement") or []
    rec = {"kind": "select" if synthetic else "rank", "source": location or f"bundled:{DATASET}",
           "n_models": m, "n_items": bank.n_items, "replicas": replicas,
           "actor_nodes": sorted({",".join(p["node_resources"]) for p in placement}), "batch": batch,
           "max_items": max_items, "wall_s": wall, "plan_s": plan_s, "steps_s": timers, "rounds": rounds,
           "cells_scored": int(sum(e.get("n_scored") or 0 for e in entries)),
           "items_used_max": max((e.get("n_scored") or 0) for e in entries), "reached": results.get("reached"),
           "run_folder": f"{out_dir}/scale-{m}"}
    rec["fraction_cells"] = rec["cells_scored"] / (m * bank.n_items)
    if synthetic:
        selection = results.get("selection") or {}
        truth = synthetic_scores(location).bank_means()[:m]
        chosen = [e["model"] for e in entries if e.get("selection_status") == "selected"]
        best = float(truth.max())
        rec.update(epsilon=SYNTHETIC_EPSILON, selected=chosen,
                   selected_within_epsilon=bool(chosen) and all(
                       truth[models.index(c)] >= best - SYNTHETIC_EPSILON for c in chosen),
                   selection_fraction_used=selection.get("fraction_used"))
    else:
        # reference: the same statistics in-process, at the looks the flow made
        bank = bank_from_scores(frame)
        matrix = score_matrix(frame, models, bank)
        looks = [min(batch * (k + 1), bank.n_items) for k in range(rounds)]
        from certeval.estimators.distribution.ranking import rank_models

        order = np.random.default_rng(seed).permutation(bank.n_items)
        codes = bank.spec().subset_codes()[order] if bank.subsets is not None else None
        t2 = time.perf_counter()
        rank_models(matrix[:, order], models, looks, subsets=codes,
                    n_subsets=None if codes is None else int(codes.max()) + 1)
        ranking = results.get("ranking") or {}
        rec.update(in_process_rank_s=time.perf_counter() - t2, n_pairs=ranking.get("n_pairs"),
                   n_pairs_decided=ranking.get("n_pairs_decided"),
                   models_stopped_before_cap=sum(1 for e in entries if (e.get("decision") or {}).get("rule") == "rank"),
                   n_tie_groups=len(ranking.get("tie_groups") or []))
    json.dump(rec, open(out_json, "w"))


def epsilon_rank_child(source: str, look: int, seed: int) -> dict:
    """One neighbour ε-ranking of ``source`` (``synthetic:MxN:seed`` in-process, ``bundled:NAME`` through
    ``certeval backtest``), measured in this process (call it in a fresh one for a clean peak RSS)."""
    import resource

    import numpy as np

    from certeval.backtests.paired_rows import epsilon_errors, kendall_tau

    t0, c0 = time.perf_counter(), time.process_time()
    rec: dict = {"source": source, "epsilon": EPS_EPSILON, "alpha": EPS_ALPHA, "look": look}
    if source.startswith("bundled:"):
        import contextlib
        import io

        from certeval.cli import main as cli_main

        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = cli_main(["backtest", "rank", "--scores", source, "--epsilon", str(EPS_EPSILON),
                           "--confidence", str(1 - EPS_ALPHA), "--reps", "1", "--batch-size", str(look),
                           "--seed", str(seed), "--json"])
        out = json.loads(buf.getvalue())
        summary, rep = out["summary"], out["rankings"][0]
        rec.update(path="certeval backtest (ComparativeBacktest -> PairedRounds -> NeighbourRanking)", rc=rc,
                   n_models=summary["models"], n_items=summary["n_items"], cells=summary["fraction_used"],
                   wrong_listings=rep["errors"], tie_groups=rep["n_tie_groups"], kendall_tau=rep["kendall_tau"],
                   construction=summary.get("construction"), guarantee=summary["guarantee"])
    else:
        from certeval.estimators.bank.neighbour_ranking import NeighbourRanking

        x = spread_board(source) if source.startswith("spread:") else synthetic_board(source)
        m, n = x.shape
        exact = x.mean(axis=1)
        names = [f"m{k:05d}" for k in range(m)]
        rec["generate_s"] = time.perf_counter() - t0
        order = np.random.default_rng(seed).permutation(n)
        rank = NeighbourRanking(names, alpha=EPS_ALPHA, epsilon=EPS_EPSILON).start(np.full(n, 1.0 / n))
        t1, c1 = time.perf_counter(), time.process_time()
        for start in range(0, n, look):
            idx = order[start:start + look]
            rank.update(idx, x[:, idx].astype(float))
            if not rank.model_open.any():
                break
        res = rank.result()
        rec.update(path="in-process: NeighbourRanking fed looks of the table", n_models=m, n_items=n,
                   rank_s=time.perf_counter() - t1, rank_cpu_s=time.process_time() - c1, cells=res.fraction_used,
                   wrong_listings=epsilon_errors(res, names, exact), tie_groups=len(res.tie_groups),
                   kendall_tau=kendall_tau(res, names, exact), pairs_opened=rank.n_opened,
                   pairs_total=rank.n_pairs, replayed_pair_items=rank.replayed_pair_items,
                   pair_tests=rank.pair_tests, guarantee=rank.guarantee())
    rec["wall_s"] = time.perf_counter() - t0
    rec["cpu_s"] = time.process_time() - c0
    rec["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    try:
        rec["load_avg"] = list(os.getloadavg())
    except OSError:
        pass
    return rec


def synthetic_board(source: str):
    """The ``synthetic:MxN:seed`` table as 0/1 bytes (rows generated one at a time)."""
    import numpy as np

    from certeval.inputs.synthetic import SyntheticScores

    table = SyntheticScores.parse(source)
    x = np.empty((table.n_models, table.n_items), dtype=np.uint8)
    for k in range(table.n_models):
        x[k] = table.row(k)
    return x


def spread_board(source: str):
    """``spread:MxN:W[:seed]``: a Rasch board (difficulties N(0, 1), as :mod:`certeval.inputs.synthetic`) whose models'
    expected means are evenly spaced over [0.5 − W/2, 0.5 + W/2] — a board whose density M/W stays fixed when M and
    W grow together — as 0/1 bytes."""
    import numpy as np

    body = source.split(":", 1)[1].split(":")
    m, n = (int(v) for v in body[0].split("x"))
    width, seed = float(body[1]), int(body[2]) if len(body) > 2 else 0
    rng = np.random.default_rng([seed, 11])
    b = rng.normal(0.0, 1.0, n)
    target = np.linspace(0.5 - width / 2, 0.5 + width / 2, m)
    lo, hi = np.full(m, -12.0), np.full(m, 12.0)
    for _ in range(60):  # bisection on each model's ability: mean over items of expit(theta - b) = target
        mid = (lo + hi) / 2
        mean = np.mean(1.0 / (1.0 + np.exp(b[None, :] - mid[:, None])), axis=1) if m * n <= 2e7 else np.array(
            [np.mean(1.0 / (1.0 + np.exp(b - t))) for t in mid])
        lo, hi = np.where(mean < target, mid, lo), np.where(mean < target, hi, mid)
    theta = (lo + hi) / 2
    x = np.empty((m, n), dtype=np.uint8)
    for k in range(m):
        x[k] = rng.random(n) < 1.0 / (1.0 + np.exp(b - theta[k]))
    return x


def run_epsilon_rankings(sources, look: int, seed: int, timeout: int) -> list[dict]:
    """Each source in a fresh process (``--_eps_child``)."""
    runs = []
    for source in sources:
        out = tempfile.mktemp(suffix=".json")
        cmd = [sys.executable, "-m", "benchmarks.scale", "--_eps_child", source, "--_out", out,
               "--epsilon-look", str(look), "--seed", str(seed)]
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
            rc, tail = proc.returncode, (proc.stderr or "")[-1500:]
        except subprocess.TimeoutExpired:
            rc, tail = "timeout", f"did not finish within {timeout} s"
        if rc == 0 and os.path.exists(out):
            rec = json.load(open(out))
            print(f"[scale] epsilon ranking {source}: wall {rec['wall_s']:.1f} s, CPU {rec['cpu_s']:.1f} s, "
                  f"peak {rec['peak_rss_gb']:.2f} GB, cells {rec['cells']:.3f}, wrong {rec['wrong_listings']}",
                  file=sys.stderr)
        else:
            rec = {"source": source, "error": f"exit {rc}: {tail}"}
            print(f"[scale] epsilon ranking {source}: FAILED ({rc})\n{tail}", file=sys.stderr)
        rec["process_s"] = time.perf_counter() - t
        runs.append(rec)
    return runs


EPS_NOTE = ("each source in a fresh process on the 2-core machine, shared with other jobs (load_avg per run): wall "
            "times are upper bounds, CPU seconds steadier; peak RSS includes the score table (synthetic: 0/1 bytes)")


def _available_gb() -> float | None:
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        return None
    return None


def split(t: dict) -> dict:
    s = t["steps_s"]
    controller = sum(s.get(k, 0.0) for k in ("embed", "restore", "select", "update", "decide"))
    storage = sum(s.get(k, 0.0) for k in ("store_round", "results", "load_bank", "compact_cache"))
    ray = s.get("start_models", 0.0) + s.get("infer", 0.0) + s.get("stop_models", 0.0)
    prefect = max(0.0, t["wall_s"] - controller - storage - ray)
    wall = t["wall_s"]
    return {"controller_s": controller, "storage_s": storage, "ray_s": ray, "prefect_s": prefect,
            "share_controller": controller / wall, "share_storage": storage / wall, "share_ray": ray / wall,
            "share_prefect": prefect / wall, "share_prefect_plus_ray": (prefect + ray) / wall}


def _run_size(args, m: int, nodes: int, cluster, server=None, location: str | None = None) -> dict:
    """One model count on one cluster, in a fresh process (its own driver)."""
    large = m >= args.large
    batch = args.synthetic_batch if location else args.large_batch if large else args.batch
    out = tempfile.mktemp(suffix=".json")
    cmd = [sys.executable, "-m", "benchmarks.scale", "--_child", str(m), "--_out", out,
           "--batch", str(batch), "--seed", str(args.seed), "--_ray", cluster.address, "--_replicas", str(nodes)]
    if location:
        cmd += ["--_location", location]
    elif large and args.max_items:
        cmd += ["--max-items", str(args.max_items)]
    t = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout,
                              env=cluster.env(server.env() if server is not None else None))
        rc, tail = proc.returncode, (proc.stderr or "")[-1500:]
    except subprocess.TimeoutExpired:
        rc, tail = "timeout", f"did not finish within {args.timeout} s"
    total = time.perf_counter() - t
    if rc == 0 and os.path.exists(out):
        rec = json.load(open(out))
        rec.update(split(rec))
        rec["process_s"] = total
        print(f"[scale] nodes={nodes} M={m} {rec['kind']}: flow {rec['wall_s']:.1f} s, Prefect {rec['share_prefect']:.0%}, "
              f"storage {rec['share_storage']:.0%}, Ray {rec['share_ray']:.0%}, "
              f"controller {rec['share_controller']:.0%}", file=sys.stderr)
    else:
        rec = {"n_models": m, "error": f"exit {rc}: {tail}", "process_s": total}
        print(f"[scale] nodes={nodes} M={m}: FAILED ({rc})\n{tail}", file=sys.stderr)
    rec["nodes"] = nodes
    rec["prefect_server"] = "prefect server start (127.0.0.1, up before timing)" if server is not None else "embedded"
    return rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks scale", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--sizes", default=None, help="comma-separated model counts")
    p.add_argument("--timeout", type=int, default=3600, help="seconds per model count before giving up")
    p.add_argument("--large", type=int, default=100, help="model counts >= this use --large-batch and --max-items")
    p.add_argument("--large-batch", type=int, default=50)
    p.add_argument("--max-items", type=int, default=None, help="item cap for the large model counts (bank: 493)")
    p.add_argument("--nodes", default=None, help="Ray cluster sizes to compare (head + workers started with "
                   "`ray start` on 127.0.0.1, certeval/services/local_cluster.py); replicas = nodes; default 1,3 "
                   "(--quick: 1)")
    p.add_argument("--embedded-prefect", action="store_true",
                   help="each run starts Prefect's embedded server (counted in its Prefect share) instead of using "
                        "one `prefect server start` shared by the runs")
    p.add_argument("--synthetic", default=None, help="also select the best model of this synthetic replay table "
                   f"(e.g. {SYNTHETIC}: 10,000 models x 10,000 items, generated, not stored; 'none' to skip; "
                   "default: it, except with --quick or --sizes)")
    p.add_argument("--synthetic-batch", type=int, default=100, help="items per round of the synthetic run")
    p.add_argument("--epsilon-only", action="store_true", help="run only the neighbour epsilon-rankings (kept beside "
                   "the stored pipeline runs in the JSON)")
    p.add_argument("--epsilon-sources", default=None, help="comma-separated sources for the epsilon-rankings "
                   f"(default: {','.join(EPS_SIZES)}; --quick: {','.join(EPS_QUICK)}; 'none' to skip)")
    p.add_argument("--epsilon-look", type=int, default=100, help="items per look of the epsilon-rankings")
    p.add_argument("--append", action="store_true", help="with --epsilon-only: add the runs to the stored ones")
    p.add_argument("--_child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--_eps_child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_location", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_ray", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_replicas", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--_out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._eps_child is not None:
        json.dump(epsilon_rank_child(args._eps_child, args.epsilon_look, args.seed), open(args._out, "w"))
        return 0
    eps_sources = ([] if (args.epsilon_sources or "").lower() == "none" else
                   args.epsilon_sources.split(",") if args.epsilon_sources else
                   list(EPS_QUICK if args.quick else EPS_SIZES))
    if args.epsilon_only:
        from benchmarks._meta import read_result

        previous = read_result("scale", args.quick) or {}
        eps_runs = run_epsilon_rankings(eps_sources, args.epsilon_look, args.seed, args.timeout)
        payload = {k: v for k, v in previous.items() if k != "meta"}
        if "runs" in previous:  # the pipeline runs kept from the earlier write: their own metadata
            payload["runs_meta"] = previous.get("runs_meta") or previous.get("meta")
        kept = (previous.get("epsilon_ranking") or {}).get("runs", []) if args.append else []
        payload["epsilon_ranking"] = {"runs": kept + eps_runs, "note": EPS_NOTE}
        path = write_result("scale", payload, args.quick, seed=args.seed)
        print(f"scale -> {path}")
        return 0 if all("error" not in r and r.get("wrong_listings") == 0 for r in eps_runs) else 1
    if args._child is not None:
        _child(args._child, args.batch, args.seed, args._out, args.max_items, args._ray, args._replicas,
               args._location)
        return 0
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else ([4] if args.quick else list(SIZES))
    synthetic = args.synthetic or (None if (args.quick or args.sizes) else SYNTHETIC)
    if synthetic and synthetic.lower() == "none":
        synthetic = None
    if synthetic:
        from certeval.inputs.synthetic import SyntheticScores

        n_synthetic = SyntheticScores.parse(synthetic).n_models
    runs = []
    from certeval.services.local_cluster import LocalPrefectServer, LocalRayCluster

    # one Prefect server for every run, started before any timing, as a team's server is already up (with
    # --embedded-prefect each run's flow starts Prefect's embedded server, and its start-up counts as Prefect)
    server = None if args.embedded_prefect else LocalPrefectServer(tempfile.mkdtemp(prefix="pf", dir="/tmp")).start()
    try:
        for nodes in [int(x) for x in (args.nodes or ("1" if args.quick else "1,3")).split(",")]:
            with LocalRayCluster(workers=nodes - 1, base_dir=tempfile.mkdtemp(prefix="rc", dir="/tmp"),
                                 cpus_per_node=max(1, (os.cpu_count() or 2) // nodes)) as cluster:
                for m in sizes:
                    runs.append(_run_size(args, m, nodes, cluster, server))
                if synthetic:
                    runs.append(_run_size(args, n_synthetic, nodes, cluster, server, synthetic))
    finally:
        if server is not None:
            server.stop()
    eps_runs = run_epsilon_rankings(eps_sources, args.epsilon_look, args.seed, args.timeout)
    payload = {"seed": args.seed, "batch": args.batch, "large_batch": args.large_batch, "max_items_large": args.max_items,
               "dataset": DATASET, "synthetic": synthetic, "synthetic_batch": args.synthetic_batch, "runs": runs,
               "note": "one process per (nodes, model count); every Ray node a `ray start` process on 127.0.0.1 of the "
                       "same 2-core machine (3 nodes share the 2 cores: the 3-node figures show the cost of "
                       "the cluster path, not a speed-up)",
               "epsilon_ranking": {"runs": eps_runs, "note": EPS_NOTE}}
    path = write_result("scale", payload, args.quick, seed=args.seed)
    print(f"scale -> {path}")
    return 0 if all("error" not in r for r in runs + eps_runs) else 1


if __name__ == "__main__":
    sys.exit(main())
