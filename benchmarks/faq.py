"""FAQ (Wu et al. 2026, arXiv:2601.20251) backtests: coverage, half-width and ESS ratio against uniform sampling.

    python -m benchmarks.faq [--quick]

1. ``openllm_tiny`` (real records, 1,989 models × 493 items): history = the first half of the models in
   file order, new = the rest; the factor model is fitted on the history (K, λ by 3-fold CV, 1-SE rule;
   cached under ``.cache/faq/``), then every sampled new model is evaluated at budgets 5/10/25 % of the
   bank, FAQ and uniform-without-replacement side by side over the same reps. Also with 99 % of the
   history masked MCAR.
2. A 12,032-item bank drawn from the FAQ MMLU-Pro factors (``faq_mmlu_pro.factors.npz``): prior from the
   first half of the published model factors, new models = model factors from the second half, their
   correctness drawn once as Bernoulli(σ(uᵀv)); the item factors used by FAQ are the published ones
   (an oracle-factor setting: the best case for the working model).

Writes ``benchmarks/results/faq.json`` (``--quick``: ``benchmarks/results/_quick/faq.json``).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks._meta import ROOT, write_result
from certeval.backtests.faq import evaluate_new_models, faq_dataset, mask_mcar
from certeval.backtests.ray_fanout import fit_faq_inputs
from certeval.estimators.faq.factor_model import factor_prior
from certeval.inputs.banks import DATA_DIR, bank_from_scores, load_scores, score_matrix

CACHE = ROOT / ".cache" / "faq"
BUDGET_FRACTIONS = (0.05, 0.10, 0.25)
PAPER_HEADLINE = {
    "ess_ratio_max": 5.07,
    "best_prior_baseline_ess": [2.0, 2.3],
    "coverage": [0.94, 0.95],
    "note": "002 Fig. 2: MMLU-Pro, full history, budgets up to 25% of the bank, sequential (batch 1)",
}


# --quick proves the benchmark runs and writes its JSON: one fit at a fixed K and λ (1-2 s) instead of the 3-fold
# CV over 4 × 4 grid points (about 50 s of CPU for the two histories on a fresh checkout, where nothing is cached);
# the CV itself is tested in tests/test_factor_model.py
QUICK_FIT = {"n_factors": 2, "penalty": 1.0}


def openllm_tiny(seed: int, n_new: int, reps: int, missing: float | None, tau: float,
                 fit_params: dict | None = None) -> dict:
    scores = load_scores("bundled:openllm_tiny")
    bank = bank_from_scores(scores)
    models = list(dict.fromkeys(scores["model"]))
    half = len(models) // 2
    hist_models, new_models = models[:half], models[half:]
    history = score_matrix(scores, hist_models, bank)
    tag = "openllm_tiny_hist" if not missing else f"openllm_tiny_hist_missing{missing:g}"
    history = mask_mcar(history, missing, np.random.default_rng(seed + 1))
    # the same cached fit as the efficiency benchmark's FAQ cells (default CV, rng from seed)
    arrays, info = fit_faq_inputs(history, bank.item_ids, seed=seed, cache=CACHE, tag=tag, fit_params=fit_params)
    pick = np.linspace(0, len(new_models) - 1, min(n_new, len(new_models))).round().astype(int)
    chosen = [new_models[i] for i in pick]
    truth = score_matrix(scores, chosen, bank)
    mu, cov = arrays["prior_mean"], arrays["prior_cov"]
    budgets = [int(round(f * bank.n_items)) for f in BUDGET_FRACTIONS]
    t0 = time.time()
    data = faq_dataset(truth, arrays["item_factors"], mu, cov, models=chosen, name="openllm_tiny")
    res = evaluate_new_models(data, budgets, reps, seed, tau=tau)
    return {
        "dataset": "openllm_tiny", "n_items": bank.n_items, "history_models": len(hist_models),
        "new_models_available": len(new_models), "new_models_evaluated": len(chosen), "reps": reps,
        "missing": missing, "tau": tau, "factor_model": info,
        "seconds": time.time() - t0,
        "budgets": {f"{b / bank.n_items:.2f}": r["summary"] for b, r in res.items()},
        "per_model_at_10pct": res[budgets[1]]["per_model"],
    }


def mmlu_pro(seed: int, n_new: int, reps: int, tau: float, batch_size: int) -> dict:
    data = np.load(DATA_DIR / "faq_mmlu_pro.factors.npz", allow_pickle=False)
    u_all = data["model_factors"].astype(float)
    v = data["item_factors"].astype(float)
    half = u_all.shape[0] // 2
    mu, cov = factor_prior(u_all[:half])
    rng = np.random.default_rng(seed)
    pick = half + np.linspace(0, u_all.shape[0] - half - 1, n_new).round().astype(int)
    prob = 1.0 / (1.0 + np.exp(-(u_all[pick] @ v.T)))
    truth = (rng.random(prob.shape) < prob).astype(float)
    budgets = [int(round(f * v.shape[0])) for f in BUDGET_FRACTIONS]
    t0 = time.time()
    res = evaluate_new_models(faq_dataset(truth, v, mu, cov, name="faq_mmlu_pro"), budgets, reps, seed, tau=tau,
                              batch_size=batch_size, chunk_rows=500)
    return {
        "dataset": "faq_mmlu_pro synthetic bank", "n_items": v.shape[0], "n_factors": v.shape[1],
        "history_models": half, "new_models_evaluated": n_new, "reps": reps, "tau": tau, "batch_size": batch_size,
        "item_factors": "published FAQ MMLU-Pro factors (oracle setting)", "seconds": time.time() - t0,
        "budgets": {f"{b / v.shape[0]:.2f}": r["summary"] for b, r in res.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="few models and reps, written under results/_quick")
    parser.add_argument("--seed", type=int, default=20261121)
    parser.add_argument("--tau", type=float, default=0.1)
    parser.add_argument("--only", choices=("tiny", "tiny_missing", "mmlu"), action="append")
    args = parser.parse_args(argv)
    quick = args.quick
    parts = args.only or ["tiny", "tiny_missing", "mmlu"]
    out: dict = {"seed": args.seed, "paper_headline": PAPER_HEADLINE, "budget_fractions": list(BUDGET_FRACTIONS),
                 "uniform_baseline": "uniform sampling without replacement, sample mean, finite-population t interval",
                 "ess_ratio_definition": "mean squared error of uniform / mean squared error of FAQ over the same models and reps",
                 "results": {}}
    t0 = time.time()
    if "tiny" in parts:
        out["results"]["openllm_tiny"] = openllm_tiny(args.seed, 5 if quick else 200, 5 if quick else 100, None, args.tau,
                                                      QUICK_FIT if quick else None)
    if "tiny_missing" in parts:
        out["results"]["openllm_tiny_missing99"] = openllm_tiny(args.seed, 5 if quick else 100, 5 if quick else 100, 0.99,
                                                                args.tau, QUICK_FIT if quick else None)
    if "mmlu" in parts:
        out["results"]["mmlu_pro_synthetic"] = mmlu_pro(args.seed, 5 if quick else 50, 2 if quick else 20, args.tau, 10)
    out["total_seconds"] = time.time() - t0
    name = "faq" if not args.only else "faq_" + "_".join(parts)
    path = write_result(name, out, quick, seed=args.seed)
    print(f"wrote {path}")
    for key, res in out["results"].items():
        for b, s in res["budgets"].items():
            print(f"{key:26s} budget {b}: coverage default {s['coverage']:.3f} paper {s['paper_coverage']:.3f} anytime {s['anytime_coverage']:.3f} "
                  f"| halfwidth {s['mean_halfwidth']:.4f} (uniform {s['uniform_mean_halfwidth']:.4f}) | ESS x{s['ess_ratio']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
