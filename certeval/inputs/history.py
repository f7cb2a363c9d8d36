"""History sources: other models' recorded scores on the bank's items, read from files or earlier runs.

A source (``--history``, repeatable) is

* a recorded-scores table (``model, item_id, score[, subset]``; Parquet/CSV/JSONL, ``bundled:<name>``,
  any fsspec URL), or
* an lm-eval samples file or an Inspect log (:mod:`certeval.harnesses.readers`), or
* a certeval run folder (it holds ``config.json`` and ``rounds/``), or a folder of run folders (an
  ``--output`` root): every model's stored round scores, labelled as in those runs.

Items are matched by ``item_id``; a model without a score for an item is simply missing there. The
model under evaluation is never its own history: a history model with the same name is left out, and
the result says so. :func:`history_prior` fits :func:`~certeval.estimators.history.prior.fit_history_prior`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from certeval.errors import InputError
from certeval.estimators.history.prior import DEFAULT_FACTORS, HistoryPrior, fit_history_prior
from certeval.messages import shown
from certeval.record.results import RUN_KINDS, read_record
from certeval.storage import Folder, check_folder, filesystem, is_local, verify_record

from .banks import Bank, load_scores


@dataclass(frozen=True)
class HistoryScores:
    """Long table ``model, item_id, score`` gathered from ``sources`` (one row per model and item)."""

    frame: pd.DataFrame
    sources: tuple[str, ...]

    @property
    def models(self) -> list[str]:
        return sorted(self.frame["model"].unique())


def _run_folder_scores(fs, path: str) -> pd.DataFrame | None:
    """Scores stored in the rounds of one run folder, or None if ``path`` is not a run folder."""
    if not fs.exists(f"{path}/config.json") or not fs.isdir(f"{path}/rounds"):
        return None
    folder = Folder(fs, path)  # its reads name a damaged round in one line (exit 2), never a traceback
    config = folder.read_json("config.json")
    if not isinstance(config, dict) or config.get("kind") not in RUN_KINDS:
        raise InputError(f"run folder {shown(folder.url())}: config.json is not a certify/compare/rank/select "
                         "run's (a JSON object with its kind)")
    results = folder.read_json("results.json")
    if results is not None:  # a finished run: its record read through its type (not a newer schema, kind or field)
        read_record(results, f"run folder {shown(folder.url())}: results.json")
    verify_record(folder)  # an edited, deleted or stray round is refused, never used as history
    frames = []
    for name in folder.list("rounds"):
        if name.endswith(".parquet"):
            frame = folder.read_parquet(f"rounds/{name}")
            missing = sorted({"model", "item_id", "score"} - set(frame.columns))
            if missing:
                raise InputError(f"{folder.url(f'rounds/{name}')} is damaged: it has no {missing[0]!r} column")
            frames.append(frame[["model", "item_id", "score"]])
    if not frames:
        return pd.DataFrame(columns=["model", "item_id", "score"])
    return pd.concat(frames, ignore_index=True)


def _read_source(source: str, metric: str | None = None) -> pd.DataFrame:
    if not source.startswith("bundled:"):
        fs, path = filesystem(source)
        if is_local(fs) and os.path.lexists(path) and not os.path.exists(path):
            check_folder(source, "--history")  # a symbolic link loop or a link to nothing: one line
        if fs.isdir(path):
            own = _run_folder_scores(fs, path)
            if own is not None:
                return own
            parts = [f for f in (_run_folder_scores(fs, str(p)) for p in sorted(fs.ls(path, detail=False))
                                 if fs.isdir(p)) if f is not None]
            if not parts:
                raise InputError(f"--history {source!r} is a folder but holds no certeval run (config.json + "
                                 "rounds/) and no run folders; pass a scores file or a runs folder")
            return pd.concat(parts, ignore_index=True)
    return load_scores(source, metric)[["model", "item_id", "score"]]


def load_history(sources: Sequence[str], *, metric: str | None = None) -> HistoryScores:
    """Read every source (lm-eval samples files and Inspect logs too: ``metric`` picks their metric or scorer);
    a (model, item) recorded twice keeps its mean score."""
    if not sources:
        raise InputError("no --history source given")
    frames = []
    for source in sources:
        try:
            frame = _read_source(str(source), metric)
        except InputError as exc:  # every refusal names the flag and the source it was given
            if str(exc).startswith("--history"):
                raise
            raise InputError(f"--history {str(source)!r}: {exc}") from None
        if not len(frame):
            raise InputError(f"--history {str(source)!r} holds no score")
        frames.append(frame.assign(item_id=frame["item_id"].astype(str), model=frame["model"].astype(str)))
    frame = pd.concat(frames, ignore_index=True)
    scores = pd.to_numeric(frame["score"], errors="coerce")
    if scores.isna().any() or (scores < 0).any() or (scores > 1).any():
        bad = frame["score"][scores.isna() | (scores < 0) | (scores > 1)].iloc[0]
        raise InputError(f"history scores must be numbers in [0, 1]; got {bad!r}")
    frame = frame.assign(score=scores).groupby(["model", "item_id"], as_index=False)["score"].mean()
    return HistoryScores(frame, tuple(str(s) for s in sources))


def history_prior(history: HistoryScores, bank: Bank, evaluated: str, *,
                  n_factors: int = DEFAULT_FACTORS) -> HistoryPrior:
    """The prior for model ``evaluated`` on ``bank``: every history model but ``evaluated`` itself."""
    frame = history.frame[history.frame["model"] != evaluated]
    frame = frame[frame["item_id"].isin(set(bank.item_ids))]
    models = sorted(frame["model"].unique())
    if not models:
        left_out = " (the model under evaluation is never its own history)" if (
            history.frame["model"] == evaluated).any() else ""
        raise InputError(f"--history has no model with a score on this bank's items other than {evaluated!r}"
                         f"{left_out}; sources: {', '.join(history.sources)}")
    pivot = frame.pivot(index="model", columns="item_id", values="score").reindex(
        index=models, columns=list(bank.item_ids))
    prior = fit_history_prior(pivot.to_numpy(dtype=float), n_factors=n_factors, models=tuple(models),
                              sources=history.sources)
    excluded = bool((history.frame["model"] == evaluated).any())
    return _with_extra(prior, left_out_self=excluded)


def _with_extra(prior: HistoryPrior, **extra) -> HistoryPrior:
    from dataclasses import replace

    return replace(prior, extra=prior.extra + tuple(extra.items()))


def matrix_prior(matrix: np.ndarray, models: Sequence[str], *, sources: Sequence[str] = (),
                 permute: np.random.Generator | None = None, n_factors: int = DEFAULT_FACTORS) -> HistoryPrior:
    """A prior from an already aligned models × items matrix (backtests); ``permute`` shuffles its items."""
    prior = fit_history_prior(matrix, n_factors=n_factors, models=tuple(models), sources=tuple(sources))
    return prior.permuted(permute) if permute is not None else prior
