"""Backtests at cluster scale: reps × models × methods fanned out over Ray (issue 6, item 1); one rep and its
cells live in :mod:`certeval.backtests.cells`, summaries in :mod:`certeval.backtests.summary`.

:func:`run_cells` is the one backtest driver: single-model replays (``certify`` cells), the comparative
backtests' paired runs (``paired`` cells, :mod:`certeval.backtests.comparative`) and FAQ's fixed-budget
experiment (``faq-budget`` cells, :mod:`certeval.backtests.faq`) all fan their reps out through it.

A backtest replays recorded scores: for each (model, method, rep) a method is run on one
model's score vector with the round protocol (``propose → update → result → goal.decide``)
until its goal is met or the bank is exhausted, and the stopping point is compared with the
bank's true mean. One pure function, :func:`replay_one`, does one rep; the in-process path
and the Ray path both call it, so they return identical numbers.

Seeds: every rep draws from ``np.random.SeedSequence(root_seed, spawn_key=key)`` with
``key`` derived from ``(dataset, model, method, rep)`` only — never from the order in which
tasks run — so a result does not depend on scheduling, chunking or the number of workers.

Ray: local by default (``ray.init(address="local", num_cpus=2, include_dashboard=False)``
with the loopback environment of :mod:`certeval.runtime.envsetup`); ``FanOut(use_ray=True, ray_address=...)``
for any cluster. Tasks are chunks of reps of one (dataset, method, goal) cell; the score matrix goes
to the object store once per dataset.

FAQ (Wu et al. 2026, arXiv:2601.20251) needs arrays — item factors and a prior fitted on the history half — that do not
belong in a cell's small JSON-able params: they travel with the dataset (``DatasetArrays.faq``,
``dataset_arrays(..., faq=FaqFit())``) and :func:`faq_params` joins them to a ``faq`` cell at replay time.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from certeval.errors import InputError
from certeval.estimators.validation import check_positive_int

# one rep and its cells, summaries: their own modules; the names stay importable from here
from .cells import Cell, DatasetArrays, _chunks
from .kinds import run_chunk

# --------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int = 2, state_dir: str | Path | None = None) -> Iterator[Any]:
    """Start (or join) Ray on loopback and shut it down afterwards if we started it.

    ``address=None`` starts a private local instance (``address="local"``); any other
    address joins that cluster. While ``ray.init`` runs, HOME points at a folder holding
    ``ray_bootstrap_config.yaml`` so Ray's usage-stats module never probes cloud metadata
    (docs/environment.md).
    """
    from certeval.runtime.envsetup import configure_offline_env, ray_bootstrap_home

    configure_offline_env()
    import ray

    if ray.is_initialized():
        yield ray
        return
    try:  # the pipeline's own start-up (auth token pinning, worker HOME) when present
        from certeval.hosting.ray_setup import init_ray
    except ImportError:
        init_ray = None
    if init_ray is not None:
        init_ray(address, num_cpus=num_cpus, state_dir=state_dir)
    else:
        base = Path(state_dir) if state_dir is not None else Path(tempfile.gettempdir()) / "certeval-ray"
        home = ray_bootstrap_home(base)
        old_home = os.environ.get("HOME")
        os.environ["HOME"] = str(home)
        try:
            if address is None:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                         object_store_memory=200 * 1024 * 1024, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        finally:
            if old_home is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = old_home
    try:
        yield ray
    finally:
        ray.shutdown()


def _ray_chunk(data: DatasetArrays, cell: Cell, lo: int, hi: int, root_seed: int, record_curve: bool,
               record_errors: bool):
    import os

    # one BLAS thread per task: Ray already runs one task per core
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    return run_chunk(data, cell, lo, hi, root_seed, record_curve, record_errors)


ProgressFn = Callable[[int, int, str], None]


def print_progress(done: int, total: int, what: str) -> None:
    """Default progress: one line on stderr per finished chunk."""
    print(f"[backtest] {done}/{total} chunks ({what})", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class FanOut:
    """Where and how :func:`run_cells` runs the chunks: in this process, or as Ray tasks (a private local Ray of
    ``num_cpus`` CPUs, or the cluster at ``ray_address``); ``chunk_reps`` reps of one cell a chunk."""

    use_ray: bool = False
    ray_address: str | None = None
    num_cpus: int = 2
    chunk_reps: int = 25


def run_cells(
    datasets: dict[str, DatasetArrays],
    cells: Sequence[Cell],
    root_seed: int,
    *,
    fan_out: FanOut = FanOut(),
    record_curve: bool = False,
    record_errors: bool = False,
    progress: ProgressFn | None = None,
    on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every cell's reps, of any kind, in-process or on Ray; rows come back sorted by (cell order, rep).
    ``on_rows`` sees each finished chunk's rows as they come (progress lines)."""
    chunk_reps = check_positive_int(fan_out.chunk_reps, "chunk_reps")
    jobs = [(ci, lo, hi) for ci, cell in enumerate(cells) for lo, hi in _chunks(cell, chunk_reps)]
    total = len(jobs)
    results: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for cell in cells:
        if cell.dataset not in datasets:
            raise InputError(f"cell names dataset {cell.dataset!r}, not among {sorted(datasets)}")
    if not fan_out.use_ray:
        for done, (ci, lo, hi) in enumerate(jobs, 1):
            cell = cells[ci]
            results[(ci, lo)] = run_chunk(datasets[cell.dataset], cell, lo, hi, root_seed, record_curve, record_errors)
            if on_rows:
                on_rows(results[(ci, lo)])
            if progress:
                progress(done, total, f"{cell.dataset}/{cell.name}/{cell.goal}")
    else:
        with ray_session(fan_out.ray_address, num_cpus=fan_out.num_cpus) as ray:
            remote = ray.remote(num_cpus=1, max_retries=1)(_ray_chunk)
            refs_data = {name: ray.put(d) for name, d in datasets.items()}
            pending = {}
            for ci, lo, hi in jobs:
                cell = cells[ci]
                ref = remote.remote(refs_data[cell.dataset], cell, lo, hi, root_seed, record_curve, record_errors)
                pending[ref] = (ci, lo)
            done = 0
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    ci, lo = pending.pop(ref)
                    results[(ci, lo)] = ray.get(ref)
                    done += 1
                    if on_rows:
                        on_rows(results[(ci, lo)])
                    if progress:
                        cell = cells[ci]
                        progress(done, total, f"{cell.dataset}/{cell.name}/{cell.goal}")
    rows: list[dict[str, Any]] = []
    for key in sorted(results):
        rows.extend(results[key])
    return rows


