"""The whole pipeline on a GPU — Prefect's embedded server, a local Ray, the hf host as a Ray actor — beside a bare loop.

    python -m benchmarks gpu_pipeline [--device cuda|cpu] [--shape 1b|135m|tiny] [--n 2000] [--batch 64]
                                      [--look 256] [--goal halfwidth:0.05] [--model-config DIR] [--quick]
    python -m benchmarks gpu_pipeline --check-only      # imports and a local Ray's resources, then exit

Every step is the real one: ``certeval certify`` and ``certeval compare`` run as a user runs them (their own
process, Prefect's embedded server, a local Ray that finds the GPU, each model an hf actor holding its GPU share
— ``--num-gpus 1`` for certify, 0.5 each for compare's two — bf16, packed multiple-choice rows). Beside them, in
this process and on the same GPU: the textbook transformers loop (:func:`benchmarks.gpu.bare_loglik`, batch for
batch: ``--batch`` pairs a forward pass) and the hf host called in-process (``--batch`` packed rows a forward pass),
each over every item.

The model: no weights can travel to the GPU machines, so a Llama-shaped model is built from SmolLM2's config and
tokenizer (``--model-config``; ``benchmarks/device/bundle.py`` packs them) with random weights (seeded), widened by
``--shape``: ``1b`` (hidden 2048, 16 layers, intermediate 8192, 32 heads, 8 KV heads: 1.07B parameters), ``135m``
(SmolLM2's own), ``tiny`` (a 2-layer toy for CPU checks). It is saved to a temporary folder as the pipeline's
``hf:`` model; compare's second model is the same shape with the next seed. The bank: ``--n`` synthetic four-choice
questions (:func:`synthetic_mc_items`, seeded): random weights make answers meaningless, so only the work is real.

Reported (``benchmarks/results/gpu_pipeline.json``, ``gpu_pipeline_cpu.json`` off the GPU): items/s of the bare
loop, the in-process host and the pipeline's rounds; the pipeline's phases from each command's start-up timeline
(``--startup-log``: start-up, model load in the actor, rounds from the first scoring call to the last round's
file, finish) with the GPU busy fraction in each (``nvidia-smi`` sampled every 0.5 s); per-item agreement of the
pipeline's log-likelihoods (the rounds' ``resps``) with the bare loop's for the first model: the same choice, and
each choice's log-likelihood within the packed-row check's tolerance for the dtype
(:data:`certeval.hosting.hf_packed.SELF_CHECK_TOLERANCE`, relative to max(1, |ll|)).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._meta import write_result  # noqa: E402
from benchmarks.gpu import _sync, bare_loglik  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPES = {
    "1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
           "num_key_value_heads": 8, "head_dim": 64},
    "135m": {},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16},
}
_WORDS = ("river", "mountain", "engine", "garden", "letter", "village", "market", "signal", "harbor", "winter",
          "copper", "lantern", "meadow", "circuit", "planet", "theory", "violin", "desert", "island", "bridge",
          "archive", "canvas", "falcon", "glacier", "harvest", "journal", "kingdom", "ledger", "mirror", "orchard",
          "pilot", "quarry", "ribbon", "saddle", "timber", "valley", "whistle", "anchor", "beacon", "compass")
_ASKS = ("Which {a} was first recorded near the {b} of the {c}?", "What does the {a} beside the old {b} measure?",
         "In the story of the {a} and the {b}, who carried the {c} across the {d}?",
         "Which of these is kept inside a {a} during the {b} season, according to the {c} ledger?",
         "The {a} of the northern {b} is best known for which {c}?")


def synthetic_mc_items(n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` four-choice questions of 8-25 words, answers of one to three words, the right one at a seeded place."""
    rng = np.random.default_rng(seed)
    items = []
    for k in range(n):
        words = rng.choice(_WORDS, size=4, replace=False)
        question = str(rng.choice(_ASKS)).format(a=words[0], b=words[1], c=words[2], d=words[3])
        choices = [" ".join(rng.choice(_WORDS, size=int(rng.integers(1, 4)))) for _ in range(4)]
        while len(set(choices)) < 4:  # distinct choices: a tie would make "the same choice" ambiguous
            choices[int(rng.integers(4))] = " ".join(rng.choice(_WORDS, size=int(rng.integers(1, 4))))
        items.append({"item_id": f"q{k:05d}", "question": question, "choices": choices,
                      "answer": int(rng.integers(4))})
    return items


