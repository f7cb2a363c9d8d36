"""``certeval backtest`` for single-model methods: its inputs (features, history) and per-model table.

Each model's recorded scores are replayed as if the model were queried live, by the one backtest driver
(:func:`certeval.backtests.ray_fanout.run_cells`, the benchmarks' too) and the pipeline's round engine
(:mod:`certeval.engine`): per rep a fresh method runs select → update → decide until the goal is met, the bank
is exhausted or the item budget is spent. The truth is the estimand on the recorded bank (``Σ_i w_i x_i``: the
bank mean, or the mean-of-means over sub-datasets). For ``target='distribution'`` the same bank value is used as
the stand-in truth (the bank is the only population the records describe), and the output says so.

Seeds: each rep's seed is keyed by what the rep is — (scores, model, method, rep) — never by which other models
were selected or in which order reps run (:func:`certeval.backtests.cells.rep_seed`); a history rep draws
its history models and permutation from a child of that seed.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from certeval.errors import InputError
from certeval.estimators import REGISTRY, make_method
from certeval.estimators.goals import Goal
from certeval.estimators.validation import check_confidence, check_positive_int
from certeval.inputs.banks import Bank, embed_texts, score_matrix

from .cells import Cell, DatasetArrays
from .ray_fanout import FanOut, run_cells

if TYPE_CHECKING:  # annotations only
    from certeval.inputs.history import HistoryScores

METHODS_NEEDING_FEATURES = ("cer-eval",)
METHODS_USING_FEATURES = ("cer-eval", "adaptive")  # adaptive stratifies on features when it has them
FEATURE_MODES = ("auto", "text", "factors", "none")
FACTOR_DIM, FACTOR_PENALTY = 4, 1.0  # fixed, no cross-validation: the factors only shape strata


def cached_embeddings(texts: list[str], embed=embed_texts, cache_dir: str | os.PathLike | None = None) -> np.ndarray:
    """Embed ``texts`` once; the result is cached under a hash of the texts (written atomically) in
    ``<cache_dir>/embeddings`` (``--cache-dir``; None: the default cache folder)."""
    from certeval.runtime.options import default_cache_dir

    digest = hashlib.sha256("\x1f".join(texts).encode("utf-8")).hexdigest()[:32]
    path = Path(cache_dir or default_cache_dir()) / "embeddings" / f"minilm-{digest}.npy"
    if path.is_file():
        arr = np.load(path)
        if arr.shape[0] == len(texts):
            return arr
    arr = np.asarray(embed(texts), dtype=float)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npy")  # ends in .npy: np.save keeps the name
    os.close(fd)
    np.save(tmp, arr)
    os.replace(tmp, path)
    return arr


def features_for(bank: Bank, method: str, mode: str = "auto",
                 cache_dir: str | os.PathLike | None = None) -> np.ndarray | None:
    """Item features for ``method`` under ``--features`` ``mode`` (``factors`` is per model: see below).

    ``auto``: the bank's embeddings, else embedded item text, else None; ``text``: the same but an error
    when the bank has neither; ``none``: None. Methods that ignore features get None (nothing embedded).
    """
    if mode not in FEATURE_MODES:
        raise InputError(f"--features must be one of {', '.join(FEATURE_MODES)}; got {mode!r}")
    if mode == "none" or method not in METHODS_USING_FEATURES:
        if method in METHODS_NEEDING_FEATURES:
            raise InputError(f"method {method!r} needs item features, but --features none was given")
        return None
    if bank.features is not None:
        return bank.features
    texts = bank.texts()
    if texts is None:
        if mode == "text" or method in METHODS_NEEDING_FEATURES:
            raise InputError(
                f"method {method!r} needs item features, but the bank has neither an 'embedding' column "
                "nor item text ('question'); pass --items with text or embeddings, or --features factors"
            )
        return None
    return cached_embeddings(texts, cache_dir=cache_dir)


def factor_features(scores: pd.DataFrame, bank: Bank, all_models: list[str], seed: int = 0) -> dict[str, np.ndarray]:
    """Item factors as features, two-fold over models, so no model's own scores shape its strata.

    Models (sorted) alternate between two folds; the logistic factor model of FAQ (Wu et al. 2026, arXiv:2601.20251) (certeval's
    :class:`~certeval.estimators.faq.factor_model.FactorModel`, K = 4, λ = 1, no cross-validation) is fitted
    on one fold's recorded scores and its item factors are the features of every model in the other fold.
    """
    from certeval.estimators.faq.factor_model import FactorModel

    order = sorted(all_models)
    if len(order) < 4:
        raise InputError(f"--features factors needs at least 4 models in the scores file (two folds of ≥ 2), "
                         f"got {len(order)}")
    matrix = score_matrix(scores, order, bank)
    fold = np.arange(len(order)) % 2
    out: dict[str, np.ndarray] = {}
    for f in (0, 1):
        train = matrix[fold != f]
        model = FactorModel(n_factors=FACTOR_DIM, penalty=FACTOR_PENALTY).fit(
            train, rng=np.random.default_rng([seed, f]))
        for i in np.flatnonzero(fold == f):
            out[order[i]] = model.item_factors_
    return out


@dataclass(frozen=True)
class ModelBacktest:
    model: str
    truth: float
    mean_scored: float
    fraction_scored: float
    coverage: float
    mean_halfwidth: float
    reached: float  # fraction of reps that met the goal before the bank/budget ran out
    decided: float | None = None  # threshold goals: fraction of reps with a verdict
    decision_correct: float | None = None  # threshold goals: fraction with the right verdict
    baseline_scored: float | None = None  # the baseline (uniform) on the same models and reps, seeded as a run of it
    ratio_to_uniform: float | None = None
    history_models: float | None = None  # mean number of history models per rep

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class SingleBacktestOptions:
    """What a single-model backtest plays (``certeval backtest --goal halfwidth:E|above:T|below:T``): ``method``
    toward ``goal`` ``reps`` times per model; ``features`` (:data:`FEATURE_MODES`) and ``method_params`` shape the
    method. History (method ``history``): ``history`` gives recorded sources (the evaluated model left out), or
    ``history_fraction`` F makes a random fraction F of the scores file's *other* models the history of each rep
    (drawn per model and rep); ``history_permute`` shuffles the history's items per rep (useless history).
    ``baseline`` (e.g. ``uniform``) is replayed on the same reps with the same seeds, and each model gets
    ``ratio_to_uniform`` = items / the baseline's items. ``cache_dir``: where embedded item texts are cached."""

    method: str
    goal: Goal
    confidence: float = 0.95
    reps: int = 20
    seed: int = 0
    batch_size: int = 10
    max_items: int | None = None
    target: str = "bank"
    features: str = "auto"
    method_params: Mapping[str, Any] = field(default_factory=dict)
    history: HistoryScores | None = None
    history_fraction: float | None = None
    history_permute: bool = False
    baseline: str | None = None
    cache_dir: str | None = None


