"""Coverage with a look at every batch: the exact history method on real banks and on adversarial history.

Each case replays ``reps`` runs (1,000 by default) of ``history`` with its bets tuned to the goal (±0.05), looks
after every batch of 10 items until the goal is met (or the bank is exhausted), and counts a miss when ANY
look's interval excludes the bank's mean. The miss rate must stay ≤ α = 0.05: the Wilson 95% interval of each
case is reported, and a case fails when that whole interval lies above α. A deliberately invalid control — the
drawn item's prediction is its own true score (a predictor that has seen the answer) — runs through the same
check and must fail it.

Cases: three real banks (held-out half of the models, history the other half), and a logistic factor population
(40 history models + 20 evaluated, N = 200 items, 3 sub-datasets) with history that is anti-correlated (each
history row is 1 − the evaluated model's scores), shifted by ±0.3, random 0/1 columns, constant (all 1), a bank
sorted by difficulty with contiguous sub-datasets, and tiny banks (N = 20, 50).

    python -m benchmarks coverage            # 1,000 reps a case (about an hour on 2 loaded cores)
    python -m benchmarks coverage --quick    # 8 reps, two cases (seconds)
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # 2 shared cores: no BLAS oversubscription

import numpy as np  # noqa: E402
from scipy.stats import norm  # noqa: E402

from benchmarks._meta import write_result  # noqa: E402
from certeval.backtests.cells import Cell, DatasetArrays, history_cell
from certeval.backtests.ray_fanout import FanOut, dataset_arrays, run_cells  # noqa: E402
from certeval.estimators import BankSpec  # noqa: E402
from certeval.estimators.history.prior import fit_history_prior  # noqa: E402
from certeval.estimators.protocol import register  # noqa: E402
from certeval.estimators.single.history import HistoryMethod  # noqa: E402

ALPHA = 0.05
GOAL = "halfwidth:0.05"
BATCH = 10
REAL = ("helm_mmlu", "openllm_arc", "vlm_ocrbench")
ADVERSARIAL = ("anti-correlated", "shifted+0.3", "shifted-0.3", "random-columns", "constant", "sorted",
               "tiny-20", "tiny-50")
CONTROL = "leaky-control"


@register
class LeakyHistory(HistoryMethod):
    """Deliberately invalid (benchmark only): the drawn item's prediction is its own true score."""

    name = "history-leaky-benchmark-only"

    def _log(self, items, a, s, totals, batch, h=None, z=None):
        if batch >= 0:
            a = self.truth_row_[items]
        super()._log(items, a, s, totals, batch, h, z)

    def start(self, spec):
        out = super().start(spec)
        self.truth_row_ = dict(spec.history.extra)["truth"]  # planted by the benchmark, never by a run
        return out


def population(rng: np.random.Generator, n_models: int, n_items: int) -> np.ndarray:
    """0/1 scores from a logistic two-factor model (abilities × item loadings + difficulties)."""
    theta = rng.normal(size=(n_models, 2))
    load, diff = rng.normal(size=(n_items, 2)), rng.normal(scale=1.5, size=n_items)
    p = 1.0 / (1.0 + np.exp(-(theta @ load.T - diff)))
    return (rng.random(p.shape) < p).astype(float)


