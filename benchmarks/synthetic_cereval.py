"""Cer-Eval's synthetic scenarios (Wang et al. 2025, arXiv:2505.03814) S1–S3: saving ratio and failure rate of every single-model method.

``python -m benchmarks.synthetic_cereval [--reps R] [--quick] [--seed S]`` writes
``benchmarks/results/synthetic_cereval.json``.

Setting (Wang et al. 2025 §6.1): n = 5000, d = 10, σ² = 1, δ = 0.05, batches of 10. Each
method runs once per bank until its half-width is below the smallest ε (or the
bank is exhausted); the look at which it first reaches each ε gives that ε's
items used, saving ratio ρ = 1 − used/n (0 when ε is never reached), and
failure (the interval at that stop misses the truth). Truth: the bank mean for
``target=bank`` methods, the generating distribution's mean for
``target=distribution`` (the paper's R). Paper values: Tables 4–5 (S2, S3).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from certeval.estimators import BankSpec, make_method
from certeval.estimators.synthetic import make_scenario

from ._meta import write_result

EPSILONS = (0.0177, 0.0210, 0.0255, 0.0310, 0.0377, 0.0458, 0.0557, 0.0677, 0.0821, 0.0998)
HEADLINE = (0.0255, 0.0310, 0.0458)
PAPER = {  # Wang et al. 2025, Tables 4 and 5 (Cer-Eval's saving ratio ρ)
    "S2": (0.0004, 0.611, 0.719, 0.794, 0.849, 0.888, 0.916, 0.937, 0.954, 0.969),
    "S3": (0.0006, 0.28, 0.510, 0.665, 0.770, 0.843, 0.890, 0.926, 0.946, 0.963),
}
PAPER_SUBSET = (0.048, 0.322, 0.541, 0.689, 0.789, 0.857, 0.903, 0.934, 0.955, 0.969)  # 'Subset' rows
CONFIGS = [  # (label, method, params)
    ("static", "static", {"target": "bank"}),
    ("seq", "seq", {"target": "distribution"}),
    ("cer-eval", "cer-eval", {"target": "distribution", "warm_start": 50, "beta": 1.1}),
    ("uniform", "uniform", {"target": "bank"}),
    ("adaptive", "adaptive", {"target": "bank"}),  # default strata='auto': feature strata here (banks have features)
    ("adaptive[subsets]", "adaptive", {"target": "bank", "strata": "subsets"}),  # no feature strata (before)
    ("adaptive[distribution]", "adaptive", {"target": "distribution"}),
]
N, DELTA, BATCH = 5000, 0.05, 10


def trajectory(method_name: str, params: dict, bank, rng: np.random.Generator, stop_at: float):
    """(n_scored, lower, upper) at every look until half-width ≤ stop_at or the bank is exhausted."""
    method = make_method(method_name, confidence=1 - DELTA, **params)
    method.start(BankSpec(N, features=bank.features))
    looks = []
    while True:
        prop = method.propose(N if method_name == "static" else BATCH, rng)
        method.update(prop.items, bank.losses[prop.items])
        est = method.result()
        looks.append((est.n_scored, est.lower, est.upper))
        if est.exhausted or est.halfwidth <= stop_at:
            return np.array(looks)


def summarise(looks: np.ndarray, truth: float, eps: float) -> tuple[float, bool]:
    half = 0.5 * (looks[:, 2] - looks[:, 1])
    hit = np.flatnonzero(half <= eps)
    row = looks[hit[0]] if hit.size else looks[-1]
    used = row[0] if hit.size else N
    missed = not (row[1] - 1e-12 <= truth <= row[2] + 1e-12)
    return 1.0 - used / N, missed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--quick", action="store_true", help="1 rep, results under results/_quick")
    args = ap.parse_args(argv)
    reps = 1 if args.quick else args.reps
    rows = []
    t0 = time.time()
    for s_idx, scenario in enumerate(("S1", "S2", "S3")):
        per = {label: {eps: [] for eps in EPSILONS} for label, _, _ in CONFIGS}
        timing = {label: 0.0 for label, _, _ in CONFIGS}
        for rep in range(reps):
            seq = np.random.SeedSequence(args.seed, spawn_key=(s_idx, rep))
            bank = make_scenario(scenario, np.random.default_rng(seq))
            for c_idx, (label, name, params) in enumerate(CONFIGS):
                rng = np.random.default_rng(np.random.SeedSequence(args.seed, spawn_key=(s_idx, rep, c_idx)))
                t = time.perf_counter()
                looks = trajectory(name, params, bank, rng, min(EPSILONS))
                timing[label] += time.perf_counter() - t
                truth = bank.bank_mean if params["target"] == "bank" else bank.population_mean
                for eps in EPSILONS:
                    per[label][eps].append(summarise(looks, truth, eps))
            print(f"{scenario} rep {rep + 1}/{reps} done ({time.time() - t0:.0f}s)", flush=True)
        for label, _name, params in CONFIGS:
            for e_idx, eps in enumerate(EPSILONS):
                vals = per[label][eps]
                rows.append({
                    "scenario": scenario, "method": label, "target": params["target"], "epsilon": eps,
                    "saving_ratio": float(np.mean([v[0] for v in vals])),
                    "saving_ratio_sd": float(np.std([v[0] for v in vals])),
                    "failure_rate": float(np.mean([v[1] for v in vals])),
                    "paper_cereval": PAPER[scenario][e_idx] if scenario in PAPER else None,
                    "paper_subset": PAPER_SUBSET[e_idx] if scenario in PAPER else None,
                    "seconds_per_run": timing[label] / reps,
                })
    beats = {
        f"{r['scenario']}@{r['epsilon']}": r["saving_ratio"] > r["paper_cereval"] and r["failure_rate"] <= DELTA
        for r in rows if r["method"] == "adaptive" and r["scenario"] in PAPER and r["epsilon"] in HEADLINE
    }
    payload = {
        "seed": args.seed, "reps": reps, "n": N, "d": 10, "sigma2": 1.0, "delta": DELTA, "batch_size": BATCH,
        "epsilons": list(EPSILONS), "headline_epsilons": list(HEADLINE),
        "adaptive_beats_paper_cereval": beats, "rows": rows,
    }
    path = write_result("synthetic_cereval", payload, args.quick, seed=args.seed)
    print(f"wrote {path}")
    for r in rows:
        if r["epsilon"] in HEADLINE:
            print(f"{r['scenario']} {r['method']:<24} ε={r['epsilon']:<7} ρ={r['saving_ratio']:.3f} "
                  f"fail={r['failure_rate']:.2f} paper={r['paper_cereval']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