def run_single_backtest(scores: pd.DataFrame, bank: Bank, models: list[str], options: SingleBacktestOptions, *,
                        all_models: list[str] | None = None, progress: Callable[[int, int, str], None] | None = None,
                        on_rows: Callable[[list[dict]], None] | None = None) -> dict:
    """Replay ``options.method`` on every model's recorded scores ``options.reps`` times; per-model and summary
    numbers. ``all_models``: the scores file's models (the history's and the factor features' pool; default: every
    model of ``scores``); ``progress``/``on_rows``: the command line's progress bar and rows as they come."""
    o = options
    method, goal, target, features = o.method, o.goal, o.target, o.features
    history, history_fraction, history_permute, baseline = o.history, o.history_fraction, o.history_permute, o.baseline
    method_params, seed = dict(o.method_params), int(o.seed)
    confidence = check_confidence(o.confidence)
    reps = check_positive_int(o.reps, "reps")
    batch_size = check_positive_int(o.batch_size, "batch-size")
    max_items = o.max_items
    if max_items is not None:
        max_items = check_positive_int(max_items, "max-items")
    if method not in REGISTRY.methods:
        make_method(method)  # raises the InputError listing the methods
    if not models:
        raise InputError("no models to backtest")
    matrix = score_matrix(scores, models, bank)
    missing = np.isnan(matrix)
    if missing.any():
        i, j = np.argwhere(missing)[0]
        raise InputError(f"model {models[i]!r} has no recorded score for item {bank.item_ids[j]!r} "
                         f"({int(missing[i].sum())} missing); a backtest needs a complete record")
    if features == "factors" and method in METHODS_USING_FEATURES:
        per_model = factor_features(scores, bank, all_models or sorted(scores["model"].unique()), seed)
        specs = {m: bank.spec(features=per_model[m]) for m in models}
    else:
        feats = features_for(bank, method, features, o.cache_dir)
        shared = replace(bank.spec(), features=feats)  # None really means none (bank.spec falls back)
        specs = {m: shared for m in models}
    spec = specs[models[0]]
    params = {"confidence": confidence, "target": target, **(method_params or {})}
    order = sorted(all_models or models)
    history_for = _history_plan(scores, bank, order, method, history, history_fraction, history_permute)
    if baseline is not None and baseline not in REGISTRY.methods:
        make_method(baseline)
    # the one backtest driver (certeval.backtests.ray_fanout), one cell per model (and baseline): rep r of a model
    # has the seed of (scores, model, method, r), whichever other models are replayed beside it
    datasets, cells = {}, []
    for i, model in enumerate(models):
        key = f"scores#{i}"
        datasets[key] = DatasetArrays(name="scores", spec=specs[model], models=(model,), matrix=matrix[i:i + 1],
                                      history_for=history_for)
        cells.append(Cell(key, method, str(goal), reps, batch_size, tuple(sorted(params.items())),
                          max_items=max_items))
        if baseline is not None and baseline != method:  # the same reps with the baseline: seeds of a run of it
            cells.append(Cell(key, baseline, str(goal), reps, batch_size,
                              (("confidence", confidence), ("target", target)), max_items=max_items))
    # one rep per chunk when its rows are shown as they come (the rows do not depend on the chunking)
    rows_out = run_cells(datasets, cells, seed, fan_out=FanOut(chunk_reps=1 if on_rows else reps), progress=progress,
                         on_rows=on_rows)
    by: dict[tuple[str, str], list[dict]] = {}
    for r in rows_out:
        by.setdefault((r["method"], r["model"]), []).append(r)
    rows = []
    for i, model in enumerate(models):
        truth = float(specs[model].weights() @ matrix[i])
        mine = by[(method, model)]
        n_used = [r["n_scored"] for r in mine]
        extra = {}
        if goal.kind in ("above", "below"):
            side = "above" if truth > goal.value else ("below" if truth < goal.value else None)
            extra["decided"] = float(np.mean([r["verdict"] is not None for r in mine]))
            extra["decision_correct"] = float(np.mean([r["verdict"] is not None and r["verdict"] == side
                                                       for r in mine]))
        if baseline is not None:
            base_used = [r["n_scored"] for r in by[(baseline, model)]]
            extra["baseline_scored"] = float(np.mean(base_used))
            extra["ratio_to_uniform"] = float(np.mean(n_used) / max(np.mean(base_used), 1e-12))
        if history_for is not None:
            extra["history_models"] = float(np.mean([r["history_models"] for r in mine]))
        rows.append(ModelBacktest(
            model=model, truth=truth, mean_scored=float(np.mean(n_used)),
            fraction_scored=float(np.mean(n_used)) / spec.n_items,
            coverage=float(np.mean([r["covered"] for r in mine])),
            mean_halfwidth=float(np.mean([r["halfwidth"] for r in mine])),
            reached=float(np.mean([r["reached"] for r in mine])), **extra,
        ))
    summary = {
        "mean_fraction_scored": float(np.mean([r.fraction_scored for r in rows])),
        "coverage": float(np.mean([r.coverage for r in rows])),
        "reached": float(np.mean([r.reached for r in rows])),
    }
    if goal.kind in ("above", "below"):
        summary["decision_correct"] = float(np.mean([r.decision_correct for r in rows]))
    if baseline is not None:
        summary["baseline"] = baseline
        summary["ratio_to_uniform"] = float(sum(r.mean_scored for r in rows) / sum(r.baseline_scored for r in rows))
    history_info = None
    if history_for is not None:
        history_info = {"sources": list(history.sources) if history is not None else [],
                        "fraction": history_fraction, "permuted": bool(history_permute),
                        "mean_models": float(np.mean([r.history_models for r in rows])),
                        "rule": "the evaluated model is never part of its own history"}
    return {
        "method": method, "goal": str(goal), "confidence": confidence, "reps": reps, "seed": seed,
        "batch_size": batch_size, "max_items": max_items, "target": target, "features": features,
        "method_params": dict(method_params or {}), "history": history_info,
        "truth": "bank mean-of-means over sub-datasets" if (spec.subsets is not None and spec.mean_of_means)
        else "bank mean",
        "n_items": spec.n_items,
        "models": [r.to_dict() for r in rows],
        "summary": summary,
    }


