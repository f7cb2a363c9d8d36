"""Run folders on any fsspec URL (DESIGN §5) and the per-model score cache.

Layout of one run::

    <root>/<run_id>/config.json          what was asked (compared on resume)
    <root>/<run_id>/rounds/<n>.parquet   model, item_id, score, round, prob
    <root>/<run_id>/state/<model>.json   method state after the last complete round
    <root>/<run_id>/state/_run.json      the commit marker: last complete round + decisions
    <root>/<run_id>/results.json         estimates, intervals, decisions, ranking; lm-eval block

and, shared by every run under the same root::

    <root>/_cache/<key>/meta.json        what the cache <key> holds (model spec, scorer, generation settings)
    <root>/_cache/_shared/parts/*.parquet  scores already paid for, one part per scored batch (column ``cache``)

Every write is atomic: a local file is written under a temporary name in the
same folder and then renamed (``os.replace``); an object store receives one
PUT, which becomes visible only when complete. Nothing is ever half-written
under a final name, so a SIGKILL at any point leaves the folder readable.
State is JSON, never pickle.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .estimators._validation import InputError
from .estimators.results import to_jsonable

DEFAULT_OUTPUT = "./certeval-runs"
CACHE_DIR = "_cache"
RUN_MARKER = "state/_run.json"
# storage options for s3: fail fast on an unreachable endpoint instead of retrying for minutes
_S3_OPTIONS = {
    "skip_instance_cache": True,
    "config_kwargs": {"connect_timeout": 3, "read_timeout": 20, "retries": {"max_attempts": 2}},
}


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def dumps(obj: Any) -> bytes:
    return json.dumps(to_jsonable(obj), indent=2, default=_json_default, allow_nan=False).encode()


def safe_name(label: str) -> str:
    """A file-name-safe form of a model label (stable, readable, collision-resistant)."""
    clean = re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("._") or "model"
    if clean != label:
        clean = f"{clean[:80]}-{hashlib.sha1(label.encode()).hexdigest()[:6]}"
    return clean


def filesystem(url: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The fsspec filesystem and path of a folder URL (local path, ``file://``, ``s3://`` ...)."""
    protocol = fsspec.core.split_protocol(url)[0] or "file"
    options = dict(_S3_OPTIONS) if protocol in ("s3", "s3a") else {}
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except (ImportError, ValueError) as exc:
        raise InputError(f"--output {url!r} is not a usable location: {exc}") from None
    if protocol == "file":
        path = os.path.abspath(path)
    return fs, path.rstrip("/")


