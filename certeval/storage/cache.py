"""The score cache shared by the runs under one root: prompt hashes, cache keys, parts and their merging."""

from __future__ import annotations

import hashlib
import json
import re
import time
import uuid
from typing import Any

import fsspec
import pandas as pd
import pyarrow as pa

from certeval.errors import InputError

from ..estimators.results import to_jsonable
from .io import Folder, bounded, parquet_bytes

# what a model is asked and how its answer is judged: an item's cache key changes with any of them (an lm-eval
# generation item's stop strings and token budget, its filters and metrics, are the last two)
PROMPT_FIELDS = ("question", "choices", "answer", "answers", "prompt", "continuations", "gold", "lm_eval_generation",
                 "lm_eval_scoring")
# what the model is shown (answers are the judge's business); continuations: an lm-eval item's exact choice strings
ASKED_FIELDS = ("question", "choices", "prompt", "continuations")


def item_fields(item: dict[str, Any], fields: tuple[str, ...]) -> dict[str, Any]:
    """``fields`` of an item as plain data (:func:`~certeval.estimators.results.to_jsonable`), the missing ones
    (absent, None, NaN, pd.NA) left out: the same item gives the same hash input whichever format its bank was
    read from (a Parquet list column's numpy array, a CSV gap's NaN, JSONL's list and null)."""
    out = {}
    for name in fields:
        if name in item:
            value = to_jsonable(item[name])
            if value is not None:
                out[name] = value
    return out


def _digest(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, allow_nan=False).encode()


def item_key(item: dict[str, Any], prompt_fields: tuple[str, ...] = PROMPT_FIELDS) -> str:
    """Cache key of one item: its id plus a digest of its prompt fields (same id, other text → other key)."""
    fields = item_fields(item, prompt_fields)
    if not fields:
        return str(item["item_id"])
    return f"{item['item_id']}|{hashlib.sha1(_digest(fields)).hexdigest()[:12]}"


def prompt_hash(item: dict[str, Any]) -> str | None:
    """sha256 (16 hex) of what the model was shown — the item's ``question`` / ``choices`` / ``prompt`` — or None
    when it has none (a recorded-scores bank). Stored next to every output: ``certeval rescore`` checks that the
    bank still asks the same thing (its accepted answers may have been corrected since)."""
    fields = item_fields(item, ASKED_FIELDS)
    if not fields:
        return None
    return hashlib.sha256(_digest(fields)).hexdigest()[:16]