class UtilizationSampler:
    """``nvidia-smi`` utilization every 0.5 s, each sample stamped on arrival (wall clock, as the timelines)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          "-lms", "500"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.samples.append((time.time(), float(line.strip().split(",")[0])))
            except ValueError:
                continue

    def busy(self, start: float | None, end: float | None) -> float | None:
        if start is None or end is None:
            return None
        values = [u for t, u in self.samples if start <= t <= end]
        return float(np.mean(values)) / 100.0 if values else None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def build_model(config_dir: Path, shape: str, dtype: str, device: str, seed: int, save_to: Path | None):
    """A causal LM of ``config_dir``'s architecture widened to ``shape``, random weights from ``seed``, built on the
    device (a 1B model in float32 on the CPU first would take minutes); saved with the tokenizer to ``save_to``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    config = AutoConfig.from_pretrained(config_dir)
    for key, value in SHAPES[shape].items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype)).eval()
    tokenizer = AutoTokenizer.from_pretrained(config_dir)
    if save_to is not None:
        model.save_pretrained(save_to)
        tokenizer.save_pretrained(save_to)
    return model, tokenizer


def read_timeline(path: Path) -> dict[str, list[float]]:
    """``--startup-log``'s lines (phase, unix time, pid) as phase -> times (one per process that marked it)."""
    marks: dict[str, list[float]] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                marks.setdefault(parts[0], []).append(float(parts[1]))
    return marks


def run_cli(command: str, models: list[str], bank: Path, work: Path, extra: list[str], log,
            timeout_s: float) -> dict[str, Any]:
    """``python -m certeval COMMAND`` in its own process and folder, as a user runs it; its wall-clock phases."""
    timeline = work / f"{command}.timeline"
    cmd = [sys.executable, "-m", "certeval", command, *[a for m in models for a in ("--model", m)],
           "--bank", str(bank), "--output", str(work / "runs"), "--run-id", command, "--json",
           "--startup-log", str(timeline), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    t0 = time.time()
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=log, text=True,
                            start_new_session=True)
    try:
        stdout, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise RuntimeError(f"certeval {command} did not finish within --command-timeout {timeout_s:g} s") from None
    end = time.time()
    if proc.returncode not in (0, 1):  # 1: ran, goal not reached
        raise RuntimeError(f"certeval {command} exited {proc.returncode}; see the log")
    results = json.loads(stdout)
    marks = read_timeline(timeline)
    rounds = sorted((work / "runs" / command / "rounds").glob("*.parquet"))
    first_call = min(marks.get("first_call", [np.nan]))
    last_round = max(p.stat().st_mtime for p in rounds) if rounds else np.nan
    ready = max(max(marks.get("actors_ready", [np.nan])), max(marks.get("flow_started", [np.nan])))
    loaded = [b - a for a, b in zip(sorted(marks.get("actor_started", [])), sorted(marks.get("model_loaded", [])))]
    scored = sum(int(m["n_scored"]) for m in results["models"])
    return {
        "command": " ".join(Path(c).name if c == sys.executable else c for c in cmd[1:]), "exit": proc.returncode,
        "wall_s": end - t0, "items_scored": scored, "rounds": int(results["rounds"]), "reached": results["reached"],
        "models": [{k: m.get(k) for k in ("model", "n_scored", "mean", "lower", "upper", "rule")}
                   for m in results["models"]],
        "pairs": results.get("pairs"),
        "phases": {"startup_s": ready - t0, "model_load_s": max(loaded) if loaded else None,
                   "rounds_s": last_round - first_call, "finish_s": end - last_round},
        "items_per_s": scored / (last_round - first_call),
        "_spans": {"startup": (t0, ready), "rounds": (first_call, last_round)},
        "_rounds_files": rounds,
    }


