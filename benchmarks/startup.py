"""Start-up: wall time from launching ``certeval certify`` to the first model call, by phase, before vs after.

Each run launches ``python -m certeval certify --model replay:bundled:helm_mmlu#openai_davinci --goal
halfwidth:0.1`` as a subprocess, zero-config (a temporary working folder and HOME, no ``PREFECT_*`` or
``RAY_ADDRESS``: the embedded Prefect server and a local Ray, as a first-time user gets them) with a fresh
output folder (no score cache, so the actor really is called). ``--startup-log FILE`` makes the
command write a timeline (:mod:`certeval.runtime.startup`): imports done, plan and bank ready, Prefect's server
up, Ray up, the actors up, and ``first_call``, written by the model actor when the first scoring call
reaches it. Times are seconds from the subprocess launch.

* **before**: ``--sequential-start``, the sequential start-up (import Prefect, the flow's client starts
  Prefect's ephemeral server, then the bank, then Ray and the actors inside the ``start-models`` task);
* **after**: the default (:mod:`certeval.services.fast_start`): Prefect's server, Prefect's import, Ray and the
  actors start side by side once the input is checked;
* **reused**: the default command run from a folder where ``certeval up`` started a Ray head and a Prefect
  server beforehand (:mod:`certeval.services.up_down`): the command connects to them instead of starting its own.

Both run in the same benchmark, interleaved (before, after, before, ...), ``--repeats`` times each, after
one untimed warm-up run that creates the working folder's Prefect database (its time is reported as
``cold_first_run_s``: the first command in a new folder also creates and migrates ``.prefect/``). The
CPU seconds of the command's process tree when the first call is seen are recorded too: wall times on a
shared 2-core machine swing with its load, CPU seconds much less. Load averages before every run are kept.

    python -m benchmarks startup              # 3 repeats each (default)
    python -m benchmarks startup --repeats 5
    python -m benchmarks startup --quick      # 1 repeat each, no warm-up (checks the JSON shape)
    python -m benchmarks startup --under-load # 5 default certifies in a row beside 3 CPU-bound processes

``--under-load`` keeps three ``while True: pass`` processes running on the 2-core machine and runs the default
command 5 times in a row (after one warm-up): every run must finish (exit 0 or 1, no start-up timeout); the
first-call and exit times go to ``under_load`` in the stored JSON beside the idle modes.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks._meta import ROOT, tree_cpu_s, write_result

MODEL = "replay:bundled:helm_mmlu#openai_davinci"
COMMAND = ["certify", "--model", MODEL, "--goal", "halfwidth:0.1", "--json"]
MODES = {"before": ["--sequential-start"], "after": [], "reused": []}  # flags added to COMMAND
UP_FOLDER = "up"  # the working folder of the "reused" runs, where certeval up was run
# phases as (start mark, end mark) of the timeline; None = the subprocess launch. First mark of a name counts.
PHASES = {
    "before": {
        "python_imports": (None, "cli_parsed"),
        "bank_load_and_checks": ("cli_parsed", "plan_ready"),
        "prefect_start": ("plan_ready", "flow_started"),  # import Prefect + its ephemeral server + the flow run
        "bank_load_in_flow": ("flow_started", "bank_loaded"),
        "ray_start": ("models_starting", "ray_ready"),
        "actor_start": ("ray_ready", "actors_ready"),
        "first_call": ("actors_ready", "first_call"),
    },
    "after": {
        "python_imports": (None, "cli_parsed"),
        "bank_load_and_checks": ("cli_parsed", "plan_ready"),
        "prefect_server_start": ("prefect_launched", "prefect_ready"),  # overlaps Ray and Prefect's import
        "ray_start": ("prefect_launched", "ray_ready"),
        "prefect_import_wait": ("ray_ready", "flows_imported"),
        "flow_run_start": ("flow_calling", "flow_started"),
        "bank_load_in_flow": ("flow_started", "bank_loaded"),
        "actor_start": ("ray_ready", "actors_ready"),  # actors created right after Ray, adopted by the flow
        "first_call": ("actors_ready", "first_call"),
    },
    "reused": {
        "python_imports": (None, "cli_parsed"),
        "bank_load_and_checks": ("cli_parsed", "plan_ready"),
        "ray_connect": ("plan_ready", "ray_ready"),
        "prefect_import_wait": ("ray_ready", "flows_imported"),
        "flow_run_start": ("flow_calling", "flow_started"),
        "actor_start": ("ray_ready", "actors_ready"),
        "first_call": ("actors_ready", "first_call"),
    },
}
ENV_DROP = ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH", "RAY_ADDRESS",
            "PREFECT_LOGGING_LEVEL")
FIRST_CALL_TIMEOUT_S = 300.0




def read_marks(path: Path) -> dict[str, float]:
    """First time of each mark in a timeline file."""
    out: dict[str, float] = {}
    if not path.is_file():
        return out
    for line in path.read_text().splitlines():
        parts = line.split("\t")
        if len(parts) == 3 and parts[0] not in out:
            out[parts[0]] = float(parts[1])
    return out


def _env(work: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    env.update({"HOME": str(work / "home"), "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")})
    return env


def services(work: Path, verb: str) -> None:
    """``certeval up`` / ``down`` in the "reused" runs' folder."""
    (work / UP_FOLDER).mkdir(exist_ok=True)
    (work / "home").mkdir(exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "certeval", verb], cwd=work / UP_FOLDER, env=_env(work),
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"certeval {verb} failed: {proc.stdout[-1000:]} {proc.stderr[-2000:]}")