# --------------------------------------------------------------------------------------
# datasets: recorded scores → arrays, with leak-free item features from "history" models
# --------------------------------------------------------------------------------------


def history_features(history: np.ndarray, n_features: int = 8) -> np.ndarray:
    """Item features from other models' recorded scores (a stand-in for text embeddings).

    Columns: each item's mean score over the history models, then the leading right-singular
    vectors (scaled by their singular values) of the centred history matrix — the item side of
    a low-rank factor model, as in FAQ (Wu et al. 2026) — standardised to unit variance. Items whose
    history is all-correct or all-wrong land together, which is what Cer-Eval's 1-NN partition
    needs to separate easy from hard items.
    """
    hist = np.asarray(history, dtype=float)
    item_mean = hist.mean(axis=0)
    centred = hist - hist.mean(axis=1, keepdims=True)
    k = max(0, min(n_features - 1, min(centred.shape) - 1))
    cols = [item_mean[:, None]]
    if k > 0:
        # SVD through the smaller Gram matrix (eigh): cheap for 2k × 500 and 6 × 42k alike
        if centred.shape[0] <= centred.shape[1]:
            evals, u = np.linalg.eigh(centred @ centred.T)
            top = np.argsort(evals)[::-1][:k]
            sing = np.sqrt(np.clip(evals[top], 0, None))
            item_side = centred.T @ u[:, top]  # = V_k * S_k
        else:
            evals, v = np.linalg.eigh(centred.T @ centred)
            top = np.argsort(evals)[::-1][:k]
            sing = np.sqrt(np.clip(evals[top], 0, None))
            item_side = v[:, top] * sing
        cols.append(item_side)
    feats = np.hstack(cols)
    sd = feats.std(axis=0)
    sd[sd == 0] = 1.0
    return (feats - feats.mean(axis=0)) / sd


