"""A certify through the round engine, with the hf host on the GPU, beside a bare transformers loop.

    python -m benchmarks.gpu_pipeline --device cuda --model DIR --random-weights --shape 1b
                                      --items DIR/items.jsonl [--n 2000] [--batch 64] [--look 128]
                                      [--goal halfwidth:0.05] [--quick]

What a live run does between looks, in one process: :class:`certeval.engine.SingleModelRounds` proposes a look's
items, :class:`certeval.backends.hf.HFHost` scores them on the device (the call a model actor receives), the
method updates and the goal's rules decide — then the next look. Ray and Prefect are not here (the GPU machines
have torch and transformers only): their per-look cost is measured on CPU by ``benchmarks overhead``.

Three timed phases over the same items, same weights (one model in memory), same batch size:

* bare: the textbook loop (:func:`benchmarks.gpu.bare_loglik`) over every item — a full harness run;
* host: ``HFHost.score`` over every item in calls of ``--look`` items (the inference a pipeline pays);
* pipeline: the certify, look by look, until its goal is met; its items/s counts the controller's time too.

With ``nvidia-smi`` present, the GPU's utilization is sampled every 0.5 s and averaged over each phase (the busy
fraction). ``--shape 1b`` widens the model dir's config to a ~1.1B-parameter shape (hidden 2048, 16 layers,
intermediate 8192, 32 heads, 8 KV heads): random weights, a realistic cost per token, meaningless answers.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._meta import write_result  # noqa: E402
from benchmarks.gpu import _sync, bare_loglik, read_items, trivia_mc_items  # noqa: E402

SHAPE_1B = {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 64}


class UtilizationSampler:
    """``nvidia-smi`` utilization every 0.5 s, each sample stamped on arrival (monotonic clock)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                                          "-lms", "500"], stdout=subprocess.PIPE, text=True)
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.samples.append((time.monotonic(), float(line.strip().split(",")[0])))
            except ValueError:
                continue

    def busy(self, start: float, end: float) -> float | None:
        values = [u for t, u in self.samples if start <= t <= end]
        return float(np.mean(values)) / 100.0 if values else None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


def load_model(model_dir: str, device: str, dtype: str, random_weights: bool, shape: str, seed: int):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    config = AutoConfig.from_pretrained(model_dir)
    if shape == "1b":
        for key, value in SHAPE_1B.items():
            setattr(config, key, value)
    if random_weights or shape != "same":
        torch.manual_seed(seed)
        with torch.device(device):  # built on the device: a 1B model in float32 on the CPU first would take minutes
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
    return model.eval(), tokenizer