def adversarial_data(kind: str, seed: int) -> DatasetArrays:
    """A synthetic bank whose history (per evaluated model and rep) is ``kind``."""
    rng = np.random.default_rng([seed, sum(map(ord, kind))])
    n_items = int(kind.split("-")[1]) if kind.startswith("tiny") else 200
    pop = population(rng, 60, n_items)
    if kind == "sorted":  # bank order = difficulty, sub-datasets contiguous: strata aligned with the answer
        pop = pop[:, np.argsort(pop.mean(axis=0))]
    hist, evals = pop[:40], pop[40:]
    subsets = None if n_items < 60 else (np.arange(n_items) * 3 // n_items)
    spec = BankSpec(n_items, subsets=subsets, subset_names=("a", "b", "c") if subsets is not None else ())
    models = tuple(f"m{i}" for i in range(evals.shape[0]))

    def history_for(model: str, seed_seq) -> object:
        x = evals[models.index(model)]
        r = np.random.default_rng(seed_seq)
        if kind == "anti-correlated":
            matrix = np.tile(1.0 - x, (5, 1))
        elif kind == "random-columns":
            matrix = (r.random(hist.shape) < 0.5).astype(float)
        elif kind == "constant":
            matrix = np.ones((5, n_items))
        else:
            matrix = hist
        prior = fit_history_prior(matrix, n_factors=3)
        if kind.startswith("shifted"):
            prior = replace(prior, item_mean=np.clip(prior.item_mean + float(kind[len("shifted"):]), 0.0, 1.0))
        return prior

    return DatasetArrays(name=kind, spec=spec, models=models, matrix=evals, history_for=history_for)


def control_data(seed: int) -> DatasetArrays:
    """The shifted-history bank with each model's true scores planted in its prior (for the leaky control)."""
    data = adversarial_data("shifted+0.3", seed)
    specs = {}
    for i, model in enumerate(data.models):
        prior = data.history_for(model, np.random.SeedSequence([seed, i]))
        specs[model] = replace(data.spec, history=replace(prior, extra=prior.extra + (("truth", data.matrix[i]),)))
    return replace(data, name=CONTROL, history_for=None, specs=specs)


def wilson(k: int, n: int, z: float = norm.ppf(0.975)) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre, half = (p + z * z / (2 * n)) / (1 + z * z / n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(max(centre - half, 0.0)), float(min(centre + half, 1.0))


def peeking_misses(rows: list[dict]) -> int:
    return sum(any(not (lo - 1e-12 <= r["truth"] <= hi + 1e-12) for _, _, lo, hi in r["curve"]) for r in rows)


def run_case(name: str, data: DatasetArrays, reps: int, seed: int, method: str = "history", ray: bool = False) -> dict:
    if method == "history":
        cell = history_cell(name, GOAL, reps, BATCH)
    else:
        cell = Cell(name, method, GOAL, reps, BATCH, (("subset_intervals", False),), CONTROL)
    rows = run_cells({name: data}, [cell], seed, fan_out=FanOut(use_ray=ray), record_curve=True)
    misses = peeking_misses(rows)
    lo, hi = wilson(misses, len(rows))
    out = {"case": name, "reps": len(rows), "n_items": data.spec.n_items, "misses_with_peeking": misses,
           "miscoverage": misses / len(rows), "wilson95": [lo, hi], "fails": lo > ALPHA,
           "mean_fraction_scored": float(np.mean([r["n_scored"] for r in rows]) / data.spec.n_items)}
    print(f"[coverage] {name}: {misses}/{len(rows)} missed at some look (Wilson95 {lo:.3f}–{hi:.3f})"
          f"{' FAIL' if out['fails'] else ''}", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks coverage", description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--reps", type=int, default=None, help="reps per case (default 1000; --quick 8)")
    p.add_argument("--seed", type=int, default=2026)
    p.add_argument("--ray", action="store_true", help="fan the real banks out on local Ray (2 CPUs)")
    args = p.parse_args(argv)
    reps = args.reps or (8 if args.quick else 1000)
    cases = []
    for name in (() if args.quick else REAL):
        cases.append(run_case(name, dataset_arrays(name, features=None, history=True), reps, args.seed, ray=args.ray))
    for kind in (ADVERSARIAL[:1] if args.quick else ADVERSARIAL):
        cases.append(run_case(kind, adversarial_data(kind, args.seed), reps, args.seed))
    control = run_case(CONTROL, control_data(args.seed), reps, args.seed, method=LeakyHistory.name)
    ok = not any(c["fails"] for c in cases) and control["fails"]
    path = write_result("coverage", {"seed": args.seed, "reps": reps, "alpha": ALPHA, "goal": GOAL,
                                     "look_every": BATCH, "cases": cases, "control": control,
                                     "all_cases_hold_and_control_caught": ok}, args.quick)
    print(f"coverage -> {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