def fit_faq_inputs(history: np.ndarray, item_ids: Sequence[str], *, seed: int = 0,
                   cache: str | Path | None = None, tag: str = "history",
                   fit_params: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """FAQ's inputs from a history matrix: the logistic factor model of FAQ (Wu et al. 2026), its item factors and prior.

    ``fit_params`` are :class:`~certeval.estimators.faq.factor_model.FactorModel` arguments (default: K and λ
    by 3-fold cross-validation with the 1-SE rule, as ``benchmarks/faq.py`` fits them); the fit starts
    from ``np.random.default_rng(seed)``. With ``cache`` (a folder) the fit is stored there as
    ``<tag>_<digest>.npz`` (arrays only, never pickled) with a ``.json`` of its fit info; the digest
    hashes the history, the item ids, the seed and ``fit_params``, so only an identical fit is reused.
    Returns ``(arrays, info)``: ``item_factors``, ``prior_mean``, ``prior_cov`` and a JSON-able summary.
    """
    import hashlib
    import json

    from certeval.estimators.faq.factor_model import FactorModel, factor_prior
    from certeval.storage import dumps

    from .factor_files import load_factor_model, save_factor_model

    hist = np.asarray(history, dtype=float)
    ids = [str(i) for i in item_ids]
    if hist.ndim != 2 or hist.shape[1] != len(ids):
        raise InputError(f"history must be a models × items matrix with {len(ids)} items, got shape {hist.shape}")
    fit_params = dict(fit_params or {})
    try:
        template = FactorModel(**fit_params)
    except TypeError as exc:
        raise InputError(f"fit_params are FactorModel arguments: {exc}") from None
    path = None
    if cache is not None:
        digest = hashlib.sha256()
        digest.update(np.ascontiguousarray(hist).tobytes())
        digest.update("\x1f".join(ids).encode("utf-8"))
        digest.update(json.dumps({"seed": int(seed), "shape": list(hist.shape), **fit_params}, sort_keys=True,
                                 default=str).encode("utf-8"))
        path = Path(cache) / f"{tag}_{digest.hexdigest()[:16]}.npz"
    info: dict[str, Any]
    if path is not None and path.is_file():
        fm, cached_ids, _ = load_factor_model(path)
        side = path.with_suffix(".json")
        info = {**(json.loads(side.read_text()) if side.is_file() else {}), "cached": path.name}
        if cached_ids != ids:  # same digest, different items: cannot happen unless the file was replaced
            raise InputError(f"cached factor model {str(path)!r} does not match the bank's items; delete it")
    else:
        t0 = time.perf_counter()
        fm = template.fit(hist, rng=np.random.default_rng(int(seed)))
        cv = fm.cv_.to_dict() if fm.cv_ is not None else None
        info = {"fit_s": time.perf_counter() - t0, "fit_params": fit_params or "K, λ by 3-fold CV (1-SE rule)",
                "cv_factor_grid": cv and cv["factor_grid"], "cv_penalty_grid": cv and cv["penalty_grid"],
                "cv_mean_loss": cv and cv["mean_loss"], "cv_se_loss": cv and cv["se_loss"], "final_fit": fm.fit_info_, "seed": int(seed),
                "history_shape": list(hist.shape), "cached": False}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_factor_model(path, fm, ids)
            tmp = path.with_suffix(".json.tmp")
            tmp.write_bytes(dumps(info))
            tmp.replace(path.with_suffix(".json"))
    mean, cov = factor_prior(fm.model_factors_)
    info = {**info, "n_factors": int(fm.item_factors_.shape[1]), "penalty": float(fm.penalty_)}
    return {"item_factors": np.asarray(fm.item_factors_, dtype=float), "prior_mean": mean, "prior_cov": cov}, info


@dataclass(frozen=True)
class FaqFit:
    """FAQ's inputs for a dataset (:func:`fit_faq_inputs` on its history half): the folder the fit is kept in
    (None: not kept) and the :class:`~certeval.estimators.faq.factor_model.FactorModel` arguments (None: K and λ by
    cross-validation)."""

    cache: str | Path | None = None
    params: dict[str, Any] | None = None


def dataset_arrays(name: str, *, features: int | None = 8, split_seed: int = 0,
                   max_eval_models: int | None = None, mean_of_means: bool = True,
                   models: Sequence[str] | None = None, faq: FaqFit | None = None,
                   history: bool = False) -> DatasetArrays:
    """Load ``bundled:<name>``; split models into history (features) and evaluated halves.

    The evaluated models never contribute to the features their own reps use. ``features`` item features come
    from the history half; with ``features=None`` (methods that need none) no split is made: every model, or those
    named in ``models``, is evaluated — unless ``faq`` asks for FAQ's inputs, which also come from the history half
    (:func:`fit_faq_inputs`; it costs a factor-model fit, seconds to minutes, hence opt-in), or ``history`` for the
    history prior.
    ``mean_of_means`` picks the estimand: the mean of sub-dataset means (Arviv et al. 2026, eq. 1) or
    the plain bank mean (every item weighs 1/N, as in Cer-Eval's experiments).
    """
    from certeval.inputs.banks import bank_from_scores, load_scores, score_matrix

    frame = load_scores(f"bundled:{name}" if ":" not in name and "/" not in name else name)
    bank = bank_from_scores(frame)
    all_models = sorted(frame["model"].unique())
    if models is not None:
        missing = [m for m in models if m not in set(all_models)]
        if missing:
            raise InputError(f"unknown model {missing[0]!r} in {name!r}; it has {len(all_models)} models")
    if features is None and faq is None and not history:
        eval_models = list(models) if models is not None else all_models
        if max_eval_models is not None:
            eval_models = eval_models[:max_eval_models]
        label = name.split(":")[-1]
        return DatasetArrays(
            name=label, spec=bank.spec(mean_of_means=mean_of_means), models=tuple(eval_models),
            matrix=score_matrix(frame, eval_models, bank),
            notes={"n_models": len(all_models), "n_eval_models": len(eval_models), "n_items": bank.n_items,
                   "n_subsets": int(bank.spec().n_subsets), "features": "none",
                   "estimand": "mean of sub-dataset means" if mean_of_means else "bank mean"})
    order = np.random.default_rng(split_seed).permutation(len(all_models))
    n_hist = max(1, len(all_models) // 2)
    hist_models = [all_models[i] for i in order[:n_hist]]
    eval_models = [all_models[i] for i in sorted(order[n_hist:])]
    if models is not None:  # named models: evaluate those, features from every other model
        wanted = set(models)
        hist_models = [m for m in all_models if m not in wanted]
        eval_models = list(models)
        if not hist_models:
            raise InputError("item features come from models not being evaluated; name fewer models")
    if max_eval_models is not None:
        eval_models = eval_models[:max_eval_models]
    hist = score_matrix(frame, hist_models, bank)
    feats = history_features(hist, features) if features is not None else None
    matrix = score_matrix(frame, eval_models, bank)
    label = name.split(":")[-1]
    notes = {"n_models": len(all_models), "n_history_models": len(hist_models), "n_eval_models": len(eval_models),
             "n_items": bank.n_items, "n_subsets": int(bank.spec().n_subsets),
             "estimand": "mean of sub-dataset means" if mean_of_means else "bank mean",
             "features": "none" if feats is None else
             f"history item factors: mean score + {feats.shape[1] - 1} SVD components over "
             f"{len(hist_models)} held-out models (no text embeddings)"}
    faq_arrays = None
    if faq is not None:
        tag = f"{label}_split{split_seed}" + ("" if models is None else "_named")
        faq_arrays, info = fit_faq_inputs(hist, bank.item_ids, seed=split_seed, cache=faq.cache, tag=tag,
                                          fit_params=faq.params)
        notes["faq"] = {"factor_model": f"logistic factor model of FAQ (Wu et al. 2026) on {len(hist_models)} history models "
                                        f"× {bank.n_items} items", **info}
    prior = None
    if history:
        from certeval.inputs.history import matrix_prior

        prior = matrix_prior(hist, hist_models, sources=(f"bundled:{label}",))
        notes["history"] = {"models": len(hist_models), "n_factors": prior.n_factors,
                            "prior": "history item means + ridge on SVD item factors (certeval.estimators.history.prior)"}
    return DatasetArrays(
        name=label,
        spec=bank.spec(features=feats, mean_of_means=mean_of_means),
        models=tuple(eval_models),
        matrix=matrix,
        notes=notes,
        faq=faq_arrays,
        history=prior,
    )