class Folder:
    """Atomic reads and writes below one folder of an fsspec filesystem."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str) -> None:
        self.fs = fs
        self.path = path.rstrip("/")
        self.local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))

    def full(self, rel: str) -> str:
        return f"{self.path}/{rel}" if rel else self.path

    def url(self, rel: str = "") -> str:
        full = self.full(rel)
        return full if self.local else self.fs.unstrip_protocol(full)

    def exists(self, rel: str) -> bool:
        return bool(self.fs.exists(self.full(rel)))

    def write_bytes(self, rel: str, data: bytes) -> None:
        target = self.full(rel)
        if self.local:
            folder = os.path.dirname(target)
            os.makedirs(folder, exist_ok=True)
            tmp = os.path.join(folder, f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
            with open(tmp, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, target)
        else:  # one PUT: the object appears complete or not at all
            self.fs.pipe_file(target, data)

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            return self.fs.cat_file(self.full(rel))
        except FileNotFoundError:
            return None

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, dumps(obj))

    def read_json(self, rel: str) -> Any:
        raw = self.read_bytes(rel)
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError as exc:  # truncated or overwritten: name the object, never a traceback
            raise InputError(f"{self.url(rel)} is damaged (not valid JSON: {str(exc).splitlines()[0]}); "
                             "start a new --run-id or restore the file") from None

    def write_parquet(self, rel: str, frame: pd.DataFrame) -> None:
        sink = io.BytesIO()
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink)
        self.write_bytes(rel, sink.getvalue())

    def read_parquet(self, rel: str) -> pd.DataFrame | None:
        raw = self.read_bytes(rel)
        if raw is None:
            return None
        try:
            return pq.read_table(io.BytesIO(raw)).to_pandas()
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise InputError(f"{self.url(rel)} is damaged (not a readable Parquet file: "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}); "
                             "start a new --run-id or restore the file") from None

    def list(self, rel: str) -> list[str]:
        """Names (not paths) of the files directly below ``rel``; hidden temporaries are skipped."""
        try:
            entries = self.fs.ls(self.full(rel), detail=False, refresh=True) if not self.local else self.fs.ls(self.full(rel), detail=False)
        except FileNotFoundError:
            return []
        names = [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]
        return sorted(n for n in names if not n.startswith("."))


def check_reachable(output: str) -> None:
    """Fail fast (InputError) when the output location cannot be listed or created."""
    fs, path = filesystem(output)
    try:
        if fs.exists(path):
            return
        if "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)):
            os.makedirs(path, exist_ok=True)
            return
        bucket = path.split("/", 1)[0]
        if not fs.exists(bucket):
            raise InputError(f"--output {output!r}: bucket {bucket!r} does not exist")
    except InputError:
        raise
    except PermissionError as exc:
        raise InputError(f"--output {output!r} is not writable: {exc}") from None
    except Exception as exc:  # unreachable endpoint, bad credentials, DNS ...
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InputError(f"--output {output!r} is unreachable: {type(exc).__name__}: {first}") from None


@dataclass
class RunStore:
    """One run folder: config, rounds, method states, the commit marker and results."""

    output: str
    run_id: str

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}", self.run_id or ""):
            raise InputError(f"--run-id must be 1-128 characters of letters, digits, '.', '_' or '-'; got {self.run_id!r}")
        fs, root = filesystem(self.output)
        self.root = Folder(fs, root)
        self.folder = Folder(fs, f"{root}/{self.run_id}")

    @property
    def url(self) -> str:
        return self.folder.url()

    # -- config -----------------------------------------------------------
    def read_config(self) -> dict | None:
        return self.folder.read_json("config.json")

    def claim(self, config: dict, compare_keys: tuple[str, ...]) -> bool:
        """Write ``config`` for a new run, or check it against the stored one (resume).

        Returns True when the run already existed. A stored config that differs
        in any of ``compare_keys`` is bad input: nothing is written.
        """
        stored = self.read_config()
        if stored is None:
            self.folder.write_json("config.json", config)
            return False
        for key in compare_keys:
            if to_jsonable(stored.get(key)) != to_jsonable(json.loads(dumps(config.get(key)))):
                raise InputError(
                    f"run id {self.run_id!r} in {self.output!r} was started with {key}={stored.get(key)!r}, "
                    f"not {config.get(key)!r}; use another --run-id"
                )
        return True

    # -- rounds and state ---------------------------------------------------
    def write_round(self, n: int, frame: pd.DataFrame) -> None:
        self.folder.write_parquet(f"rounds/{n:05d}.parquet", frame)

    def read_rounds(self, upto: int | None = None) -> pd.DataFrame:
        frames = []
        for name in self.folder.list("rounds"):
            if not name.endswith(".parquet"):
                continue
            n = int(name.split(".")[0])
            if upto is not None and n > upto:
                continue
            frames.append(self.folder.read_parquet(f"rounds/{name}"))
        if not frames:
            return pd.DataFrame(columns=["model", "item_id", "score", "round", "prob"])
        return pd.concat(frames, ignore_index=True)

    def write_state(self, label: str, state: dict) -> None:
        self.folder.write_json(f"state/{safe_name(label)}.json", state)

    def read_state(self, label: str) -> dict | None:
        return self.folder.read_json(f"state/{safe_name(label)}.json")

    def commit_round(self, marker: dict) -> None:
        """The commit point of a round: written last, after its rounds file and every state."""
        self.folder.write_json(RUN_MARKER, marker)

    def read_marker(self) -> dict | None:
        return self.folder.read_json(RUN_MARKER)

    def write_results(self, results: dict) -> None:
        self.folder.write_json("results.json", results)

    def read_results(self) -> dict | None:
        return self.folder.read_json("results.json")

    def cache(self, key: str) -> "ScoreCache":
        return ScoreCache(self.root.fs, f"{self.root.path}/{CACHE_DIR}/{key}")


def item_key(item: dict[str, Any], prompt_fields: tuple[str, ...] = ("question", "choices", "answer", "answers", "prompt")) -> str:
    """Cache key of one item: its id plus a digest of its prompt fields (same id, other text → other key)."""
    fields = {f: item[f] for f in prompt_fields if f in item and item[f] is not None}
    if not fields:
        return str(item["item_id"])
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True, default=_json_default).encode()).hexdigest()[:12]
    return f"{item['item_id']}|{digest}"


def cache_key(spec_text: str, scorer: str, generation: dict[str, Any]) -> str:
    """Digest naming the cache of one model under one scorer and generation settings."""
    blob = json.dumps({"spec": spec_text, "scorer": scorer, "generation": generation}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


class ScoreCache:
    """Scores already paid for by one model (spec + scorer + generation settings), in Parquet parts.

    A batch's scores are written by the model actor as ONE part for all the models it carried, under
    the caches' common parent: ``_cache/_shared/parts/<uuid>.parquet`` with a ``cache`` column naming
    each row's cache (a ranking of 2,000 replayed models wrote 2,000 files a round, one per model,
    before). Parts a cache folder holds itself (``_cache/<key>/parts/``, runs before the shared parts)
    are still read. Parts are immutable and uniquely named, so concurrent writers (several replicas,
    several runs) never conflict and a crash leaves whole parts only.
    """

    COLUMNS = ["item_key", "item_id", "score", "tokens", "latency_s"]
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
    def add_many(entries: list[tuple["ScoreCache", list[dict[str, Any]]]]) -> None:
        """Write the rows of several caches: one part per shared folder."""
        by_folder: dict[str, tuple[Folder, list[pd.DataFrame]]] = {}
        for cache, rows in entries:
            if rows:
                frame = pd.DataFrame(rows)[ScoreCache.COLUMNS].assign(cache=cache.key)
                by_folder.setdefault(cache.shared.path, (cache.shared, []))[1].append(frame)
        for folder, frames in by_folder.values():
            folder.write_parquet(f"parts/{uuid.uuid4().hex}.parquet", pd.concat(frames, ignore_index=True))

    def load(self) -> dict[str, float]:
        """``item_key -> score`` of every cached score (first one wins if parts overlap)."""
        return ScoreCache.load_many([self])[0]

    def _load_own(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in self.folder.list("parts"):
            if not name.endswith(".parquet"):
                continue
            part = self.folder.read_parquet(f"parts/{name}")
            if part is None:
                continue
            for key, score in zip(part["item_key"].astype(str), part["score"].astype(float)):
                out.setdefault(key, score)
        return out

    @staticmethod
    def load_many(caches: list["ScoreCache"], threads: int = 16) -> list[dict[str, float]]:
        """``load()`` of many caches, reading each shared folder once (not once per model)."""
        from concurrent.futures import ThreadPoolExecutor

        if not caches:
            return []
        with ThreadPoolExecutor(max_workers=min(threads, len(caches))) as pool:  # storage latency, not CPU
            out = list(pool.map(ScoreCache._load_own, caches))
        wanted: dict[str, tuple[Folder, dict[str, list[int]]]] = {}
        for i, cache in enumerate(caches):
            wanted.setdefault(cache.shared.path, (cache.shared, {}))[1].setdefault(cache.key, []).append(i)
        for folder, index in wanted.values():
            for name in folder.list("parts"):
                if not name.endswith(".parquet"):
                    continue
                part = folder.read_parquet(f"parts/{name}")
                if part is None:
                    continue
                part = part[part["cache"].isin(list(index))]
                for key, rows in part.groupby("cache", sort=False):
                    pairs = list(zip(rows["item_key"].astype(str), rows["score"].astype(float)))
                    for i in index[key]:
                        for item, score in pairs:
                            out[i].setdefault(item, score)
        return out
