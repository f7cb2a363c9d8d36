"""Per-item throughput of certeval's hf host against lm-eval's HFLM, on the same items, model and batch size.

What ``benchmarks/live.py`` measures end to end, taken apart: the multiple-choice trivia items of the live task
(``live_trivia_mc``, built as there), SmolLM2 (the converted float32 folder), one process per tool set-up, and
nothing but inference timed:

* ``lm_eval``: ``HFLM(pretrained=DIR, dtype=float32, batch_size=B, device=cpu).loglikelihood(requests)`` on the
  (context, " " + choice) requests lm-eval builds for these items (tokenising included, as in certeval);
* ``certeval_inprocess``: :class:`certeval.hosting.hf.HFHost` in this process, the items sent in calls of
  ``--chunk`` items (what the pool sends an actor: ``--batch-size 50`` split over ``in_flight`` 2);
* ``certeval_actor``: the same host inside a model actor (:class:`certeval.hosting.pool.ModelPool`, a local Ray),
  with the CPUs the pool gives an actor by default, and ``certeval_actor_1cpu`` with one CPU (the default before
  issue 42: Ray then sets ``OMP_NUM_THREADS=1`` in the actor, so torch ran one thread where lm-eval ran one per
  core).

Each set-up is warmed up once, then timed ``--repeats`` times over all items; the median is reported, with the
torch thread count each ran with and the share of items whose chosen answer agrees with lm-eval's. Each set-up
runs in its own subprocess, one after the other (never side by side), so each sees the machine alone; the load
average before each is kept. The numbers swing with the machine's load: compare ratios from one run.

    python -m benchmarks throughput --quick      # 48 items, 1 repeat
    python -m benchmarks throughput              # 200 items, 3 repeats
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._meta import ROOT, write_result

SETUPS = ("lm_eval", "certeval_inprocess", "certeval_actor", "certeval_actor_1cpu")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m benchmarks throughput", description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="48 items, one repeat")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--items", type=int, default=None, help="items (default 200, --quick 48)")
    p.add_argument("--repeats", type=int, default=None, help="timed passes per set-up (default 3, --quick 1)")
    p.add_argument("--batch-size", type=int, default=16, help="inference batch size of both tools (default 16)")
    p.add_argument("--chunk", type=int, default=25, help="items per certeval host call (default 25)")
    p.add_argument("--setups", default=",".join(SETUPS), help=f"comma-separated subset of {','.join(SETUPS)}")
    p.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "certeval-throughput"))
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one set-up, print JSON
    args = p.parse_args(argv)
    args.items = args.items or (48 if args.quick else 200)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.setups = [s for s in args.setups.split(",") if s]
    bad = sorted(set(args.setups) - set(SETUPS))
    if bad:
        p.error(f"--setups names no set-up: {', '.join(bad)}")
    return args


def task_items(work: Path, n: int, seed: int) -> list[dict[str, Any]]:
    """The live task's items as certeval sends them to a host (lm-eval's context as ``prompt``)."""
    from benchmarks._live_build import MC_TASK, trivia_items, write_mc_task
    from certeval.harnesses.lm_eval_tasks import load_task_items

    write_mc_task(work / "task", trivia_items(n, seed=seed))
    frame = load_task_items(str(work / "task" / f"{MC_TASK}.yaml"))
    out = []
    for rec in frame.to_dict("records"):
        out.append({k: (v.tolist() if hasattr(v, "tolist") and not isinstance(v, (str, int, float)) else v)
                    for k, v in rec.items()})
    return out


def _choices(results: list[list[float]]) -> list[int]:
    return [max(range(len(r)), key=lambda j: r[j]) for r in results]


def run_lm_eval(model: str, items: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from certeval.scoring import scorers as sc

    lm = HFLM(pretrained=model, dtype="float32", batch_size=args.batch_size, device="cpu")
    requests, owner = [], []
    for i, item in enumerate(items):
        ctx, conts = sc.mc_request(item)
        for cont in conts:
            requests.append(Instance("loglikelihood", doc={}, arguments=(ctx, cont), idx=len(owner)))
            owner.append(i)

    def once() -> list[list[float]]:
        out = lm.loglikelihood(requests, disable_tqdm=True)
        per: list[list[float]] = [[] for _ in items]
        for i, (ll, _) in zip(owner, out):
            per[i].append(float(ll))
        return per

    once_small = requests[: 4 * args.batch_size]
    lm.loglikelihood(once_small, disable_tqdm=True)  # warm-up
    times, per = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        per = once()
        times.append(time.perf_counter() - t0)
    chosen = [str(sc.as_list(item["choices"])[j]) for item, j in zip(items, _choices(per))]
    return {"times_s": times, "outputs": chosen, "threads": torch.get_num_threads()}


def run_inprocess(model: str, items: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from certeval.hosting.base import make_host

    host = make_host(f"hf:{model}?batch={args.batch_size}&dtype=float32")
    host.score(items[: args.chunk])  # warm-up
    times, out = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        out = [r for i in range(0, len(items), args.chunk) for r in host.score(items[i:i + args.chunk])]
        times.append(time.perf_counter() - t0)
    return {"times_s": times, "outputs": [r.get("output") for r in out], "threads": torch.get_num_threads()}


def run_actor(model: str, items: list[dict[str, Any]], args: argparse.Namespace, num_cpus: float | None) -> dict:
    import ray

    from certeval.hosting.pool import Actors, ModelPool
    from certeval.hosting.ray_setup import init_ray

    init_ray(num_cpus=os.cpu_count() or 2)
    pool = ModelPool({"m": f"hf:{model}?batch={args.batch_size}&dtype=float32"}, Actors(num_cpus=num_cpus)).start()
    try:
        requests = [(f"k{i}", item) for i, item in enumerate(items)]
        pool.score({"m": requests[: args.chunk]}, args.chunk)  # warm-up
        times, out = [], {}
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = pool.score({"m": requests}, args.chunk)
            times.append(time.perf_counter() - t0)
        placement = pool.placement()
        by_id = {r["item_id"]: r.get("output") for r in out["m"]}  # the pool answers longest first: by item
        return {"times_s": times, "outputs": [by_id.get(str(item["item_id"])) for item in items],
                "threads": placement[0].get("torch_threads") if placement else None,
                "actor_cpus": pool._actor_cpus(next(iter(pool.groups)))}
    finally:
        pool.shutdown()
        ray.shutdown()


def one(args: argparse.Namespace) -> dict[str, Any]:
    from certeval.inputs.smollm import ensure_converted

    work = Path(args.work)
    model = str(ensure_converted())
    items = task_items(work, args.items, args.seed)
    if args.one == "lm_eval":
        return run_lm_eval(model, items, args)
    if args.one == "certeval_inprocess":
        return run_inprocess(model, items, args)
    return run_actor(model, items, args, 1.0 if args.one == "certeval_actor_1cpu" else None)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.one:
        print("RESULT " + json.dumps(one(args)), flush=True)
        return 0
    Path(args.work).mkdir(parents=True, exist_ok=True)
    base = [a for a in (argv if argv is not None else sys.argv[1:])]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    setups: dict[str, Any] = {}
    for name in args.setups:
        load = [round(x, 2) for x in os.getloadavg()]
        print(f"== {name} (load {load})", flush=True)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.throughput", *base, "--one", name], cwd=ROOT, env=env,
                              capture_output=True, text=True)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if proc.returncode != 0 or line is None:
            print(proc.stdout[-2000:], proc.stderr[-4000:], file=sys.stderr)
            raise RuntimeError(f"set-up {name} failed (exit {proc.returncode})")
        got = json.loads(line[len("RESULT "):])
        got["load_avg_before"] = load
        got["median_s"] = round(statistics.median(got["times_s"]), 3)
        got["items_per_s"] = round(args.items / got["median_s"], 3)
        setups[name] = got
        print(f"   {got['median_s']} s, {got['items_per_s']} items/s, torch threads {got.get('threads')}", flush=True)
    ref = setups.get("lm_eval")
    summary = {}
    for name, got in setups.items():
        row = {"items_per_s": got["items_per_s"], "median_s": got["median_s"], "threads": got.get("threads")}
        if ref is not None and name != "lm_eval":
            row["vs_lm_eval"] = round(got["items_per_s"] / ref["items_per_s"], 3)
            row["same_choice_as_lm_eval"] = sum(a == b for a, b in zip(got["outputs"], ref["outputs"]))
        summary[name] = row
    for name, row in summary.items():
        print(f"{name:22s} {row}")
    payload = {"seed": args.seed, "items": args.items, "batch_size": args.batch_size, "chunk": args.chunk,
               "repeats": args.repeats, "cpus": os.cpu_count(), "summary": summary,
               "setups": {k: {kk: vv for kk, vv in v.items() if kk != "outputs"}
                          for k, v in setups.items()}}
    path = write_result("throughput", payload, args.quick, seed=args.seed)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