def run_once(mode: str, work: Path, n: int) -> dict[str, Any]:
    """One CLI run in ``mode``; timeline offsets from the launch, phases, tree CPU at the first call."""
    timeline = work / f"timeline-{mode}-{n}.tsv"
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    env.update({"HOME": str(work / "home"), "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")})
    flags = ["--startup-log", str(timeline), "--call-log", str(work / f"calls-{mode}-{n}.log"), *MODES[mode]]
    (work / "home").mkdir(exist_ok=True)
    out_dir = work / f"runs-{mode}-{n}"  # fresh: no score cache, the model is really called
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    t0 = time.time()
    cwd = work / UP_FOLDER if mode == "reused" else work
    proc = subprocess.Popen([sys.executable, "-m", "certeval", *COMMAND, *flags, "--output", str(out_dir)], cwd=cwd,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    cpu = None
    deadline = time.monotonic() + FIRST_CALL_TIMEOUT_S
    while proc.poll() is None and time.monotonic() < deadline:
        if timeline.is_file() and b"first_call\t" in timeline.read_bytes():
            cpu = tree_cpu_s(proc.pid)
            break
        time.sleep(0.05)
    try:
        _, err = proc.communicate(timeout=FIRST_CALL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    total = time.time() - t0
    marks = read_marks(timeline)
    if proc.returncode not in (0, 1) or "first_call" not in marks:
        raise RuntimeError(f"{mode} run {n} failed (exit {proc.returncode}, marks {sorted(marks)}): {err[-2000:]}")
    offsets = {k: round(v - t0, 3) for k, v in marks.items()}
    phases = {}
    for name, (start, end) in PHASES[mode].items():
        if end in offsets and (start is None or start in offsets):
            begin = 0.0 if start is None else offsets[start]
            phases[name] = {"start_s": round(begin, 3), "end_s": offsets[end], "seconds": round(offsets[end] - begin, 3)}
    shutil.rmtree(out_dir, ignore_errors=True)
    return {"mode": mode, "repeat": n, "first_call_s": offsets["first_call"], "exit_s": round(total, 3),
            "exit_code": proc.returncode, "tree_cpu_s_at_first_call": None if cpu is None else round(cpu, 2),
            "load_avg_before": None if load is None else [round(x, 2) for x in load], "marks": offsets,
            "phases": phases}


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per mode: first call, exit, tree CPU, and each phase's start, end and length."""
    out: dict[str, Any] = {}
    for mode in MODES:
        mine = [r for r in runs if r["mode"] == mode]
        if not mine:
            continue
        cpu = [r["tree_cpu_s_at_first_call"] for r in mine if r["tree_cpu_s_at_first_call"] is not None]
        phases = {}
        for name in PHASES[mode]:
            rows = [r["phases"][name] for r in mine if name in r["phases"]]
            if rows:
                phases[name] = {k: round(statistics.median(row[k] for row in rows), 2)
                                for k in ("start_s", "end_s", "seconds")}
        out[mode] = {
            "repeats": len(mine),
            "first_call_s_median": round(statistics.median(r["first_call_s"] for r in mine), 2),
            "first_call_s_all": [r["first_call_s"] for r in mine],
            "exit_s_median": round(statistics.median(r["exit_s"] for r in mine), 2),
            "tree_cpu_s_at_first_call_median": round(statistics.median(cpu), 2) if cpu else None,
            "phases_median": phases,
        }
    if "reused" in out:
        out["reused_first_call_within_5_s"] = out["reused"]["first_call_s_median"] <= 5.0
    if "before" in out and "after" in out:
        out["first_call_saved_s"] = round(out["before"]["first_call_s_median"] - out["after"]["first_call_s_median"], 2)
        out["first_call_speedup"] = round(out["before"]["first_call_s_median"] / out["after"]["first_call_s_median"], 2)
    return out


def under_load(runs: int = 5, busy: int = 3) -> dict[str, Any]:
    """The default command ``runs`` times in a row beside ``busy`` CPU-bound processes (every run must finish)."""
    work = Path(tempfile.mkdtemp(prefix="certeval-startup-load-"))
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(busy)]
    rows, failures = [], []
    try:
        time.sleep(5.0)  # the load average starts to show the loops
        run_once("after", work, 0)  # warm-up: creates the folder's .prefect/
        for n in range(1, runs + 1):
            try:
                r = run_once("after", work, n)
                rows.append({k: r[k] for k in ("first_call_s", "exit_s", "exit_code", "load_avg_before")})
                print(f"under load #{n}: first call at {r['first_call_s']:.1f} s, exit {r['exit_s']:.1f} s, "
                      f"load {r['load_avg_before']}", flush=True)
            except RuntimeError as exc:
                failures.append(str(exc)[:500])
    finally:
        for loop in loops:
            loop.kill()
            loop.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)
    return {"busy_processes": busy, "runs": rows, "failures": failures, "all_finished": not failures,
            "first_call_s_median": round(statistics.median(r["first_call_s"] for r in rows), 2) if rows else None,
            "exit_s_median": round(statistics.median(r["exit_s"] for r in rows), 2) if rows else None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 repeat per mode, no warm-up run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per mode (default 3)")
    ap.add_argument("--seed", type=int, default=0, help="unused (recorded for the JSON's metadata)")
    ap.add_argument("--under-load", action="store_true",
                    help="only the 5 runs beside 3 CPU-bound processes, added to the stored result")
    args = ap.parse_args(argv)
    if args.under_load:
        from benchmarks._meta import read_result

        stored = read_result("startup", args.quick) or {}
        stored.pop("meta", None)
        stored["under_load"] = under_load(runs=2 if args.quick else 5)
        print(f"wrote {write_result('startup', stored, args.quick, seed=args.seed)}")
        return 0 if stored["under_load"]["all_finished"] else 1
    repeats = 1 if args.quick else max(1, args.repeats)
    work = Path(tempfile.mkdtemp(prefix="certeval-startup-"))
    runs: list[dict[str, Any]] = []
    cold = None
    try:
        services(work, "up")  # outside the timed runs: started once, as a user would before a day of runs
        if not args.quick:  # creates and migrates ./.prefect once, as a first command in a project would
            cold = run_once("after", work, 0)
            print(f"warm-up (new .prefect/): first call at {cold['first_call_s']:.1f} s", flush=True)
        for n in range(1, repeats + 1):
            for mode in MODES:
                r = run_once(mode, work, n)
                runs.append(r)
                print(f"{mode:>6} #{n}: first call at {r['first_call_s']:.2f} s (exit {r['exit_s']:.1f} s, tree CPU "
                      f"{r['tree_cpu_s_at_first_call']} s, load {r['load_avg_before']})", flush=True)
    finally:
        try:
            services(work, "down")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    summary = summarise(runs)
    loads = [r["load_avg_before"][0] for r in runs if r["load_avg_before"]]
    payload = {
        "command": "python -m certeval " + " ".join(COMMAND) + " --output <fresh folder>",
        "setup": "zero-config: temporary cwd and HOME, no PREFECT_*/RAY_ADDRESS; embedded Prefect server and local "
                 "Ray on 127.0.0.1; fresh output folder per run (no score cache)",
        "modes": {"before": "--sequential-start (sequential start-up)", "after": "default (certeval.services.fast_start)",
                  "reused": "default, from a folder where certeval up runs a Ray head and a Prefect server"},
        "repeats": repeats,
        "cpus": os.cpu_count(),
        "load_avg_1min_median": round(statistics.median(loads), 2) if loads else None,
        "load_avg_1min_range": [min(loads), max(loads)] if loads else None,
        "cold_first_run_s": None if cold is None else cold["first_call_s"],
        "summary": summary,
        "runs": runs,
        "seed": args.seed,
    }
    path = write_result("startup", payload, args.quick, seed=args.seed)
    for mode in MODES:
        if mode in summary:
            print(f"{mode}: first call median {summary[mode]['first_call_s_median']} s over {repeats} run(s)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
