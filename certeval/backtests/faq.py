"""Backtest of FAQ (Wu et al. 2026, arXiv:2601.20251) on recorded scores: history → factor model → evaluate new models at a budget.

``faq_backtest(FaqBacktestOptions(...))`` is what ``certeval backtest --method faq`` runs (the command line
prints its result). It splits the recorded models
(file order) into a history and new models, fits the logistic factor model on the history (optionally with a
fraction of entries masked MCAR), then for every new model runs ``reps`` FAQ evaluations at the budget and,
side by side with the same reps, uniform sampling without replacement (sample mean, finite-population Wald
interval). Reported per model and in summary: coverage, mean half-width and the ESS ratio
= (variance of uniform at the same budget) / (variance of FAQ), variances taken over reps around the truth.
The (model, rep) runs are one ``faq-budget`` cell of the one backtest driver (:func:`faq_budget_rows`).

The persistence of fitted factors (``.npz``) is :mod:`certeval.backtests.factor_files`; a cell's rows are
:mod:`certeval.backtests.faq_rows`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from certeval.errors import InputError
from certeval.estimators.faq.factor_model import FactorModel, factor_prior
from certeval.estimators.faq.querying import CI_KINDS
from certeval.estimators.protocol import BankSpec
from certeval.estimators.validation import check_confidence, check_positive, check_positive_int

from .cells import FAQ_BUDGET, Cell, DatasetArrays

# the persistence of fitted factors and a rep's rows: their own modules; the names stay importable from here
from .faq_rows import DEFAULT_TAU


# ----------------------------------------------------------------------------------------------
# pieces
# ----------------------------------------------------------------------------------------------
def resolve_budget(budget: Any, n_items: int) -> int:
    """A fraction in (0, 1) of the bank, or a count ≥ 1; at least 2 draws and at most the bank size."""
    b = check_positive(budget, "--budget")
    n = int(round(b * n_items)) if b < 1 else int(b)
    if b >= 1 and b != int(b):
        raise InputError(f"budget as a count must be an integer, got {budget!r}")
    if n > n_items:
        raise InputError(f"budget {budget!r} exceeds the bank's {n_items} items")
    if n < 2:
        raise InputError(f"budget {budget!r} gives {n} draws on a bank of {n_items}; at least 2 are needed for an interval")
    return n


def split_models(models: Sequence[str], history_models: int | None, history_fraction: float | None) -> tuple[list[str], list[str]]:
    """First N models in file order (or a fraction of them) are history; the rest are new."""
    models = list(models)
    if history_models is not None and history_fraction is not None:
        raise InputError("give either history_models or history_fraction, not both")
    if history_models is not None:
        n_hist = check_positive_int(history_models, "history_models")
    else:
        frac = 0.5 if history_fraction is None else float(history_fraction)
        if not (0.0 < frac < 1.0):
            raise InputError(f"history_fraction must lie strictly between 0 and 1, got {history_fraction!r}")
        n_hist = int(math.floor(frac * len(models)))
    if n_hist < 2:
        raise InputError(f"history needs at least 2 models to form a prior, got {n_hist} (of {len(models)} models)")
    if n_hist >= len(models):
        raise InputError(f"history takes {n_hist} of {len(models)} models, leaving no new model to evaluate")
    return models[:n_hist], models[n_hist:]


def mask_mcar(history: np.ndarray, missing: float | None, rng: np.random.Generator) -> np.ndarray:
    """Hide a fraction ``missing`` of the observed history entries completely at random (002 §4)."""
    if missing is None or missing == 0:
        return history
    if not (0.0 <= float(missing) < 1.0):
        raise InputError(f"missing must be a fraction in [0, 1), got {missing!r}")
    out = history.copy()
    out[rng.random(out.shape) < float(missing)] = np.nan
    return out


def faq_dataset(truth: np.ndarray, item_factors: np.ndarray, prior_mean: np.ndarray, prior_cov: np.ndarray, *,
                models: Sequence[str] | None = None, name: str = "scores") -> DatasetArrays:
    """New models' complete scores (rows of ``truth``) with the fitted factor model FAQ draws from: the item
    factors and the Gaussian prior of a new model's factor. ``models`` names the rows (default ``model0``, ...)."""
    truth = np.asarray(truth, dtype=float)
    m, n = truth.shape
    names = tuple(str(x) for x in models) if models is not None else tuple(f"model{i}" for i in range(m))
    if len(names) != m or len(set(names)) != m:
        raise InputError(f"models must name each of the {m} rows of truth once; got {len(names)} names")
    return DatasetArrays(name, BankSpec(n_items=n), names, truth, faq={
        "item_factors": np.asarray(item_factors, dtype=float), "prior_mean": np.asarray(prior_mean, dtype=float),
        "prior_cov": np.asarray(prior_cov, dtype=float)})


