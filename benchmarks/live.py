"""Live runs beside lm-eval: what a user pays for one local lm-eval task, run by lm-eval and by certeval.

The task (``live_trivia_mc``): ``--items`` four-choice trivia questions (certeval.inputs.trivia, seeded) as JSONL plus an
lm-eval YAML in a work folder (``--work``, default ``$TMPDIR/certeval-live``). The models: SmolLM2-135M (the
converted float32 folder) and copies of it with seeded Gaussian noise on every weight (copy k: ``k * --noise`` times
each tensor's root mean square), saved once into the work folder. Both tools get the same model, dtype, inference
batch size (lm-eval ``--batch_size B``, certeval ``--model_args ...,batch=B``), CPU and the same datasets cache
folder; each run is one subprocess, timed by its wall clock, one after the other:

* ``lm-eval`` of each model involved (``python -m lm_eval --model hf ... --log_samples``), once per model: a
  model's lm-eval run counts for every certeval run that uses that model;
* ``certify``: ``certeval certify --tasks live_trivia_mc --include_path DIR --model hf --model_args
  pretrained=DIR0,... --goal halfwidth:E`` for each ``--goals`` E (default 0.1 and 0.05), vs lm-eval of model 0;
* ``compare``: ``certeval compare`` of model 0 and copy 1, vs lm-eval of both (near-identical models);
* ``compare_distinct``: ``certeval compare`` of model 0 and a copy that really differs (``--distinct-noise``,
  default 0.15: several points of accuracy apart), vs lm-eval of both;
* ``rank``: ``certeval rank --epsilon 0.05`` of four models, vs lm-eval of all four;
* ``select``: ``certeval select`` of the same four (its default: the best one), vs lm-eval of all four;
* ``generation``: the same questions as short-answer generation, 3-shot, until a newline, ``exact_match`` after a
  filter; certify at ±0.1 vs lm-eval's full run, and inference items/s beside lm-eval's over 300 items (a certify
  held to ``--max-items 300`` by a goal it cannot reach).

Per run: wall clocks (lm-eval summed over its models), their ratio, the items each scored (certeval: ``n_scored``
and items sent, plus the items scored ahead of a round and never used: ``pipeline.ahead``), certeval's phases
from ``--startup-log`` and the run folder (imports and checks, Ray + Prefect start, the actor's process start, model load, rounds, results and report; beside them, overlapping: Prefect's
embedded server start and the first actor's own model load), items/s of inference alone (lm-eval: its progress
bar over the scoring requests; certeval: items over the rounds' wall time, and per call, over the ``latency_s``
its calls record, which overlap where an actor scores several calls at once), and the
per-item agreement of certeval's scores with lm-eval's samples on the items certeval scored (doc_id = item
``live_trivia_mc/<doc_id>``). Load averages before each run are kept: the numbers swing with the machine's load.

    python -m benchmarks live --quick             # 120 items; lm-eval of models 0 and 1, certify ±0.1, compare
    python -m benchmarks live                     # 1,000 items; every run below
    python -m benchmarks live --runs generation --items 300   # the generation run alone
    python -m benchmarks live --runs rank --items 500 --batch-size 32
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._live_build import GEN_TASK, MC_TASK, perturbed_copy, trivia_items, write_gen_task, write_mc_task
from benchmarks._meta import ROOT, tree_cpu_s, write_result

GEN_RATE_ITEMS = 300
RUNS = ("certify", "compare", "compare_distinct", "rank", "select", "generation")
ENV_DROP = ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH", "RAY_ADDRESS")
TIMEOUT_S = 4 * 3600
# certeval phases: (name, start mark, end mark); None = the launch, "results" = results.json written, "exit"
PHASES = (("imports_and_checks", None, "plan_ready"), ("ray_and_prefect_start", "plan_ready", "ray_ready"),
          ("actor_process_start", "ray_ready", "actor_started"), ("model_load", "actor_started", "actors_ready"),
          ("flow_to_first_call", "actors_ready", "first_call"),
          ("rounds", "first_call", "results"), ("results_and_report", "results", "exit"))
OVERLAPPING = (("prefect_server_start", "prefect_launched", "prefect_ready"),
               ("first_actor_model_load", "actor_started", "model_loaded"))
_BAR = re.compile(r"Running (?:loglikelihood|generate_until) requests[^|\r\n]*\|[^|\r\n]*\|\s*(\d+)/(\d+)\s*"
                  r"\[(?:(\d+):)?(\d+):(\d+)<")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks live", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="120 items; runs certify (±0.1 only) and compare")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--items", type=int, default=None, help="items of the task (default 1000, --quick 120)")
    p.add_argument("--runs", default=None, help=f"comma-separated subset of {','.join(RUNS)} "
                                                "(default every run; --quick certify,compare)")
    p.add_argument("--generation", action="store_true", help="also the generation task (same as adding it to --runs)")
    p.add_argument("--goals", default=None, help="certify half-widths (default 0.1,0.05; --quick 0.1)")
    p.add_argument("--batch-size", type=int, default=16, help="inference batch size of both tools (default 16)")
    p.add_argument("--noise", type=float, default=0.02,
                   help="copy k gets k * NOISE * rms(w) Gaussian noise (default 0.02)")
    p.add_argument("--distinct-noise", type=float, default=0.15,
                   help="compare_distinct's second model: DISTINCT_NOISE * rms(w) Gaussian noise (default 0.15)")
    p.add_argument("--epsilon", type=float, default=0.05)
    p.add_argument("--certeval-model-args", default="",
                   help="extra hf options for certeval only, e.g. threads=2 (default none: both tools as shipped)")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "certeval-live"),
                   help="work folder (task, model copies, run outputs; model copies are reused)")
    args = p.parse_args(argv)
    args.items = args.items or (120 if args.quick else 1000)
    runs = [r for r in (args.runs or ("certify,compare" if args.quick else ",".join(RUNS))).split(",") if r]
    if args.generation and "generation" not in runs:
        runs.append("generation")
    bad = sorted(set(runs) - set(RUNS))
    if bad:
        p.error(f"--runs names no run: {', '.join(bad)}; runs: {', '.join(RUNS)}")
    args.runs = runs
    args.goals = [float(g) for g in (args.goals or ("0.1" if args.quick else "0.1,0.05")).split(",") if g]
    return args


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    env.update({"HOME": str(work / "home"), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                "HF_DATASETS_CACHE": str(work / "hf_datasets"), "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")})
    (work / "home").mkdir(parents=True, exist_ok=True)
    return env




def timed(cmd: list[str], work: Path, log: Path) -> dict[str, Any]:
    """Run ``cmd`` (stdout and stderr to ``log``): wall clock from launch to exit, CPU seconds of its process tree
    (the most seen while sampling it each second, or what the finished child reports, whichever is larger: Ray's
    daemons are not always waited for), load average before."""
    load = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    print("   $", " ".join(cmd), flush=True)
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, cpu = time.time(), 0.0
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=work, env=_env(work), stdout=out, stderr=subprocess.STDOUT)
        while True:
            try:
                proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                cpu = max(cpu, tree_cpu_s(proc.pid, reaped=True))
                if time.time() - t0 > TIMEOUT_S:
                    proc.kill()
    end = time.time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    waited = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"launched": t0, "exit_at": end, "wall_s": round(end - t0, 2), "cpu_s": round(max(cpu, waited), 1),
            "exit_code": proc.returncode, "load_avg_before": load, "log": str(log)}


def bar_seconds(text: str) -> tuple[int, float] | None:
    """(requests, seconds) of the last finished lm-eval scoring progress bar in ``text``."""
    done = [m for m in _BAR.finditer(text) if m.group(1) == m.group(2)]
    if not done:
        return None
    m = done[-1]
    return int(m.group(2)), int(m.group(3) or 0) * 3600 + int(m.group(4)) * 60 + int(m.group(5))


def lm_eval_run(model: Path, label: str, task: str, work: Path, batch: int) -> dict[str, Any]:
    out = work / "out" / f"lm_eval-{task}-{label}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={model},dtype=float32",
           "--tasks", task, "--include_path", str(work / "task"), "--batch_size", str(batch), "--device", "cpu",
           "--output_path", str(out), "--log_samples"]
    run = timed(cmd, work, work / "out" / f"lm_eval-{task}-{label}.log")
    if run["exit_code"] != 0:
        raise RuntimeError(f"lm-eval failed ({label}): {Path(run['log']).read_text()[-3000:]}")
    samples = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    results = sorted(out.rglob("results_*.json"))
    scores = {}
    metric = "acc" if task == MC_TASK else "exact_match"
    for line in samples[-1].read_text().splitlines():
        rec = json.loads(line)
        scores[int(rec["doc_id"])] = float(rec[metric])
    block = json.loads(results[-1].read_text())
    bar = bar_seconds(Path(run["log"]).read_text(errors="replace"))
    run.update(model=label, items=len(scores), mean=sum(scores.values()) / len(scores), scores=scores,
               total_evaluation_time_s=float(block.get("total_evaluation_time_seconds") or "nan"),
               inference_requests=bar[0] if bar else None, inference_s=bar[1] if bar else None,
               inference_items_per_s=round(len(scores) / bar[1], 2) if bar and bar[1] > 0 else None)
    return run


def _marks(path: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[0] not in out:
                out[parts[0]] = float(parts[1])
    return out


def inference_stats(root: Path) -> dict[str, Any]:
    """Items scored and the actor's own scoring seconds (sum of ``latency_s``) from the run root's score cache."""
    import pandas as pd

    parts = sorted((root / "_cache" / "_shared" / "parts").glob("*.parquet"))
    if not parts:
        return {"items": 0, "seconds": None, "items_per_s": None}
    frame = pd.concat([pd.read_parquet(p, columns=["cache", "latency_s"]) for p in parts])
    seconds = float(frame["latency_s"].sum())
    per_cache = frame.groupby("cache")["latency_s"].agg(["size", "sum"])
    return {"items": int(len(frame)), "seconds": round(seconds, 2),
            "items_per_s": round(len(frame) / seconds, 2) if seconds > 0 else None,
            "per_model_items_per_s": [round(n / s, 2) for n, s in zip(per_cache["size"], per_cache["sum"]) if s > 0]}


def certeval_run(verb: str, models: list[Path], task: str, work: Path, batch: int, extra: list[str],
                 label: str, seed: int, model_args: str = "") -> dict[str, Any]:
    root = work / "out" / f"certeval-{label}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    timeline = work / "out" / f"certeval-{label}.startup.tsv"
    timeline.unlink(missing_ok=True)
    if len(models) == 1:  # lm-eval's own form
        model_flags = ["--model", "hf", "--model_args",
                       f"pretrained={models[0]},dtype=float32,batch={batch}{model_args}"]
    else:
        model_flags = [f for m in models for f in ("--model", f"hf:{m}")] + ["--model_args",
                                                                           f"dtype=float32,batch={batch}{model_args}"]
    cmd = [sys.executable, "-m", "certeval", verb, "--tasks", task, "--include_path", str(work / "task"), *model_flags,
           *extra, "--seed", str(seed), "--json", "--quiet", "--log_samples", "--output", str(root), "--run-id", "run",
           "--startup-log", str(timeline)]
    prefect_db_existed = (work / ".prefect").exists()  # the embedded server's state: ./.prefect of the cwd
    stdout_log = work / "out" / f"certeval-{label}.log"
    run = timed(cmd, work, stdout_log)
    results_path = root / "run" / "results.json"
    if run["exit_code"] not in (0, 1) or not results_path.is_file():
        raise RuntimeError(f"certeval {verb} failed ({label}): {stdout_log.read_text()[-3000:]}")
    res = json.loads(results_path.read_text())
    marks = _marks(timeline)
    marks.update(results=results_path.stat().st_mtime, exit=run["exit_at"])
    phases = {}
    for name, start, end in PHASES:
        begin = run["launched"] if start is None else marks.get(start)
        if begin is not None and end in marks:
            phases[name] = round(marks[end] - begin, 2)
    # beside the chain (they overlap it): Prefect's embedded server, launched with Ray; one actor's own model load
    for name, start, end in OVERLAPPING:
        if start in marks and end in marks:
            phases[name] = round(marks[end] - marks[start], 2)
    scores: list[dict[int, float]] = []
    metric = "acc" if task == MC_TASK else "exact_match"
    for entry in res["models"]:
        files = sorted((root / "run" / "samples").rglob(f"samples_{task}_*.jsonl"))
        mine = [f for f in files if f.parent.name == _safe(entry["model"])] or files[len(scores):len(scores) + 1]
        got = {}
        for line in mine[0].read_text().splitlines() if mine else []:
            rec = json.loads(line)
            got[int(str(rec["item_id"]).rsplit("/", 1)[1])] = float(rec[metric])
        scores.append(got)
    run.update(verb=verb, extra=extra, exit_code=run["exit_code"], reached=res.get("reached"), rounds=res.get("rounds"),
               n_scored=[m.get("n_scored") for m in res["models"]], means=[m.get("mean") for m in res["models"]],
               intervals=[[m.get("lower"), m.get("upper")] for m in res["models"]],
               items_sent=res["pipeline"].get("items_sent"), pipeline_wall_s=res["pipeline"].get("wall_s"),
               ahead=res["pipeline"].get("ahead"), placement=res["pipeline"].get("placement"),
               marks={k: round(v - run["launched"], 2) for k, v in marks.items()}, phases=phases,
               inference=inference_stats(root), prefect_db_existed=prefect_db_existed, scores=scores,
               verdict=res.get("pairs") and res["pairs"][0].get("verdict") if verb == "compare" else None,
               ranking=res.get("ranking") if verb == "rank" else None,
               selection=res.get("selection") if verb == "select" else None)
    return run


def _safe(label: str) -> str:
    from certeval.storage.io import safe_name

    return safe_name(str(label))


def agreement(certeval_scores: dict[int, float], lm_eval_scores: dict[int, float]) -> dict[str, Any]:
    """Share of the items certeval scored on which its score equals lm-eval's (doc_id by doc_id)."""
    common = [d for d in certeval_scores if d in lm_eval_scores]
    same = sum(abs(certeval_scores[d] - lm_eval_scores[d]) < 1e-9 for d in common)
    return {"items": len(common), "missing_in_lm_eval": len(certeval_scores) - len(common), "equal": same,
            "rate": round(same / len(common), 4) if common else None}