def cache_key(model: str, scorer: str, generation: dict[str, Any]) -> str:
    """Digest naming the cache of one model under one scorer and generation settings. ``model``: what names the
    model's scores (its files' fingerprint and the options that change its answers, or a server's address;
    :func:`certeval.runs.plan.cache_identity`)."""
    blob = json.dumps({"spec": model, "scorer": scorer, "generation": generation}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


MODELS = "_models"  # _cache/_models/<digest>.json: per model path, the files its scores were last cached for


def last_model_files(root: Folder, name: str) -> dict[str, Any] | None:
    """What ``record_model_files`` last kept under ``name`` (None: nothing, or damaged: only a message is lost)."""
    try:
        entry = root.read_json(f"{MODELS}/{name}.json")
    except (OSError, TimeoutError, ValueError, InputError):
        return None
    return entry if isinstance(entry, dict) and isinstance(entry.get("files"), dict) else None


def record_model_files(root: Folder, name: str, entry: dict[str, Any]) -> None:
    """Keep the files a model path's scores are now cached for (a saving for the next run's message: a storage
    failure is ignored)."""
    try:
        root.write_json(f"{MODELS}/{name}.json", entry)
    except (OSError, TimeoutError, InputError):
        pass


MAX_PARTS = 16  # a cache folder holding more parts than this is merged into one (at a run's start and end)
_PART = re.compile(r"^(?:[0-9a-f]{32}-(?P<digest>[0-9a-f]{16})|[^/]+)\.parquet$")  # older parts: no digest


def write_part(folder: Folder, frame: pd.DataFrame) -> str:
    """One immutable part, named ``<uuid>-<sha256 of its bytes, 16 hex>.parquet``: a reader recomputes the digest,
    so a part changed after it was written (a flipped bit Parquet itself would read) is never read as scores."""
    data = parquet_bytes(frame)
    name = f"{uuid.uuid4().hex}-{hashlib.sha256(data).hexdigest()[:16]}.parquet"
    folder.write_bytes(f"parts/{name}", data)
    return name


def read_part(folder: Folder, name: str, columns: tuple[str, ...] = ("item_key", "score")) -> pd.DataFrame | None:
    """A part's rows, or None when it is damaged: unreadable, its bytes not those its name's digest records, a
    column missing, or a score that is not a number in [0, 1] (the part's items are then scored again: the cache
    is a saving, never a record)."""
    match = _PART.match(name)
    if match is None:
        return None
    try:
        raw = folder.read_bytes(f"parts/{name}")
    except (OSError, TimeoutError, InputError):  # InputError: not a regular file, or past the size bound
        return None
    if raw is None or (match.group("digest") and hashlib.sha256(raw).hexdigest()[:16] != match.group("digest")):
        return None
    try:
        import io

        import pyarrow.parquet as pq

        part = pq.read_table(io.BytesIO(raw)).to_pandas()
    except (pa.ArrowException, OSError, ValueError):
        return None
    if not set(columns) <= set(part.columns) or part["item_key"].isna().any():
        return None
    scores = pd.to_numeric(part["score"], errors="coerce")
    if scores.isna().any() or not scores.between(0.0, 1.0).all():
        return None
    return part.assign(score=scores.astype(float))


COMPACT_BUDGET_S = 60.0  # reading parts to merge stops after this long; what was read is merged


def compact_parts(folder: Folder, keys: list[str], *, max_parts: int = MAX_PARTS,
                  budget_s: float = COMPACT_BUDGET_S, read: dict[str, pd.DataFrame] | None = None) -> int:
    """Merge the Parquet parts below ``folder/parts`` into one when there are more than ``max_parts``.

    The merged part (first row per ``keys`` kept, in listing order, as readers do) is written atomically
    under a new name first; only then are the parts it holds deleted. A crash in between leaves rows twice,
    which readers already tolerate (first score per key wins), and the next compaction merges them. A part
    written by someone else after the listing is never deleted, and a damaged part is left where it is.
    ``read``: parts already in memory (a start-up load), by name; others are read, until ``budget_s`` has
    passed. Returns the number of parts merged away (0: nothing done).
    """
    names = [n for n in folder.list("parts") if n.endswith(".parquet")]
    if len(names) <= max_parts:
        return 0
    deadline = time.monotonic() + budget_s
    frames, merged = [], []
    for name in names:
        part = (read or {}).get(name)
        if part is None:
            if time.monotonic() > deadline:
                break
            part = read_part(folder, name, tuple(keys))  # damaged: skipped by readers, left alone here
        if part is None or not set(keys) | {"score"} <= set(part.columns):
            continue
        frames.append(part)
        merged.append(name)
    if len(merged) < 2:
        return 0
    whole = pd.concat(frames, ignore_index=True).drop_duplicates(subset=keys, keep="first")
    write_part(folder, whole)
    for name in merged:
        try:
            bounded(folder.fs, "rm_file", folder.full(f"parts/{name}"))
        except FileNotFoundError:  # merged away by a concurrent compaction: its rows are in its merged part
            pass
    return len(merged)


class ScoreCache:
    """Scores already paid for by one model (spec + scorer + generation settings), in Parquet parts.

    A batch's scores are written by the model actor as ONE part for all the models it carried, under
    the caches' common parent: ``_cache/_shared/parts/<uuid>.parquet`` with a ``cache`` column naming
    each row's cache (a ranking of 2,000 replayed models wrote 2,000 files a round, one per model,
    before). Parts a cache folder holds itself (``_cache/<key>/parts/``, runs before the shared parts)
    are still read. Parts are immutable and uniquely named, so concurrent writers (several replicas,
    several runs) never conflict and a crash leaves whole parts only.
    """

    COLUMNS = ["item_key", "item_id", "score", "tokens", "latency_s", "output", "prompt_hash"]
    SHARED = "_shared"

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str) -> None:
        self.folder = Folder(fs, path)
        parent, _, self.key = self.folder.path.rpartition("/")
        self.shared = Folder(fs, f"{parent}/{self.SHARED}")

    def describe(self, meta: dict) -> None:
        if not self.folder.exists("meta.json"):
            self.folder.write_json("meta.json", meta)

    def add(self, rows: list[dict[str, Any]]) -> None:
        ScoreCache.add_many([(self, rows)])

    @staticmethod
    def add_many(entries: list[tuple[ScoreCache, list[dict[str, Any]]]]) -> None:
        """Write the rows of several caches: one part per shared folder."""
        # columns gathered across caches and ONE DataFrame per shared folder: a DataFrame per cache cost the
        # replay actor ~4 s a round at 1,989 models (benchmarks/scale.py)
        by_folder: dict[str, tuple[Folder, dict[str, list[Any]]]] = {}
        for cache, rows in entries:
            if not rows:
                continue
            cols = by_folder.setdefault(cache.shared.path, (cache.shared, {c: [] for c in (*ScoreCache.COLUMNS, "cache")}))[1]
            for column in ScoreCache.COLUMNS:
                if column in ("output", "prompt_hash"):  # text or null (replay models have no output)
                    cols[column].extend(_text(row.get(column)) for row in rows)
                else:
                    cols[column].extend(row.get(column) for row in rows)
            cols["cache"].extend([cache.key] * len(rows))
        for folder, cols in by_folder.values():
            frame = pd.DataFrame({c: pd.Series(v, dtype=object) if c in ("output", "prompt_hash")
                                  else pd.to_numeric(pd.Series(v, dtype=object)) if c in ("score", "tokens", "latency_s")
                                  else v for c, v in cols.items()})
            write_part(folder, frame)

    def load(self) -> dict[str, float]:
        """``item_key -> score`` of every cached score (first one wins if parts overlap).

        A damaged part (truncated, other columns) is skipped: its items are simply scored again, so the run
        recomputes what was lost from what is intact; ``self.skipped`` names the parts left out."""
        return ScoreCache.load_many([self])[0]

    def _load_own(self, keep: bool = False) -> dict[str, float]:
        out: dict[str, float] = {}
        self.skipped: list[str] = []
        self._own_parts: dict[str, pd.DataFrame] = {}
        self.outputs: dict[str, str | None] = {}  # item_key -> the model's output (None: none was recorded)
        for name in self.folder.list("parts"):
            if not name.endswith(".parquet"):
                continue
            part = read_part(self.folder, name)
            if part is None:  # damaged: its items are scored again
                self.skipped.append(name)
                continue
            if keep:
                self._own_parts[name] = part
            for key, score, output in zip(part["item_key"].astype(str), part["score"].astype(float), _outputs(part)):
                if key not in out:
                    out[key] = score
                    self.outputs[key] = output
        return out

    @staticmethod
    def load_many(caches: list[ScoreCache], threads: int = 16, compact: bool = False) -> list[dict[str, float]]:
        """``load()`` of many caches, reading each shared folder once (not once per model).

        ``compact``: a folder found holding more than ``MAX_PARTS`` parts is merged into one from the parts
        just read (one write and the deletes, no second read; see :func:`compact_parts`)."""
        from concurrent.futures import ThreadPoolExecutor

        if not caches:
            return []
        with ThreadPoolExecutor(max_workers=min(threads, len(caches))) as pool:  # storage latency, not CPU
            out = list(pool.map(lambda c: c._load_own(keep=compact), caches))
        if compact:
            for cache in caches:
                if len(cache._own_parts) > MAX_PARTS:
                    ScoreCache._compact_quietly(cache.folder, ["item_key"], cache._own_parts)
                cache._own_parts = {}
        wanted: dict[str, tuple[Folder, dict[str, list[int]]]] = {}
        for i, cache in enumerate(caches):
            wanted.setdefault(cache.shared.path, (cache.shared, {}))[1].setdefault(cache.key, []).append(i)
        for folder, index in wanted.values():
            kept: dict[str, pd.DataFrame] = {}
            for name in folder.list("parts"):
                if not name.endswith(".parquet"):
                    continue
                part = read_part(folder, name, ("cache", "item_key", "score"))
                if part is None:  # damaged: its items are scored again
                    for i in (i for ids in index.values() for i in ids):
                        caches[i].skipped.append(f"{ScoreCache.SHARED}/parts/{name}")
                    continue
                if compact:
                    kept[name] = part
                part = part[part["cache"].isin(list(index))]
                for key, rows in part.groupby("cache", sort=False):
                    triples = list(zip(rows["item_key"].astype(str), rows["score"].astype(float), _outputs(rows)))
                    for i in index[key]:
                        for item, score, output in triples:
                            if item not in out[i]:
                                out[i][item] = score
                                caches[i].outputs[item] = output
            if len(kept) > MAX_PARTS:
                ScoreCache._compact_quietly(folder, ["cache", "item_key"], kept)
        return out

    @staticmethod
    def compact_many(caches: list[ScoreCache]) -> int:
        """Merge the shared part folders of ``caches`` that hold more than ``MAX_PARTS`` parts (a run's end:
        the parts its batches wrote). Returns the number of parts merged away."""
        folders = {cache.shared.path: cache.shared for cache in caches}
        return sum(ScoreCache._compact_quietly(folder, ["cache", "item_key"]) for folder in folders.values())

    @staticmethod
    def _compact_quietly(folder: Folder, keys: list[str], read: dict[str, pd.DataFrame] | None = None) -> int:
        """Compaction is housekeeping: a storage failure leaves the parts as they were (a write before any
        delete), and the run goes on; the next start tries again."""
        try:
            return compact_parts(folder, keys, read=read)
        except (OSError, TimeoutError, InputError, ValueError, pa.ArrowException):
            return 0


def _text(value: Any) -> str | None:
    return None if value is None or (isinstance(value, float) and value != value) else str(value)


def _outputs(part: pd.DataFrame) -> list[str | None]:
    """A cache part's ``output`` column as text or None (parts written before outputs were kept have none)."""
    if "output" not in part.columns:
        return [None] * len(part)
    return [_text(value) for value in part["output"].tolist()]