def _history_plan(scores: pd.DataFrame, bank: Bank, all_models: list[str], method: str, history,
                  fraction: float | None, permute: bool):
    """``(model, rep's history seed) -> HistoryPrior`` for a history backtest, or None without history.

    ``history``: the recorded sources (the evaluated model left out); ``fraction`` F: a random F of the scores
    file's *other* models, drawn per rep; ``permute``: the history's items shuffled per rep (useless history)."""
    from certeval.inputs.history import history_prior, matrix_prior

    if history is None and fraction is None:
        if method == "history":
            raise InputError("method 'history' needs history: --history SOURCE or --history-fraction F")
        if permute:
            raise InputError("--history-permute needs --history SOURCE or --history-fraction F")
        return None
    if method != "history":
        raise InputError(f"history is used by method 'history'; got --method {method} (drop --method or "
                         "--history)")
    if history is not None and fraction is not None:
        raise InputError("give --history SOURCE or --history-fraction F, not both")

    if history is not None:
        fixed = {}

        def from_sources(model: str, seed: np.random.SeedSequence):
            if model not in fixed:
                fixed[model] = history_prior(history, bank, model)
            return fixed[model].permuted(np.random.default_rng(seed)) if permute else fixed[model]

        return from_sources
    if not (0.0 < float(fraction) <= 1.0):
        raise InputError(f"--history-fraction must lie in (0, 1], got {fraction!r}")
    if len(all_models) < 2:
        raise InputError("--history-fraction needs at least two models in the scores file")
    full = score_matrix(scores, all_models, bank)

    def from_fraction(model: str, seed: np.random.SeedSequence):
        others = [j for j, m in enumerate(all_models) if m != model]
        k = max(1, int(round(float(fraction) * len(others))))
        rng = np.random.default_rng(seed)
        chosen = np.sort(rng.choice(others, size=k, replace=False))
        return matrix_prior(full[chosen], [all_models[j] for j in chosen], permute=rng if permute else None)

    return from_fraction