def pipeline_logliks(rounds_files: list[Path], model: str) -> dict[str, list[float]]:
    """item id -> the pipeline's log-likelihood of each choice (the rounds' ``resps`` column, lm-eval's
    ``(loglik, is_greedy)`` per choice)."""
    import pandas as pd

    frame = pd.concat([pd.read_parquet(p) for p in rounds_files], ignore_index=True)
    frame = frame[frame["model"] == model]
    return {str(r.item_id): [float(pair[0]) for pair in json.loads(r.resps)] for r in frame.itertuples()
            if isinstance(r.resps, str)}


def agreement(pipeline: dict[str, list[float]], bare: dict[str, list[float]], dtype: str) -> dict[str, Any]:
    """Same choice, and every choice's log-likelihood within the dtype's tolerance, item by item."""
    from certeval.hosting.hf_packed import SELF_CHECK_TOLERANCE

    tolerance = SELF_CHECK_TOLERANCE.get(dtype, 2e-2)
    ids = [i for i in pipeline if i in bare]
    same = [int(np.argmax(pipeline[i])) == int(np.argmax(bare[i])) for i in ids]
    gaps = [np.abs(np.subtract(pipeline[i], bare[i])) / np.maximum(1.0, np.abs(bare[i])) for i in ids]
    return {"items": len(ids), "same_choice_fraction": float(np.mean(same)) if ids else None,
            "within_tolerance_fraction": float(np.mean([bool(np.all(g <= tolerance)) for g in gaps])) if ids else None,
            "max_relative_gap": float(max(g.max() for g in gaps)) if ids else None, "tolerance": tolerance}


def ray_counts_gpus() -> int | None:
    """How many GPUs a local Ray started now would count (Ray's own NVIDIA detection, through NVML); None when
    that cannot be asked."""
    try:
        from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager

        return int(NvidiaGPUAcceleratorManager.get_current_node_num_accelerators())
    except Exception:  # noqa: BLE001 - a private API: any failure means "cannot tell", and certeval's Ray decides
        return None


def start_shared_ray(work: Path, num_gpus: int) -> str:
    """A local Ray in this process, told ``num_gpus``, for the commands to join: loopback only, cloud probes off
    (certeval.runtime.envsetup), its auth token in ``work`` and named by ``RAY_AUTH_TOKEN_PATH`` so the commands (which
    inherit it) are let in. Ends with this process. Returns its address."""
    import secrets

    import ray

    from certeval.runtime.envsetup import configure_offline_env, ray_bootstrap_home

    configure_offline_env()
    token = work / "ray-auth-token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    os.environ["RAY_AUTH_TOKEN_PATH"] = str(token)
    real_home = os.environ.get("HOME", str(Path.home()))
    os.environ["HOME"] = str(ray_bootstrap_home(work))  # Ray's usage stats probe cloud metadata without it
    try:
        ray.init(address="local", include_dashboard=False, num_gpus=num_gpus, _node_ip_address="127.0.0.1",
                 runtime_env={"env_vars": {"HOME": real_home}})
    finally:
        os.environ["HOME"] = real_home
    return ray.get_runtime_context().gcs_address