def oracle_pair_items(a: dict[int, float], b: dict[int, float], confidence: float = 0.95) -> dict[str, Any]:
    """How many of the bank's N items even an oracle needs to tell two models apart: the smallest n at which a
    fixed-n two-sided z-test on the paired differences, told their true mean Δ and standard deviation σ by the full
    runs (finite-population corrected, no peeking), excludes 0: z σ sqrt((1 - n/N) / n) <= |Δ|, so
    n >= N / (1 + N (Δ / (z σ))²). Any valid sequential test needs about as many or more; certeval's compare can only
    save time beyond it by scoring faster."""
    from statistics import NormalDist

    docs = sorted(set(a) & set(b))
    diffs = [a[d] - b[d] for d in docs]
    n_total = len(diffs)
    mean = sum(diffs) / n_total
    sd = (sum((x - mean) ** 2 for x in diffs) / n_total) ** 0.5
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    ratio = (mean / (z * sd)) ** 2 if sd > 0 else float("inf")
    need = n_total if mean == 0 else min(n_total, int(-(-n_total // (1 + n_total * ratio))))
    return {"diff": round(mean, 4), "sd": round(sd, 4), "disagree": round(sum(x != 0 for x in diffs) / n_total, 4),
            "items": need, "of": n_total, "fraction": round(need / n_total, 3)}


def summarise(name: str, cert: dict[str, Any], lm_runs: list[dict[str, Any]]) -> dict[str, Any]:
    lm_wall = round(sum(r["wall_s"] for r in lm_runs), 2)
    agree = [agreement(s, lm["scores"]) for s, lm in zip(cert["scores"], lm_runs)]
    equal, common = sum(a["equal"] for a in agree), sum(a["items"] for a in agree)
    lm_inf = [r["inference_s"] for r in lm_runs]
    lm_items = sum(r["items"] for r in lm_runs)
    sent = int(sum((cert["items_sent"] or {}).values()))
    lm_cpu = round(sum(r["cpu_s"] for r in lm_runs), 1)
    rounds_rate = round(sent / cert["phases"]["rounds"], 2) if cert["phases"].get("rounds") else None
    lm_rate = lm_items / sum(lm_inf) if None not in lm_inf and sum(lm_inf) else None  # items a second, its bar's
    return {"run": name, "lm_eval_wall_s": lm_wall, "certeval_wall_s": cert["wall_s"],
            "ratio": round(cert["wall_s"] / lm_wall, 3) if lm_wall else None,
            "lm_eval_cpu_s": lm_cpu, "certeval_cpu_s": cert["cpu_s"],
            "cpu_ratio": round(cert["cpu_s"] / lm_cpu, 3) if lm_cpu else None,
            "lm_eval_items": lm_items, "certeval_items": int(sum(n or 0 for n in cert["n_scored"])),
            "certeval_items_sent": sent,
            # proposing ahead: items scored past the stop (or mispredicted), kept in the cache, never used
            "certeval_items_ahead_unused": int((cert.get("ahead") or {}).get("scored_unused", 0)),
            "certeval_torch_threads": [p.get("torch_threads") for p in cert.get("placement") or []],
            "certeval_calls_at_once": [p.get("calls_at_once") for p in cert.get("placement") or []],
            "lm_eval_items_per_s": round(lm_rate, 2) if lm_rate else None,
            # per call: items / the seconds their calls took (an actor's calls that run at once overlap)
            "certeval_items_per_s": cert["inference"]["items_per_s"],
            # all actors together: items sent / the rounds' wall time (several actors share the CPUs)
            "certeval_rounds_items_per_s": rounds_rate,
            # the issue's throughput-parity number: items a second on the machine, certeval's over the rounds' wall
            # time (its models side by side, the driver's gaps between rounds included) over lm-eval's (its models
            # one after another)
            "items_per_s_ratio": round(rounds_rate / lm_rate, 3) if rounds_rate and lm_rate else None,
            "agreement": {"equal": equal, "items": common, "rate": round(equal / common, 4) if common else None,
                          "per_model": agree},
            "lm_eval_means": [round(r["mean"], 4) for r in lm_runs], "certeval_means": cert["means"],
            "certeval_phases": cert["phases"], "reached": cert["reached"], "exit_code": cert["exit_code"],
            # a pair: the items an oracle's fixed-n test needs to separate the two models (oracle_pair_items)
            "oracle_pair": oracle_pair_items(lm_runs[0]["scores"], lm_runs[1]["scores"]) if len(lm_runs) == 2 else None}


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| run | lm-eval s | certeval s | ratio | CPU s (lm-eval, certeval) | lm-eval items "
            "| certeval items (sent, +scored ahead unused) "
            "| agreement | lm-eval items/s | certeval items/s (per call, rounds) |\n|---" + "|---:" * 9 + "|")
    lines = [head]
    for r in rows:
        a = r["agreement"]
        lines.append(f"| {r['run']} | {r['lm_eval_wall_s']:.1f} | {r['certeval_wall_s']:.1f} | {r['ratio']:.2f} "
                     f"| {r['lm_eval_cpu_s']:.0f}, {r['certeval_cpu_s']:.0f} | {r['lm_eval_items']} "
                     f"| {r['certeval_items']} ({r['certeval_items_sent']}, +{r['certeval_items_ahead_unused']}) "
                     f"| {a['equal']}/{a['items']} | {r['lm_eval_items_per_s']} "
                     f"| {r['certeval_items_per_s']}, {r['certeval_rounds_items_per_s']} |")
    names = [name for name, _, _ in PHASES + OVERLAPPING]
    lines += ["", "| certeval run | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for r in rows:
        lines.append(f"| {r['run']} | " + " | ".join(str(r["certeval_phases"].get(n, "-")) for n in names) + " |")
    return "\n".join(lines)


def build(args: argparse.Namespace, work: Path, n_models: int) -> tuple[list[Path], dict[str, Path]]:
    from certeval.inputs.smollm import ensure_converted

    items = trivia_items(args.items, seed=args.seed)
    tasks = {MC_TASK: write_mc_task(work / "task", items)}
    if "generation" in args.runs:
        tasks[GEN_TASK] = write_gen_task(work / "task", items)
    base = ensure_converted()
    models = [base] + [perturbed_copy(base, work / "models" / f"smollm2-noise{k}", scale=k * args.noise,
                                      seed=args.seed * 100 + k) for k in range(1, n_models)]
    if "compare_distinct" in args.runs:  # the last model: one that really differs from model 0
        models.append(perturbed_copy(base, work / "models" / f"smollm2-distinct{args.distinct_noise:g}",
                                     scale=args.distinct_noise, seed=args.seed * 100 + 99))
    return models, tasks


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.work).resolve()
    (work / "out").mkdir(parents=True, exist_ok=True)
    n_models = 4 if {"rank", "select"} & set(args.runs) else 2 if "compare" in args.runs else 1
    t_build = time.perf_counter()
    models, _ = build(args, work, n_models)
    build_s = round(time.perf_counter() - t_build, 1)
    print(f"live: {args.items} items, {n_models} models, runs {','.join(args.runs)} in {work} (built in {build_s} s)",
          flush=True)
    lm: dict[tuple[str, int], dict[str, Any]] = {}

    def lm_eval_of(k: int, task: str = MC_TASK) -> dict[str, Any]:
        if (task, k) not in lm:
            print(f"== lm-eval {task} model {k}", flush=True)
            lm[(task, k)] = lm_eval_run(models[k], f"m{k}", task, work, args.batch_size)
        return lm[(task, k)]

    runs, rows = [], []

    def do(name: str, verb: str, ks: list[int], extra: list[str], task: str = MC_TASK) -> None:
        lm_runs = [lm_eval_of(k, task) for k in ks]
        print(f"== certeval {name}", flush=True)
        cert = certeval_run(verb, [models[k] for k in ks], task, work, args.batch_size, extra, name, args.seed,
                            "," + args.certeval_model_args if args.certeval_model_args else "")
        rows.append(summarise(name, cert, lm_runs))
        runs.append({k: v for k, v in cert.items() if k != "scores"})

    if "certify" in args.runs:
        for goal in args.goals:
            do(f"certify±{goal:g}", "certify", [0], ["--goal", f"halfwidth:{goal:g}"])
    if "compare" in args.runs:
        do("compare", "compare", [0, 1], [])
    if "compare_distinct" in args.runs:
        do(f"compare distinct (noise {args.distinct_noise:g})", "compare", [0, len(models) - 1], [])
    if "rank" in args.runs:
        do(f"rank ε={args.epsilon:g}", "rank", [0, 1, 2, 3], ["--epsilon", f"{args.epsilon:g}"])
    if "select" in args.runs:
        do("select (the best of four)", "select", [0, 1, 2, 3], [])
    if "generation" in args.runs:
        do("generation certify±0.1", "certify", [0], ["--goal", "halfwidth:0.1"], GEN_TASK)
        # a certify at ±0.1 scores a few dozen items, too few for a steady items/s: 300 items at a goal it cannot
        # reach give the inference rate beside lm-eval's over its whole run
        do(f"generation items/s ({GEN_RATE_ITEMS} items)", "certify", [0],
           ["--goal", "halfwidth:0.001", "--max-items", str(GEN_RATE_ITEMS)], GEN_TASK)
    lm_out = [{k: v for k, v in r.items() if k != "scores"} | {"task": t} for (t, _), r in lm.items()]
    print(table(rows), flush=True)
    payload = {"seed": args.seed, "items": args.items, "batch_size": args.batch_size, "noise": args.noise,
               "runs_selected": args.runs, "certeval_model_args": args.certeval_model_args, "goals": args.goals,
               "distinct_noise": args.distinct_noise,
               "epsilon": args.epsilon, "work": str(work),
               "models": [str(m) for m in models], "build_s": build_s, "summary": rows, "lm_eval_runs": lm_out,
               "certeval_runs": runs, "table_markdown": table(rows)}
    path = write_result("live", payload, args.quick, seed=args.seed)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