def evaluate_new_models(data: DatasetArrays, budgets: Sequence[int], reps: int, seed: int, *,
                        confidence: float = 0.95, tau: float = DEFAULT_TAU, batch_size: int = 1,
                        chunk_rows: int = 2000) -> dict[int, dict[str, Any]]:
    """FAQ and uniform side by side for every new model of ``data`` (:func:`faq_dataset`) at each budget.

    With the default policy (ρ = γ = 0) the policy does not depend on the planned budget, so one run of the
    largest budget serves every smaller budget as its prefix (same distribution as a separate run).
    The (model, rep) runs are one ``faq-budget`` cell of the one backtest driver
    (:func:`certeval.backtests.ray_fanout.run_cells`), ``chunk_rows`` reps a chunk (vectorised within it), each
    seeded by ``(seed, name, model, rep)``.
    """
    from .ray_fanout import FanOut, run_cells

    truth, name = data.matrix, data.name
    m = truth.shape[0]
    reps = check_positive_int(reps, "reps")
    params = (("budgets", tuple(int(b) for b in budgets)), ("confidence", float(confidence)), ("tau", float(tau)))
    cell = Cell(name, "faq", "budget", m * reps, batch_size, params, label="faq-budget", kind=FAQ_BUDGET)
    rows = run_cells({name: data}, [cell], seed, fan_out=FanOut(chunk_reps=chunk_rows))
    return {int(b): _budget_summary(truth, rows, k, reps) for k, b in enumerate(budgets)}


def _budget_summary(truth: np.ndarray, rows: list[dict[str, Any]], k: int, reps: int) -> dict[str, Any]:
    """Coverage, half-widths and ESS ratio at the ``k``-th budget from the cell's rows (rep r: model r % M)."""
    m, n = truth.shape
    b = rows[0]["budgets"][k]["budget"]
    theta = truth.mean(axis=1)

    def grid(key: str) -> np.ndarray:  # (M, reps, values): rows come in rep order, rep r is model r % M
        return np.array([r["budgets"][k][key] for r in rows], dtype=float).reshape(reps, m, -1).transpose(1, 0, 2)

    per_kind = {kind: grid(kind) for kind in CI_KINDS}  # [..., 0] mean, [..., 1] lower, [..., 2] upper
    uniform = grid("uniform")
    u_est, u_half = uniform[..., 0], uniform[..., 1]
    mean = per_kind["default"][..., 0]
    sq_faq = (mean - theta[:, None]) ** 2
    sq_uni = (u_est - theta[:, None]) ** 2
    u_cover = (np.clip(u_est - u_half, 0, 1) <= theta[:, None]) & (theta[:, None] <= np.clip(u_est + u_half, 0, 1))
    per_model = []
    for i in range(m):
        row = {"ess_ratio": float(sq_uni[i].mean() / max(sq_faq[i].mean(), 1e-300)), "truth": float(theta[i])}
        for kind in CI_KINDS:
            lo, hi = per_kind[kind][i, :, 1], per_kind[kind][i, :, 2]
            key = "" if kind == "default" else f"{kind}_"
            row[f"{key}coverage"] = float(((lo <= theta[i]) & (theta[i] <= hi)).mean())
            row[f"{key}mean_halfwidth"] = float(((hi - lo) / 2).mean())
        row["uniform_coverage"] = float(u_cover[i].mean())
        row["uniform_mean_halfwidth"] = float(u_half[i].mean())
        per_model.append(row)
    summary: dict[str, Any] = {"budget": int(b), "budget_fraction": b / n}
    for kind in CI_KINDS:
        lo, hi = per_kind[kind][..., 1], per_kind[kind][..., 2]
        key = "" if kind == "default" else f"{kind}_"
        summary[f"{key}coverage"] = float(((lo <= theta[:, None]) & (theta[:, None] <= hi)).mean())
        summary[f"{key}mean_halfwidth"] = float(((hi - lo) / 2).mean())
        summary[f"{key}zero_width"] = float((hi - lo <= 1e-12).mean())
    summary["ess_ratio"] = float(sq_uni.mean() / sq_faq.mean())
    summary["ess_ratio_rel_mc_se"] = math.sqrt(2.0 / (m * reps))  # rough relative MC error of a variance from m·reps squares
    summary["mse"] = float(sq_faq.mean())
    summary["bias"] = float((mean - theta[:, None]).mean())
    summary["uniform_coverage"] = float(u_cover.mean())
    summary["uniform_mean_halfwidth"] = float(u_half.mean())
    summary["uniform_mse"] = float(sq_uni.mean())
    # exact variance of uniform sampling WITH replacement at this budget, for a like-for-like reference
    summary["ess_ratio_vs_uniform_with_replacement"] = float((truth.var(axis=1) / b).mean() / sq_faq.mean())
    summary["mean_distinct_items"] = float(np.mean([r["budgets"][k]["distinct"] for r in rows]))
    return {"summary": summary, "per_model": per_model}