def check_only() -> int:
    """Import what the pipeline needs, start a local Ray and print its resources (a one-minute smoke test); exit 1
    when Ray, Prefect, its server or certeval's flows do not import, or (with torch's GPU) Ray finds no GPU."""
    import importlib

    from certeval.runtime.envsetup import configure_offline_env

    configure_offline_env()
    found: dict[str, Any] = {}
    for name in ("torch", "transformers", "ray", "prefect", "pydantic", "sqlalchemy", "fastapi", "certeval",
                 "prefect.server.api.server", "certeval.flows.pipeline"):
        try:
            found[name] = getattr(importlib.import_module(name), "__version__", "imported")
        except ImportError as exc:
            found[name] = f"MISSING: {exc}"
    needed = ("ray", "prefect", "prefect.server.api.server", "certeval.flows.pipeline")
    ok = not any(str(found[name]).startswith("MISSING") for name in needed)
    cuda = False
    if not str(found["torch"]).startswith("MISSING"):
        import torch

        cuda = torch.cuda.is_available()
        found["cuda_device"] = torch.cuda.get_device_name(0) if cuda else None
    if ok:
        import ray

        ray.init(address="local", include_dashboard=False, num_cpus=2)
        try:
            found["ray_resources"] = {k: v for k, v in ray.cluster_resources().items() if k in ("CPU", "GPU")}
        finally:
            ray.shutdown()
        ok = found["ray_resources"].get("GPU", 0) >= 1 or not cuda
    print(json.dumps(found))
    print("check-only:", "ok" if ok else "FAILED")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks gpu_pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda (default when torch sees a GPU) or cpu")
    parser.add_argument("--dtype", default=None, help="bfloat16 (cuda default) or float32 (cpu default)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default=None, help="1b (cuda default), tiny (cpu default)")
    parser.add_argument("--model-config", default=None, help="folder with config.json and the tokenizer (default: "
                        "$CERTEVAL_MODEL_CONFIG, else SmolLM2's converted folder)")
    parser.add_argument("--n", type=int, default=None, help="items (default 2000; --quick 12)")
    parser.add_argument("--batch", type=int, default=None, help="pairs (bare) / packed rows (host) per forward pass")
    parser.add_argument("--look", type=int, default=None, help="items per round and model (default 256; --quick 4)")
    parser.add_argument("--goal", default="halfwidth:0.05", help="certify's goal")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--command-timeout", type=float, default=900.0,
                        help="seconds one certeval command may take, start-up included (default 900)")
    parser.add_argument("--workdir", default=None, help="models, bank and run folders (default: a temporary folder)")
    parser.add_argument("--shared-ray", action="store_true",
                        help="start one local Ray here, told the GPU count, for both commands to join (automatic "
                             "when Ray's own NVML detection counts no GPU)")
    parser.add_argument("--check-only", action="store_true", help="import everything, start Ray, print versions")
    parser.add_argument("--quick", action="store_true", help="tiny model on CPU, 12 items: shows it runs")
    args = parser.parse_args(argv)
    if args.check_only:
        return check_only()

    import torch
    import transformers

    device = args.device or ("cpu" if args.quick or not torch.cuda.is_available() else "cuda")
    cuda = device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("--device cuda, but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    shape = args.shape or ("1b" if cuda else "tiny")
    n = args.n or (12 if args.quick else 2000)
    batch = args.batch or (64 if cuda else 16)
    look = args.look or (4 if args.quick else 256)
    goal = "halfwidth:0.45" if args.quick and args.goal == parser.get_default("goal") else args.goal
    for flag, value in (("--n", n), ("--batch", batch), ("--look", look)):
        if value < 1:
            print(f"{flag} must be a positive integer; got {value}", file=sys.stderr)
            return 2
    config_dir = args.model_config or os.environ.get("CERTEVAL_MODEL_CONFIG")
    if config_dir is None:
        from certeval.inputs.smollm import ensure_converted

        config_dir = str(ensure_converted())
    if not (Path(config_dir) / "config.json").is_file():
        print(f"--model-config {config_dir!r} holds no config.json", file=sys.stderr)
        return 2

    work = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="certeval-gpu-pipeline-"))
    work.mkdir(parents=True, exist_ok=True)
    log = open(work / "commands.log", "a")  # noqa: SIM115 - closed in finally
    sampler = UtilizationSampler() if cuda else None
    try:
        return _run(args, work, log, sampler, device, dtype, shape, n, batch, look, goal, Path(config_dir),
                    torch, transformers)
    finally:
        log.close()
        if sampler:
            sampler.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)


