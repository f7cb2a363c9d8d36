"""Controller overhead: time per round (partition + select + update + decide) vs bank size and models.

For each method and bank size N ∈ {1k, 12k, 100k, 1M} a method is started on a synthetic
bank (10 subsets, 8-dim features, Bernoulli scores with item difficulties drawn from
Beta(2, 2)), warmed up with ``warm`` items, and then ``rounds`` rounds of ``batch`` items are
timed one by one: ``propose`` (partition/select), ``update``, ``result`` and ``goal.decide``.
The per-round median is reported, the scaling exponent b of time ≈ a·N^b is fitted by least
squares on log–log, and the controller's time is set next to the inference time of one
round's batch on the replay backend and on the small real LM (SmolLM2-135M on CPU via the
hf backend) when it is installed. A second sweep holds N = 12k and grows the number of
models (one method object each, as the pipeline runs them).

A third part times the history method against uniform draws on recorded banks (helm_mmlu, vlm_ocrbench):
each rep evaluates one model with a random half of the other models as history and replays ``history`` and
``uniform`` with the same seed; per-look controller time is the replay's whole time (method start included) over
its looks, and the history prior's fit (once per model and rep, before the first look) is reported apart.

    python -m benchmarks overhead            # full
    python -m benchmarks overhead --quick    # 1k and 4k items, 1 and 2 models, 3 rounds; 2 reps of the history part
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402
from certeval.engine import SingleModelRounds, lookup  # noqa: E402
from certeval.estimators import BankSpec, make_method, parse_goal  # noqa: E402

SIZES = (1_000, 12_000, 100_000, 1_000_000)
METHODS = ("uniform", "adaptive", "seq", "cer-eval", "static")
MODEL_COUNTS = (1, 10, 100, 1000)
# --quick shows the sweep runs and writes its JSON: two small sizes (a scaling fit needs two), one or two models
QUICK_SIZES, QUICK_MODEL_COUNTS = (1_000, 4_000), (1, 2)
# sizes a method skips (none now: Cer-Eval's 1-NN re-fit compares items with the newly scored points
# only, so it runs at 1M items too; its re-fit rounds show in round_max_s)
SIZE_CAP: dict[str, int] = {}


def synthetic_bank(n_items: int, rng: np.random.Generator, n_subsets: int = 10, dim: int = 8):
    subsets = np.sort(rng.integers(0, n_subsets, n_items))
    subsets[:n_subsets] = np.arange(n_subsets)  # every subset present
    subsets.sort()
    feats = rng.standard_normal((n_items, dim))
    p = rng.beta(2, 2, n_items)
    scores = (rng.random(n_items) < p).astype(float)
    spec = BankSpec(n_items=n_items, subsets=subsets, subset_names=tuple(f"s{i}" for i in range(n_subsets)),
                    features=feats)
    return spec, scores


def time_rounds(method: str, spec: BankSpec, scores: np.ndarray, *, batch: int, warm: int, rounds: int,
                rng: np.random.Generator) -> dict:
    """Median seconds per round of each step of the round engine (the pipeline's and backtests' own,
    :class:`certeval.engine.SingleModelRounds`), after a warm-up of ``warm`` scored items."""
    goal = parse_goal("halfwidth:0.0001")  # never met: every round runs all steps
    t = time.perf_counter()
    obj = make_method(method).start(spec)
    start_s = time.perf_counter() - t
    engine = SingleModelRounds({"m": obj}, goal, n_items=spec.n_items, batch_size=batch)
    infer = lookup({"m": scores})
    scored = 0
    while scored < warm:
        prop = obj.propose(min(batch, warm - scored), rng)
        engine.update("m", prop.items, scores[prop.items])
        scored += len(prop)
    steps = {"propose": [], "update": [], "result": [], "decide": [], "round": []}
    for r in range(rounds):
        t0 = time.perf_counter()
        prop = engine.select(lambda _label: rng, look=r + 1)["m"]
        t1 = time.perf_counter()
        engine.update("m", prop.items, infer({"m": prop.items})["m"])
        t2 = time.perf_counter()
        engine.decide(["m"], look=r + 1)  # the estimate, then the goal's rules on it
        t3 = time.perf_counter()
        obj.result()  # the estimate alone, outside the round (decide computed it already)
        t4 = time.perf_counter()
        for k, v in zip(steps, (t1 - t0, t2 - t1, t4 - t3, t3 - t2, t3 - t0)):
            steps[k].append(v)
    out = {f"{k}_s": statistics.median(v) for k, v in steps.items()}
    out["round_max_s"] = max(steps["round"])
    out["start_s"] = start_s
    return out


HISTORY_BANKS = ("helm_mmlu", "vlm_ocrbench")
HISTORY_GOAL, HISTORY_BATCH, HISTORY_FRACTION = "halfwidth:0.05", 10, 0.5


def history_vs_uniform(bank_name: str, reps: int, seed: int) -> dict:
    """Per-look controller seconds of ``history`` and ``uniform`` on the same reps of a recorded bank."""
    from certeval.backtests.cells import Cell, DatasetArrays
    from certeval.backtests.kinds import run_chunk
    from certeval.backtests.single import _history_plan, score_matrix
    from certeval.inputs.banks import bank_from_scores, load_scores

    scores = load_scores(f"bundled:{bank_name}")
    bank = bank_from_scores(scores)
    models = sorted(scores["model"].unique())
    full = score_matrix(scores, models, bank)
    fit_s: list[float] = []
    plan = _history_plan(scores, bank, models, "history", None, HISTORY_FRACTION, False)

    def timed_plan(model, seed_seq):
        t = time.perf_counter()
        prior = plan(model, seed_seq)
        fit_s.append(time.perf_counter() - t)
        return prior

    data = DatasetArrays(name=bank_name, spec=bank.spec(), models=tuple(models), matrix=full, history_for=timed_plan)
    per_look: dict[str, list[float]] = {}
    items: dict[str, list[int]] = {}
    for method in ("uniform", "history"):
        cell = Cell(bank_name, method, HISTORY_GOAL, reps, HISTORY_BATCH, (("confidence", 0.95), ("target", "bank")))
        # rep r evaluates model r mod M, so the reps spread over the leaderboard
        rows = run_chunk(data, cell, 0, reps, seed)
        per_look[method] = [r["controller_s"] / max(r["looks"], 1) for r in rows]
        items[method] = [r["n_scored"] for r in rows]
    ratios = [h / u for h, u in zip(per_look["history"], per_look["uniform"])]
    return {"bank": bank_name, "reps": reps, "goal": HISTORY_GOAL, "batch": HISTORY_BATCH,
            "history_fraction": HISTORY_FRACTION, "models": len(models), "n_items": bank.n_items,
            "per_look_s_median": {m: statistics.median(v) for m, v in per_look.items()},
            "per_look_ratio_median": statistics.median(ratios), "per_look_ratio_max": max(ratios),
            "mean_items": {m: float(np.mean(v)) for m, v in items.items()},
            "prior_fit_s_median": statistics.median(fit_s), "within_2x": statistics.median(ratios) <= 2.0}


def fit_exponent(sizes: list[int], times: list[float]) -> dict:
    """Least-squares fit of log t = log a + b log N (needs ≥ 2 points)."""
    x, y = np.log(np.asarray(sizes, float)), np.log(np.asarray(times, float))
    if len(x) < 2:
        return {"exponent": None, "prefactor_s": None}
    b, loga = np.polyfit(x, y, 1)
    resid = y - (loga + b * x)
    # fixed per-round costs dominate small banks, so also give the slope between the two largest sizes
    local = float((y[-1] - y[-2]) / (x[-1] - x[-2]))
    return {"exponent": float(b), "prefactor_s": float(np.exp(loga)),
            "rms_log_residual": float(np.sqrt(np.mean(resid ** 2))),
            "exponent_largest_two": local, "largest_two": [int(sizes[-2]), int(sizes[-1])]}


def replay_inference(batch: int) -> dict:
    """Seconds for the replay backend to score one round's batch (in-process host, no Ray)."""
    from certeval.hosting.base import make_host
    from certeval.inputs.banks import load_scores

    frame = load_scores("bundled:helm_v023")
    model = sorted(frame["model"].unique())[0]
    host = make_host(f"replay:bundled:helm_v023#{model}")
    ids = host.item_ids
    items = [{"item_id": ids[i % len(ids)]} for i in range(batch)]
    times = []
    for _ in range(20):
        t = time.perf_counter()
        host.score(items)
        times.append(time.perf_counter() - t)
    return {"backend": "replay", "batch": batch, "round_s": statistics.median(times),
            "per_item_s": statistics.median(times) / batch}