# ----------------------------------------------------------------------------------------------
# the command's entry: typed options in, the result out (the command line prints it)
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class FaqBacktestOptions:
    """What ``certeval backtest --method faq`` asks, as typed values (see the module docstring)."""

    scores: str
    items: str | None = None
    models: tuple[str, ...] | None = None  # new models to evaluate (default: every new model)
    confidence: float = 0.95
    reps: int = 100
    seed: int = 0
    ci: str = "default"
    batch_size: int = 1
    history_models: int | None = None
    history_fraction: float | None = None
    budget: float | None = None  # a fraction < 1 or a count (default 0.1)
    missing: float | None = None  # fraction of history entries hidden (MCAR)


def load_faq_scores(scores: str, items: str | None = None) -> tuple[pd.DataFrame, list[str], list[str]]:
    """The scores table, its models (file order) and its items (file order; only the items file's, if given)."""
    from certeval.inputs.banks import load_scores, read_table

    frame = load_scores(scores)
    models = list(pd.unique(frame["model"]))
    item_ids = list(pd.unique(frame["item_id"]))
    if items:
        bank_items = [str(i) for i in read_table(items, "items file")["item_id"].astype(str)]
        keep = set(bank_items)
        item_ids = [i for i in item_ids if i in keep]
        if not item_ids:
            raise InputError(f"the scores file shares no item with the items file {str(items)!r}")
    return frame, models, item_ids


def faq_backtest(opts: FaqBacktestOptions) -> dict[str, Any]:
    """``certeval backtest --method faq``: see the module docstring. Returns the report; prints nothing."""
    from certeval.inputs.banks import score_matrix

    confidence = check_confidence(opts.confidence)
    reps = check_positive_int(opts.reps, "reps")
    seed = int(opts.seed)
    ci = opts.ci or "default"
    if ci not in CI_KINDS:
        raise InputError(f"ci must be one of {', '.join(CI_KINDS)}; got {ci!r}")
    batch_size = check_positive_int(opts.batch_size or 1, "batch_size")
    scores, models, item_ids = load_faq_scores(opts.scores, opts.items)
    hist_models, new_models = split_models(models, opts.history_models, opts.history_fraction)
    if opts.models:
        wanted = [str(w) for w in opts.models]
        unknown = [w for w in wanted if w not in new_models]
        if unknown:
            where = "is a history model" if unknown[0] in hist_models else "is not in the scores file"
            raise InputError(f"model {unknown[0]!r} {where}; choose among the {len(new_models)} new models")
        new_models = wanted
    n_budget = resolve_budget(0.1 if opts.budget is None else opts.budget, len(item_ids))

    class _Bank:  # the minimal shape score_matrix needs
        pass

    bank = _Bank()
    bank.item_ids = tuple(item_ids)
    rng = np.random.default_rng(seed)
    history = mask_mcar(score_matrix(scores, hist_models, bank), opts.missing, rng)
    if not np.isfinite(history).any():
        raise InputError("the history has no observed score on the bank's items (no overlap)")
    truth = score_matrix(scores, new_models, bank)
    if not np.all(np.isfinite(truth)):
        i, j = np.argwhere(~np.isfinite(truth))[0]
        raise InputError(f"new model {new_models[i]!r} has no score for item {item_ids[j]!r}; a backtest needs "
                         "complete new-model rows")
    fm = FactorModel().fit(history, rng=rng)
    prior_mean, prior_cov = factor_prior(fm.model_factors_)
    # the history's mask and fit use ``rng``; every (model, rep) run its own seed from ``seed`` (run_cells)
    data = faq_dataset(truth, fm.item_factors_, prior_mean, prior_cov, models=new_models)
    res = evaluate_new_models(data, [n_budget], reps, seed, confidence=confidence, batch_size=batch_size)[n_budget]
    summary = dict(res["summary"])
    key = "" if ci == "default" else f"{ci}_"
    summary["coverage"], summary["mean_halfwidth"] = summary[f"{key}coverage"], summary[f"{key}mean_halfwidth"]
    per_model = []
    for name, row in zip(new_models, res["per_model"]):
        row = dict(row, model=name)
        row["coverage"], row["mean_halfwidth"] = row[f"{key}coverage"], row[f"{key}mean_halfwidth"]
        per_model.append(row)
    return {
        "method": "faq",
        "ci": ci,
        "confidence": confidence,
        "reps": reps,
        "seed": seed,
        "budget": n_budget,
        "n_items": len(item_ids),
        "history_models": len(hist_models),
        "new_models": len(new_models),
        "missing": opts.missing,
        "factor_model": {"n_factors": fm.n_factors_, "penalty": fm.penalty_, "cv": fm.cv_.to_dict() if fm.cv_ else None},
        "summary": summary,
        "per_model": per_model,
    }