def _run(args, work, log, sampler, device, dtype, shape, n, batch, look, goal, config_dir, torch,
         transformers) -> int:
    from certeval.hosting.hf import HFHost, HFOptions
    from certeval.inputs.model_spec import parse_model_spec
    from certeval.scoring import scorers as sc

    cuda = device.startswith("cuda")
    items = synthetic_mc_items(n, args.seed)
    bank = work / "bank.jsonl"
    bank.write_text("".join(json.dumps(item) + "\n" for item in items))
    spans: dict[str, tuple[float, float]] = {}

    t0 = time.time()
    dirs = [work / "model-a", work / "model-b"]
    model, tokenizer = build_model(config_dir, shape, dtype, device, args.seed, dirs[0])
    build_model(config_dir, shape, dtype, device, args.seed + 1, dirs[1])  # compare's second model, saved only
    spans["model_build"] = (t0, time.time())
    params = sum(p.numel() for p in model.parameters())

    requests = [sc.mc_request(item) for item in items]
    pairs = [(ctx, cont) for ctx, conts in requests for cont in conts]
    spec = parse_model_spec(f"hf:{dirs[0]}?device={device}&dtype={dtype}&batch={batch}")
    host = HFHost(spec, model, tokenizer, HFOptions(device=device, dtype=dtype, batch_size=batch, scorer="mc-loglik"))
    host.score(items[: min(4, n)])  # warm-up: kernels, allocator, tokenizer caches
    bare_loglik(model, tokenizer, pairs[: 4 * batch], batch, device)

    def timed(name: str, fn) -> Any:
        _sync(device)
        start = time.time()
        out = fn()
        _sync(device)
        spans[name] = (start, time.time())
        return out

    bare_ll, _ = timed("bare", lambda: bare_loglik(model, tokenizer, pairs, batch, device))
    timed("host", lambda: [r for s in range(0, n, look) for r in host.score(items[s:s + look])])
    bare: dict[str, list[float]] = {}
    pos = 0
    for item, (_, conts) in zip(items, requests):
        bare[str(item["item_id"])] = bare_ll[pos:pos + len(conts)]
        pos += len(conts)
    host = model = None  # this process lets go of the weights: the actors get the GPU's memory
    if cuda:
        torch.cuda.empty_cache()

    specs = [f"hf:{d}?device={device}&dtype={dtype}&batch={batch}" for d in dirs]
    common = ["--batch-size", str(look), "--seed", str(args.seed)]
    ray_gpus = ray_counts_gpus() if cuda else None
    ray_start = "each command starts its own local Ray (certeval's default), which counts the GPU"
    if args.shared_ray or (cuda and ray_gpus == 0):  # one local Ray told the GPU count, both commands join it
        common += ["--ray-address", start_shared_ray(work, torch.cuda.device_count() if cuda else 0)]
        ray_start = (f"{'--shared-ray' if args.shared_ray else 'Ray counted 0 GPUs through NVML'}: the benchmark "
                     f"started one local Ray with num_gpus={torch.cuda.device_count() if cuda else 0} and both "
                     f"commands joined it (--ray-address)")
        print(f"gpu_pipeline: {ray_start}", file=sys.stderr)
    gpus = ["--num-gpus", "1"] if cuda else []
    runs = {}
    for name, models, extra in (("certify", specs[:1], ["--goal", goal, "--method", "uniform", *common, *gpus]),
                                ("compare", specs, [*common, *(["--num-gpus", "0.5"] if cuda else [])])):
        try:  # a failed command is recorded and the other still runs: one device call brings back what it can
            runs[name] = run_cli(name, models, bank, work, extra, log, args.command_timeout)
            runs[name]["agreement_first_model"] = agreement(
                pipeline_logliks(runs[name].pop("_rounds_files"), dirs[0].name), bare, dtype)
        except (RuntimeError, ValueError, KeyError, OSError) as exc:
            runs[name] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"gpu_pipeline: {name} failed: {runs[name]['error']}", file=sys.stderr)
    certify, compare = runs["certify"], runs["compare"]

    if sampler:
        time.sleep(1.0)  # samples arrive up to 0.5 s late
    busy = (lambda s: sampler.busy(*s)) if sampler else (lambda s: None)
    seconds = {k: e - s for k, (s, e) in spans.items()}
    bare_ips = n / seconds["bare"]
    for run in (r for r in (certify, compare) if "error" not in r):
        run_spans = run.pop("_spans")
        run["gpu_busy_fraction"] = {k: busy(v) for k, v in run_spans.items()}
        run["pipeline_over_bare_items_per_s"] = run["items_per_s"] / bare_ips
    payload = {
        "seed": args.seed, "device": device, "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "versions_extra": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "cuda": torch.version.cuda},
        "model": f"random weights, shape {shape} ({params / 1e9:.3g}B parameters)", "dtype": dtype,
        "ray_start": ray_start, "ray_gpus_detected": ray_gpus,
        "n_items": n, "n_pairs": len(pairs), "batch": batch, "look_items": look, "goal": goal,
        "items_source": "synthetic four-choice questions (benchmarks.gpu_pipeline.synthetic_mc_items, seeded)",
        "phases_here": {k: {"seconds": seconds[k], "gpu_busy_fraction": busy(spans[k])} for k in spans},
        "bare_transformers": {"seconds": seconds["bare"], "items_per_s": bare_ips},
        "host": {"seconds": seconds["host"], "items_per_s": n / seconds["host"]},
        "host_over_bare_items_per_s": seconds["bare"] / seconds["host"],
        "certify": certify, "compare": compare,
        "pipeline_over_bare_items_per_s": certify.get("pipeline_over_bare_items_per_s"),
    }
    path = write_result("gpu_pipeline" if cuda else "gpu_pipeline_cpu", payload, args.quick, seed=args.seed)
    print(summary_table(payload))
    print(f"wrote {path}")
    return 3 if "error" in certify or "error" in compare else 0