def small_lm_inference(batch: int) -> dict:
    """Seconds for SmolLM2-135M (hf backend, CPU) to score ``batch`` multiple-choice items."""
    try:
        from certeval.hosting.base import make_host

        host = make_host("hf:bundled:smollm2")
    except Exception as exc:  # not installed / not built in this checkout: reported, not fatal
        return {"backend": "hf:smollm2", "error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    items = [{"item_id": f"q{i}", "question": f"What is {i} plus {i + 1}?",
              "choices": [str(2 * i + 1), str(2 * i), str(i), str(3 * i)], "answer": 0} for i in range(batch)]
    host.score(items[:2])  # warm-up (first call allocates)
    t = time.perf_counter()
    host.score(items)
    dt = time.perf_counter() - t
    host.close()
    return {"backend": "hf:smollm2 (SmolLM2-135M, CPU, mc-loglik, 4 choices)", "batch": batch, "round_s": dt,
            "per_item_s": dt / batch}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks overhead", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--batch", type=int, default=100, help="items per round (default 100)")
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--no-lm", action="store_true", help="skip the small-LM inference timing")
    args = p.parse_args(argv)
    quick = args.quick
    sizes = QUICK_SIZES if quick else SIZES
    rounds = 3 if quick else 10
    methods = args.methods.split(",")
    rng = np.random.default_rng(args.seed)
    banks = {n: synthetic_bank(n, rng) for n in sizes}
    by_size: list[dict] = []
    for method in methods:
        for n in sizes:
            if n > SIZE_CAP.get(method, n):
                continue
            spec, scores = banks[n]
            warm = min(n // 10, 2000)
            timed = min(rounds, (n - warm) // args.batch - 1)  # rounds that leave items unscored: the engine runs
            try:
                row = time_rounds(method, spec, scores, batch=args.batch, warm=warm, rounds=timed,
                                  rng=np.random.default_rng(args.seed))
            except Exception as exc:  # a method's bug is reported in the JSON, the sweep goes on
                row = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            row.update({"method": method, "n_items": n, "warm": warm, "rounds": timed, "batch": args.batch})
            by_size.append(row)
            print(f"[overhead] {method} N={n}: {row.get('round_s', float('nan')) * 1e3:.2f} ms/round "
                  f"{row.get('error', '')}", file=sys.stderr, flush=True)
    fits = {}
    for method in methods:
        ok = [r for r in by_size if r["method"] == method and "round_s" in r]
        fits[method] = fit_exponent([r["n_items"] for r in ok], [r["round_s"] for r in ok])
    # vs number of models at 12k items (--quick: the larger quick size; one method object per model, same scores)
    counts = QUICK_MODEL_COUNTS if quick else MODEL_COUNTS
    by_models = []
    models_n = max(sizes) if quick else 12_000
    spec, scores = banks[models_n]
    for method in ("uniform", "adaptive"):
        if method not in methods:
            continue
        for m in counts:
            objs = {f"m{i}": make_method(method).start(spec) for i in range(m)}
            rng_m = np.random.default_rng(args.seed)
            for o in objs.values():
                prop = o.propose(200, rng_m)
                o.update(prop.items, scores[prop.items])
            engine = SingleModelRounds(objs, parse_goal("halfwidth:0.0001"), n_items=spec.n_items, batch_size=args.batch)
            infer = lookup({label: scores for label in objs})
            times = []
            for r in range(3 if m >= 100 else rounds):  # one engine round over every model: select, infer, update, decide
                t = time.perf_counter()
                proposals = engine.select(lambda _label: rng_m, look=r + 1)
                got = infer({label: p.items for label, p in proposals.items()})
                for label, p in proposals.items():
                    engine.update(label, p.items, got[label])
                engine.decide(list(proposals), look=r + 1)
                times.append(time.perf_counter() - t)
            by_models.append({"method": method, "n_models": m, "n_items": models_n, "round_s": statistics.median(times),
                              "per_model_s": statistics.median(times) / m})
            print(f"[overhead] {method} models={m}: {statistics.median(times) * 1e3:.1f} ms/round",
                  file=sys.stderr, flush=True)
    inference = [replay_inference(args.batch)]
    if not args.no_lm and not quick:
        inference.append(small_lm_inference(min(args.batch, 32)))
    # controller vs inference per round, at 12k and 1M items
    ratios = []
    for inf in inference:
        if "per_item_s" not in inf:
            continue
        infer_round = inf["per_item_s"] * args.batch
        for r in by_size:
            if "round_s" in r and r["n_items"] in (12_000, 1_000_000):
                ratios.append({"backend": inf["backend"], "method": r["method"], "n_items": r["n_items"],
                               "controller_s": r["round_s"], "inference_s": infer_round,
                               "controller_over_inference": r["round_s"] / infer_round})
    history = []
    for name in HISTORY_BANKS:
        row = history_vs_uniform(name, 2 if quick else 20, args.seed)
        history.append(row)
        print(f"[overhead] history vs uniform on {name}: {row['per_look_ratio_median']:.2f}x per look "
              f"(prior fit {row['prior_fit_s_median']:.2f} s once)", file=sys.stderr, flush=True)
    payload = {
        "seed": args.seed, "batch": args.batch, "sizes": list(sizes), "rounds_timed": rounds,
        "history_vs_uniform": history,
        "bank": "synthetic: 10 subsets, 8-dim Gaussian features, Bernoulli(Beta(2,2)) scores",
        "size_cap": SIZE_CAP, "by_size": by_size, "scaling_fit": fits, "by_models": by_models, "inference": inference,
        "controller_vs_inference": ratios,
    }
    path = write_result("overhead", payload, quick, seed=args.seed)
    print(f"overhead -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