def certify_by_rounds(host: Any, items: list[dict], goal_text: str, method_name: str, look: int, seed: int,
                      device: str) -> dict[str, Any]:
    """The certify's rounds (the engine's loop), inference by the host: items scored, interval, and where the
    time went (inference vs the controller: select, update, decide)."""
    from certeval.engine import SingleModelRounds, play
    from certeval.estimators import method_for_goal
    from certeval.estimators.goals import parse_goal
    from certeval.estimators.protocol import BankSpec

    goal = parse_goal(goal_text)
    method = method_for_goal(method_name, goal, None)
    method.start(BankSpec(n_items=len(items)))
    rounds = SingleModelRounds({"model": method}, goal, n_items=len(items), batch_size=look)
    rng = np.random.default_rng(seed)
    clock = {"inference_s": 0.0, "looks": 0}

    class Steps:
        done = property(lambda self: not rounds.active)

        def select(self):
            return rounds.select(lambda _label: rng, look=clock["looks"] + 1) or None

        def infer(self, proposals):
            t0 = time.perf_counter()
            pos = proposals["model"].items
            scores = np.array([r["score"] for r in host.score([items[int(i)] for i in pos])], dtype=float)
            _sync(device)
            clock["inference_s"] += time.perf_counter() - t0
            return pos, scores

        def update(self, batch):
            rounds.update("model", *batch)

        def decide(self, batch):
            rounds.decide(["model"], look=clock["looks"] + 1)

        def record(self, batch):
            clock["looks"] += 1

    t0 = time.perf_counter()
    play(Steps())
    wall = time.perf_counter() - t0
    est, decision = method.result(), rounds.decisions["model"]
    return {"wall_s": wall, "inference_s": clock["inference_s"], "controller_s": wall - clock["inference_s"],
            "looks": clock["looks"], "items_scored": int(est.n_scored), "items_per_s": int(est.n_scored) / wall,
            "mean": float(est.mean), "interval": [float(est.lower), float(est.upper)],
            "reached": bool(decision.reached), "rule": decision.rule}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None, help="float32 (cpu default) or bfloat16 (cuda default)")
    parser.add_argument("--model", default=None, help="local model dir (default: the packaged SmolLM2-135M)")
    parser.add_argument("--random-weights", action="store_true", help="model dir holds config+tokenizer only")
    parser.add_argument("--shape", choices=("same", "1b"), default="same", help="the model dir's shape, or ~1.1B")
    parser.add_argument("--items", default=None, help="JSONL items (default: trivia multiple choice)")
    parser.add_argument("--n", type=int, default=None, help="items (default 2000 cuda, 200 cpu; --quick 8)")
    parser.add_argument("--batch", type=int, default=None, help="pairs per forward pass (16 cpu, 64 cuda)")
    parser.add_argument("--look", type=int, default=None, help="items per look (default 128; --quick 4)")
    parser.add_argument("--goal", default="halfwidth:0.05")
    parser.add_argument("--method", default="uniform")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)

    import torch
    import transformers

    from certeval.backends.base import parse_model_spec
    from certeval.backends.hf import HFHost, HFOptions

    cuda = args.device.startswith("cuda")
    if cuda and not torch.cuda.is_available():
        print("--device cuda, but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    n = args.n or (8 if args.quick else (2000 if cuda else 200))
    batch = args.batch or (64 if cuda else 16)
    look = args.look or (4 if args.quick else 128)
    goal = "halfwidth:0.45" if args.quick and args.goal == parser.get_default("goal") else args.goal
    model_dir = args.model
    if model_dir is None:
        from certeval.backends.smollm import ensure_converted

        model_dir = str(ensure_converted())
    items = read_items(args.items, n) if args.items else trivia_mc_items(n, args.seed)

    t0 = time.perf_counter()
    model, tokenizer = load_model(model_dir, args.device, dtype, args.random_weights, args.shape, args.seed)
    load_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    spec = parse_model_spec(f"hf:{model_dir}?device={args.device}&dtype={dtype}&batch={batch}")
    host = HFHost(spec, model, tokenizer, HFOptions(device=args.device, dtype=dtype, batch_size=batch,
                                                    scorer="mc-loglik"))
    from certeval.backends import scorers as sc

    pairs = [(ctx, cont) for ctx, conts in (sc.mc_request(item) for item in items) for cont in conts]
    host.score(items[: min(4, len(items))])  # warm-up: kernels, allocator, tokenizer caches
    bare_loglik(model, tokenizer, pairs[: 4 * batch], batch, args.device)

    sampler = UtilizationSampler() if cuda else None
    phases: dict[str, dict[str, Any]] = {}

    def timed(name: str, fn) -> Any:
        _sync(args.device)
        start = time.monotonic()
        out = fn()
        _sync(args.device)
        end = time.monotonic()
        phases[name] = {"seconds": end - start, "gpu_busy_fraction": None, "start": start, "end": end}
        return out

    timed("bare", lambda: bare_loglik(model, tokenizer, pairs, batch, args.device))
    timed("host", lambda: [r for s in range(0, len(items), look) for r in host.score(items[s:s + look])])
    run = timed("pipeline", lambda: certify_by_rounds(host, items, goal, args.method, look, args.seed, args.device))
    if sampler:
        time.sleep(1.0)  # samples arrive up to 0.5 s late: average each phase once all of its samples are in
        for phase in phases.values():
            phase["gpu_busy_fraction"] = sampler.busy(phase.pop("start"), phase.pop("end"))
        sampler.stop()
    else:
        for phase in phases.values():
            phase.pop("start"), phase.pop("end")
    bare_ips = len(items) / phases["bare"]["seconds"]
    payload = {
        "seed": args.seed, "device": args.device,
        "device_name": torch.cuda.get_device_name(0) if cuda else "cpu",
        "versions_extra": {"torch": torch.__version__, "transformers": transformers.__version__,
                           "cuda": torch.version.cuda},
        "model": f"{'random weights, ' if args.random_weights or args.shape != 'same' else ''}shape "
                 f"{args.shape} ({params / 1e9:.2f}B parameters)",
        "dtype": dtype, "n_items": len(items), "n_pairs": len(pairs), "batch_pairs": batch, "look_items": look,
        "goal": goal, "method": args.method, "load_s": load_s, "phases": phases,
        "bare_items_per_s": bare_ips,
        "host_items_per_s": len(items) / phases["host"]["seconds"],
        "pipeline": run,
        "pipeline_over_bare_items_per_s": run["items_per_s"] / bare_ips,
        "certified_answer_s_over_bare_full_run_s": run["wall_s"] / phases["bare"]["seconds"],
    }
    path = write_result("gpu_pipeline" if cuda else "gpu_pipeline_cpu", payload, args.quick, seed=args.seed)
    print(f"bare {bare_ips:.1f} items/s over {len(items)}; host {payload['host_items_per_s']:.1f}; pipeline "
          f"{run['items_per_s']:.1f} ({payload['pipeline_over_bare_items_per_s']:.2f}x bare) — certified "
          f"[{run['interval'][0]:.3f}, {run['interval'][1]:.3f}] on {run['items_scored']} items in {run['wall_s']:.1f} s "
          f"vs {phases['bare']['seconds']:.1f} s for the full bare run")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