def summary_table(d: dict[str, Any]) -> str:
    """A short plain-text table of the run (what a device call prints last)."""
    def f(x, digits=2):
        return "-" if x is None else f"{x:.{digits}f}"

    lines = [f"{d['device_name']} | {d['model']} | {d['dtype']} | {d['n_items']} items, batch {d['batch']}, "
             f"looks of {d['look_items']}",
             f"{'path':<10} {'items/s':>9} {'x bare':>7} {'start s':>8} {'load s':>7} {'rounds s':>9} "
             f"{'GPU busy':>9} {'same choice':>12} {'ll within tol':>14}",
             f"{'bare':<10} {f(d['bare_transformers']['items_per_s'], 1):>9} {'1.00':>7} {'':>8} {'':>7} "
             f"{f(d['bare_transformers']['seconds']):>9} {f(d['phases_here']['bare']['gpu_busy_fraction']):>9}",
             f"{'host':<10} {f(d['host']['items_per_s'], 1):>9} {f(d['host_over_bare_items_per_s']):>7} {'':>8} "
             f"{'':>7} {f(d['host']['seconds']):>9} {f(d['phases_here']['host']['gpu_busy_fraction']):>9}"]
    for name in ("certify", "compare"):
        r = d[name]
        if "error" in r:
            lines.append(f"{name:<10} FAILED: {r['error']}")
            continue
        a = r["agreement_first_model"]
        lines.append(f"{name:<10} {f(r['items_per_s'], 1):>9} {f(r['pipeline_over_bare_items_per_s']):>7} "
                     f"{f(r['phases']['startup_s'], 1):>8} {f(r['phases']['model_load_s'], 1):>7} "
                     f"{f(r['phases']['rounds_s']):>9} {f(r['gpu_busy_fraction']['rounds']):>9} "
                     f"{f(a['same_choice_fraction'], 3):>12} {f(a['within_tolerance_fraction'], 3):>14}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
