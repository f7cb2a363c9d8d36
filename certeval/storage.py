"""Run folders on any fsspec URL (DESIGN §5) and the per-model score cache.

Layout of one run::

    <root>/<run_id>/config.json          what was asked (compared on resume)
    <root>/<run_id>/rounds/<n>.parquet   model, item_id, score, output, prompt_hash, round, prob, look log
    <root>/<run_id>/state/<model>.json   method state after the last complete round (compact JSON)
    <root>/<run_id>/features/<sha256>.npy  per-item constant arrays of the states (embeddings, subset codes,
                                         history priors, strata), once per run, named by their content
    <root>/<run_id>/state/_run.json      the commit marker: last complete round + decisions
    <root>/<run_id>/results.json         estimates, intervals, decisions, ranking; lm-eval block
    <root>/<run_id>/manifest.json        each round file's size, sha256 and rows per model
    <root>/<run_id>/run.lock             held by the one process writing the run (see RunLock)
    <root>/<run_id>/logs/failure-*.log   the traceback of a runtime failure (exit 3)

and, shared by every run under the same root::

    <root>/_cache/<key>/meta.json        what the cache <key> holds (model spec, scorer, generation settings)
    <root>/_cache/_shared/parts/*.parquet  scores already paid for, one part per scored batch (column ``cache``),
                                         with the model's output and the item's prompt hash (null where
                                         there is none: replay models, parts written before they were kept),
                                         merged into one part when a folder holds more than MAX_PARTS

Every write is atomic: a local file is written under a temporary name in the
same folder and then renamed (``os.replace``); an object store receives one
PUT, which becomes visible only when complete. Nothing is ever half-written
under a final name, so a SIGKILL at any point leaves the folder readable.
State is JSON, never pickle.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
import json
import os
import re
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .estimators._validation import InputError
from .estimators.results import to_jsonable

DEFAULT_OUTPUT = "./certeval-runs"
CACHE_DIR = "_cache"
RUN_MARKER = "state/_run.json"
MANIFEST = "manifest.json"  # rounds written: size, sha256 and rows per model of each (checked on resume)
MANIFEST_VERSION = 1


def round_name(n: int) -> str:
    return f"rounds/{n:05d}.parquet"
# storage options for s3: every call bounded. botocore makes one attempt (connect 3 s, read 10 s) and s3fs
# retries it once (S3_CALL_TRIES) instead of 5 x botocore's own retries (316 s on a stalled server). A PUT to a
# stalled server ignores the read timeout altogether, so every call of an async filesystem also runs under an
# overall deadline (call_timeout_s): no storage call waits longer, whatever the library does inside.
_S3_OPTIONS = {
    "skip_instance_cache": True,
    "config_kwargs": {"connect_timeout": 3, "read_timeout": 10, "retries": {"total_max_attempts": 1}},
}
S3_CALL_TRIES = 2
CALL_TIMEOUT_S = 30.0
CALL_SECONDS_PER_MB = 1.0  # large uploads (pairs tables) get more time: 1 MB/s at worst


def call_timeout_s(size: int = 0) -> float:
    return CALL_TIMEOUT_S + CALL_SECONDS_PER_MB * size / 2**20


def bounded(fs: fsspec.AbstractFileSystem, method: str, *args: Any, size: int = 0, **kwargs: Any) -> Any:
    """``fs.<method>(*args)`` under an overall deadline (async filesystems: s3fs, gcsfs ...); a stalled store
    raises :class:`TimeoutError` naming the object and the wait instead of hanging."""
    from fsspec.asyn import AsyncFileSystem
    from fsspec.exceptions import FSTimeoutError

    if not isinstance(fs, AsyncFileSystem):
        return getattr(fs, method)(*args, **kwargs)
    timeout = call_timeout_s(size)
    try:
        return getattr(fs, method)(*args, timeout=timeout, **kwargs)
    except FSTimeoutError:
        where = fs.unstrip_protocol(str(args[0])) if args else fs.protocol
        raise TimeoutError(f"object store did not answer within {timeout:.0f} s ({method} {where})") from None


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"not JSON-serialisable: {type(value).__name__}")


def dumps(obj: Any, *, indent: int | None = 2, compact: bool = False) -> bytes:
    """The one JSON encoder of certeval's files and outputs: numpy values to Python, NaN/inf to null (strict
    JSON). ``compact``: no whitespace at all (method states, JSON lines)."""
    if compact:
        return json.dumps(to_jsonable(obj), separators=(",", ":"), default=_json_default, allow_nan=False).encode()
    return json.dumps(to_jsonable(obj), indent=indent, default=_json_default, allow_nan=False).encode()


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
    elif hasattr(fs, "retries"):  # s3fs: class default 5 tries, each with botocore's own retries
        fs.retries = S3_CALL_TRIES
    return fs, path.rstrip("/")


def parquet_bytes(frame: pd.DataFrame) -> bytes:
    """A table as the bytes of a Parquet file (no index column)."""
    sink = io.BytesIO()
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), sink)
    return sink.getvalue()


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether an fsspec filesystem is the local one (paths are plain paths)."""
    return "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))


def stage_file(target: str, data: bytes) -> str:
    """Write ``data`` to a hidden temporary beside the local path ``target`` (synced to disk) and return its path;
    the caller moves it into place. On failure (a full disk, an interrupt) no temporary is left behind."""
    folder = os.path.dirname(target)
    os.makedirs(folder, exist_ok=True)
    tmp = os.path.join(folder, f".{os.path.basename(target)}.{uuid.uuid4().hex}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return tmp


class Folder:
    """Atomic reads and writes below one folder of an fsspec filesystem."""

    def __init__(self, fs: fsspec.AbstractFileSystem, path: str) -> None:
        self.fs = fs
        self.path = path.rstrip("/")
        self.local = is_local(fs)

    def full(self, rel: str) -> str:
        return f"{self.path}/{rel}" if rel else self.path

    def url(self, rel: str = "") -> str:
        full = self.full(rel)
        return full if self.local else self.fs.unstrip_protocol(full)

    def exists(self, rel: str) -> bool:
        return bool(bounded(self.fs, "exists", self.full(rel)))

    def write_bytes(self, rel: str, data: bytes) -> None:
        target = self.full(rel)
        if self.local:
            tmp = stage_file(target, data)
            try:
                os.replace(tmp, target)
            except BaseException:
                os.remove(tmp)
                raise
        else:  # one PUT: the object appears complete or not at all
            bounded(self.fs, "pipe_file", target, data, size=len(data))

    def read_bytes(self, rel: str) -> bytes | None:
        try:
            return bounded(self.fs, "cat_file", self.full(rel))
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
        self.write_bytes(rel, parquet_bytes(frame))

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
            entries = bounded(self.fs, "ls", self.full(rel), detail=False, refresh=True) if not self.local else \
                self.fs.ls(self.full(rel), detail=False)
        except FileNotFoundError:
            return []
        names = [str(e).rstrip("/").rsplit("/", 1)[-1] for e in entries]
        return sorted(n for n in names if not n.startswith("."))


def check_reachable(output: str) -> None:
    """Fail fast (InputError) when the output location cannot be listed or created."""
    fs, path = filesystem(output)
    try:
        local = is_local(fs)
        if local:  # checked, not created: nothing is written before every check has passed
            _check_local_output(output, path)
            return
        if bounded(fs, "exists", path):
            if bounded(fs, "isfile", path):
                raise InputError(f"--output {output!r} is a file, not a folder")
            return
        bucket = path.split("/", 1)[0]
        if not bounded(fs, "exists", bucket):
            raise InputError(f"--output {output!r}: bucket {bucket!r} does not exist")
    except InputError:
        raise
    except PermissionError as exc:
        raise InputError(f"--output {output!r} is not writable: {exc}") from None
    except Exception as exc:  # unreachable endpoint, bad credentials, DNS ...
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise InputError(f"--output {output!r} is unreachable: {type(exc).__name__}: {first}") from None


def _check_local_output(output: str, path: str) -> None:
    """The folder exists and is writable, or its nearest existing ancestor is a writable folder."""
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        what = "is a file" if probe == path else f"lies below the file {probe!r}"
        raise InputError(f"--output {output!r} {what}, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"--output {output!r} is not writable ({probe!r} does not allow it)")


REFS_DIR = "features"  # per-item constant arrays of a run's method states, one file per content hash
REF_KEY = "features_ref"
REF_MIN_VALUES = 256  # smaller arrays stay inline (a reference and a file would cost more than they save)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def array_digest(arr: np.ndarray) -> str:
    """sha256 of an array's dtype, shape and C-order bytes: the name of its file under ``features/``."""
    arr = np.ascontiguousarray(arr)
    digest = hashlib.sha256(f"{arr.dtype.str}{list(arr.shape)}|".encode())
    digest.update(arr.tobytes())
    return digest.hexdigest()


def _swap_state_arrays(state: Any, fn: Any) -> Any:
    """A copy of a stored state (``{"round", "method_state", "decision"}``) with ``fn`` applied to each value
    that is the same at every round of a run: the bank's ``features`` and ``subsets``, its history prior's
    ``item_mean`` and ``factors`` (both sides of a pair prior) and the method's feature ``strata``. Only the
    dicts on the way are copied; anything else is returned as it is."""
    if not isinstance(state, dict) or not isinstance(state.get("method_state"), dict):
        return state
    method = dict(state["method_state"])

    def history(h: Any) -> Any:
        if not isinstance(h, dict):
            return h
        h = dict(h)
        if h.get("pair"):
            for side in ("a", "b"):
                h[side] = history(h.get(side))
            return h
        for key in ("item_mean", "factors"):
            if key in h:
                h[key] = fn(h[key])
        return h

    if isinstance(method.get("bank"), dict):
        bank = dict(method["bank"])
        for key in ("features", "subsets"):
            if key in bank:
                bank[key] = fn(bank[key])
        if "history" in bank:
            bank["history"] = history(bank["history"])
        method["bank"] = bank
    if isinstance(method.get("extra"), dict) and "strata" in method["extra"]:
        method["extra"] = {**method["extra"], "strata": fn(method["extra"]["strata"])}
    return {**state, "method_state": method}


FLOATS_KEY = "f64"
FLOATS_MIN = 64  # shorter float lists stay as JSON numbers


def _swap_float_logs(state: Any, fn: Any) -> Any:
    """A copy of a stored state with ``fn`` applied to the method's absorbed ``scores`` and to each value of
    its ``extra`` (draw logs, running statistics: what grows round by round)."""
    if not isinstance(state, dict) or not isinstance(state.get("method_state"), dict):
        return state
    method = dict(state["method_state"])
    if "scores" in method:
        method["scores"] = fn(method["scores"])
    if isinstance(method.get("extra"), dict):
        method["extra"] = {k: fn(v) for k, v in method["extra"].items()}
    return {**state, "method_state": method}


def _pack_floats(value: Any) -> Any:
    """A 1-D or 2-D list of floats (None for a non-finite value, as strict JSON stores it) as base64 of its
    little-endian float64 bytes, when that is shorter than the JSON numbers (10.7 characters a value against
    ~19 for a float's shortest repr); anything else as it is."""
    if not isinstance(value, list) or len(value) < FLOATS_MIN:
        return value
    rows = value if all(isinstance(v, list) for v in value) else None
    flat = [x for row in rows for x in row] if rows is not None else value
    if not flat or not all(type(x) is float or x is None for x in flat):
        return value
    if rows is not None and len({len(row) for row in rows}) != 1:
        return value
    arr = np.array([np.nan if x is None else x for x in flat], dtype="<f8")
    text = base64.b64encode(arr.tobytes()).decode("ascii")
    if len(text) + 40 >= len(json.dumps(value, separators=(",", ":"), allow_nan=False)):
        return value
    shape = [len(rows), len(rows[0])] if rows is not None else [len(flat)]
    return {FLOATS_KEY: text, "shape": shape}


def _unpack_floats(value: Any, where: str) -> Any:
    """Inverse of :func:`_pack_floats` (non-finite values back to None, as the JSON numbers would read)."""
    if not (isinstance(value, dict) and set(value) == {FLOATS_KEY, "shape"}):
        return value
    try:
        arr = np.frombuffer(base64.b64decode(value[FLOATS_KEY], validate=True), dtype="<f8")
        arr = arr.reshape([int(n) for n in value["shape"]])
    except (ValueError, TypeError, binascii.Error) as exc:
        raise InputError(f"{where} is damaged (a packed float list does not decode: {_first(exc)}); start a new "
                         "--run-id or restore the file") from None
    clean = np.where(np.isfinite(arr), arr, np.nan).tolist()
    if arr.ndim == 1:
        return [None if x != x else x for x in clean]
    return [[None if x != x else x for x in row] for row in clean]


class StateArrays:
    """Per-item constant arrays of a run's states, stored once under ``features/<sha256>.npy`` (atomic, never
    rewritten) and named in the state by ``{"features_ref": <sha256>, "shape", "dtype"}`` instead of inline:
    384-d embeddings of 567 items were 4.5 MB of JSON per model and round. A state written before (arrays
    inline) reads as it always did."""

    def __init__(self, folder: Folder) -> None:
        self.folder = folder
        self._written: set[str] = set()
        self._read: dict[str, np.ndarray] = {}

    def slim(self, state: Any) -> Any:
        """The state to write: large constant arrays replaced by references (their files written once), long
        float logs packed."""
        return _swap_float_logs(_swap_state_arrays(state, self._put), _pack_floats)

    def _put(self, value: Any) -> Any:
        if not isinstance(value, list) or not value:
            return value
        try:
            arr = np.asarray(value)
        except ValueError:  # ragged: not an array
            return value
        if arr.dtype.kind not in "iuf" or arr.size < REF_MIN_VALUES:
            return value
        arr = arr.astype(np.float64 if arr.dtype.kind == "f" else np.int64)
        sha = array_digest(arr)
        if sha not in self._written:
            rel = f"{REFS_DIR}/{sha}.npy"
            if not self.folder.exists(rel):  # content-named: an existing file already holds these bytes
                sink = io.BytesIO()
                np.save(sink, arr, allow_pickle=False)
                self.folder.write_bytes(rel, sink.getvalue())
            self._written.add(sha)
        return {REF_KEY: sha, "shape": list(arr.shape), "dtype": arr.dtype.str}

    def resolve(self, state: Any, where: str = "the state") -> Any:
        """The state as the method wrote it: every reference replaced by its array (as nested lists)."""
        def get(value: Any) -> Any:
            if not (isinstance(value, dict) and REF_KEY in value):
                return value
            return self._get(value, where).tolist()

        state = _swap_float_logs(state, lambda v: _unpack_floats(v, where))
        return _swap_state_arrays(state, get)

    def _get(self, ref: dict, where: str) -> np.ndarray:
        sha = ref.get(REF_KEY)
        if not isinstance(sha, str) or not _SHA256.match(sha):
            raise self._damaged(f"{where} holds a malformed array reference {sha!r}")
        if sha in self._read:
            return self._read[sha]
        rel = f"{REFS_DIR}/{sha}.npy"
        raw = self.folder.read_bytes(rel)
        if raw is None:
            raise self._damaged(f"{rel}, named by {where}, is missing")
        try:
            arr = np.load(io.BytesIO(raw), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise self._damaged(f"{rel} is not a readable array ({_first(exc)})") from None
        if array_digest(arr) != sha or ("shape" in ref and list(arr.shape) != list(ref["shape"])):
            raise self._damaged(f"{rel} differs from what was written (its content hash does not match)")
        self._read[sha] = arr
        return arr

    def _damaged(self, what: str) -> InputError:
        return _damaged(self.folder, what)


def _first(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text or type(exc).__name__


def _damaged(folder: Folder, what: str) -> InputError:
    return InputError(f"run folder {folder.url()} is damaged: {what}; nothing was changed — start a new --run-id "
                      "or restore the folder")


def _check_round(folder: Folder, n: int, entry: dict) -> None:
    """Round n's file is present and byte-identical (size, sha256) to what its manifest entry recorded."""
    data = folder.read_bytes(round_name(n))
    if data is None:
        raise _damaged(folder, f"{round_name(n)} is missing")
    if len(data) != entry.get("bytes") or hashlib.sha256(data).hexdigest() != entry.get("sha256"):
        raise _damaged(folder, f"{round_name(n)} differs from what was written ({len(data)} bytes, "
                               f"{entry.get('bytes')} recorded)")


def verify_record(folder: Folder) -> None:
    """For readers of a stored run folder (rescore, ``--history``): every round its manifest lists is present and
    byte-identical, and no round file stands outside it (an edited, deleted or stray round is refused)."""
    manifest = folder.read_json(MANIFEST)
    files = {name for name in folder.list("rounds") if name.endswith(".parquet")}
    if manifest is None:
        if files:
            raise _damaged(folder, f"{MANIFEST} is missing while rounds/ holds files")
        return
    if not (isinstance(manifest, dict) and isinstance(manifest.get("rounds"), dict)):
        raise _damaged(folder, f"{MANIFEST} is not a manifest")
    listed = set()
    for key, entry in manifest["rounds"].items():
        if not (str(key).isdigit() and isinstance(entry, dict)):
            raise _damaged(folder, f"{MANIFEST} has an entry {key!r} that names no round")
        _check_round(folder, int(key), entry)
        listed.add(round_name(int(key)).split("/", 1)[1])
    stray = sorted(files - listed)
    if stray:
        raise _damaged(folder, f"rounds/{stray[0]} is not in {MANIFEST} (a round from elsewhere)")


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
        self.arrays = StateArrays(self.folder)

    @property
    def url(self) -> str:
        return self.folder.url()

    # -- config -----------------------------------------------------------
    def read_config(self) -> dict | None:
        return self.folder.read_json("config.json")

    def claim(self, config: dict, compare_keys: tuple[str, ...]) -> bool:
        """Write ``config`` for a new run, or check it against the stored one (resume).

        Returns True when the run was started by another command: the stored config's ``invocation`` differs
        from ``config``'s (a command that claims twice is not resuming). A stored config that differs in any of
        ``compare_keys`` is bad input: nothing is written.
        """
        took = self.acquire_lock(wait_s=STALE_LEASE_WAIT_S)  # held already when a CLI runs the flow
        try:
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
            return stored.get("invocation") is None or stored.get("invocation") != config.get("invocation")
        finally:  # the lock guards the check-and-write; whoever runs the rounds holds it on its own
            if took:
                self.release_lock()

    # -- rounds and state ---------------------------------------------------
    def write_round(self, n: int, frame: pd.DataFrame) -> None:
        """The round's Parquet file, then its manifest entry (size, sha256, rows per model)."""
        data = parquet_bytes(frame)
        self.folder.write_bytes(round_name(n), data)
        manifest = self.read_manifest() or {"version": MANIFEST_VERSION, "rounds": {}}
        rows = frame["model"].astype(str).value_counts() if len(frame) else pd.Series(dtype=int)
        manifest["rounds"][f"{n:05d}"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
                                          "rows": {str(k): int(v) for k, v in rows.items()}}
        self.folder.write_json(MANIFEST, manifest)

    def read_manifest(self) -> dict | None:
        manifest = self.folder.read_json(MANIFEST)
        if manifest is not None and not (isinstance(manifest, dict) and isinstance(manifest.get("rounds"), dict)):
            raise InputError(f"{self.folder.url(MANIFEST)} is damaged (not a manifest); nothing was changed — "
                             "start a new --run-id or restore the file")
        return manifest

    def verify_rounds(self, committed: int, scored: dict[str, tuple[int, int]], *, may_leave: bool = False) -> None:
        """Refuse to resume from a record that differs from what was written.

        ``committed``: rounds ``0 .. committed - 1`` are closed for every model; each must be in the manifest,
        present, and byte-identical (sha256). ``scored[label] = (n, upto)``: the model's stored state says it
        absorbed ``n`` items in rounds ``0 .. upto - 1``, which must equal its recorded rows there (a raised or
        lowered round counter, a swapped or edited state file). ``may_leave``: paired runs, where a model leaves
        once its place is settled: its rows then fill a prefix of those rounds (none after it left).
        """
        manifest = self.read_manifest()
        if manifest is None:
            if any(name.endswith(".parquet") for name in self.folder.list("rounds")):
                raise self._damaged(f"{MANIFEST} is missing while rounds/ holds files")
            manifest = {"rounds": {}}
        entries = manifest["rounds"]
        for n in range(committed):
            entry = entries.get(f"{n:05d}")
            if entry is None:
                raise self._damaged(f"{MANIFEST} has no entry for {round_name(n)} (the states say it was committed)")
            _check_round(self.folder, n, entry)
        for label, (n_scored, upto) in scored.items():
            present = [int((entries.get(f"{n:05d}") or {}).get("rows", {}).get(label, 0)) > 0 for n in range(upto)]
            last = len(present) if not may_leave else (present.index(False) if False in present else len(present))
            for n in range(upto):  # a model takes part in every round until its last (or until it left)
                if present[n] != (n < last):
                    raise self._damaged(f"the state of {label!r} says round {upto - 1} was committed, but "
                                        f"{round_name(n)} holds {'no row' if n < last else 'rows'} of it")
            rows = sum(int(entries.get(f"{n:05d}", {}).get("rows", {}).get(label, 0)) for n in range(upto))
            if rows != n_scored:
                raise self._damaged(f"the state of {label!r} says {n_scored} items were scored, the committed "
                                    f"rounds hold {rows}")

    def verify_record(self) -> None:
        """For readers of a stored run (rescore, report): see :func:`verify_record`."""
        verify_record(self.folder)

    def _damaged(self, what: str) -> InputError:
        return _damaged(self.folder, what)

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
        """``state/<model>.json``, compact, with the per-item constant arrays by reference (``features/``)."""
        self.folder.write_bytes(f"state/{safe_name(label)}.json", dumps(self.arrays.slim(state), compact=True))

    def write_states(self, states: dict[str, dict], threads: int = 8) -> None:
        """:meth:`write_state` of many models: encoded here, written concurrently (a ranking's end writes
        thousands; on an object store each write is a round trip)."""
        from concurrent.futures import ThreadPoolExecutor

        if len(states) <= 1:
            for label, state in states.items():
                self.write_state(label, state)
            return
        payloads = [(f"state/{safe_name(label)}.json", dumps(self.arrays.slim(state), compact=True))
                    for label, state in states.items()]
        with ThreadPoolExecutor(max_workers=min(threads, len(payloads))) as pool:
            list(pool.map(lambda p: self.folder.write_bytes(*p), payloads))

    def read_state(self, label: str) -> dict | None:
        rel = f"state/{safe_name(label)}.json"
        return self.arrays.resolve(self.folder.read_json(rel), rel)

    def commit_round(self, marker: dict) -> None:
        """The commit point of a round: written last, after its rounds file and every state."""
        self.folder.write_json(RUN_MARKER, marker)

    def read_marker(self) -> dict | None:
        return self.folder.read_json(RUN_MARKER)

    def write_results(self, results: dict) -> None:
        self.folder.write_json("results.json", results)

    def read_results(self) -> dict | None:
        return self.folder.read_json("results.json")

    # -- one writer -----------------------------------------------------------
    def acquire_lock(self, wait_s: float = 0.0) -> bool:
        """Take the run's writer lock (idempotent in this process); True when this call took it.

        A second process asking for the same run folder gets :class:`InputError` at once, or, on an object
        store, after waiting up to ``wait_s`` for the other writer's lease to end or expire."""
        key = self.folder.url()
        if key in _HELD:
            return False
        lock = RunLock(self.folder, self.run_id)
        lock.acquire(wait_s)
        _HELD[key] = lock
        if self.folder.local:
            clean_temporaries(self.folder.path, self.root.path)
        return True

    def release_lock(self) -> None:
        lock = _HELD.pop(self.folder.url(), None)
        if lock is not None:
            lock.release()

    def cache(self, key: str) -> "ScoreCache":
        return ScoreCache(self.root.fs, f"{self.root.path}/{CACHE_DIR}/{key}")


LOCK_NAME = "run.lock"
RELEASE_WAIT_S = 5.0
LEASE_S = 60.0  # an object-store lease not renewed for this long belongs to a dead writer
# A flow retried by an orchestrator after its worker died finds the dead worker's lease: it waits it out.
STALE_LEASE_WAIT_S = LEASE_S + 10.0
_HELD: dict[str, "RunLock"] = {}
_TEMP = re.compile(r"^\..+\.[0-9a-f]{32}\.tmp$")  # Folder.write_bytes' temporaries
STALE_CACHE_TEMP_S = 600.0  # cache parts are shared by concurrent runs: only old temporaries are dead


def _dead_here(owner: dict) -> bool:
    """Whether a lease's writer ran on this host and its process is gone (a crash here need not wait for the
    lease to expire; a writer on another host can only be waited out)."""
    if owner.get("host") != socket.gethostname() or not isinstance(owner.get("pid"), int):
        return False
    try:
        os.kill(owner["pid"], 0)
    except ProcessLookupError:
        return True
    except OSError:  # alive, someone else's
        return False
    return False


class RunLock:
    """One writer per run folder.

    Local folders: an exclusive ``flock`` on ``run.lock``, released by the
    kernel when the process ends however it ends (SIGKILL included), so a
    crashed run never blocks its own resume. Object stores: a lease object
    created with a conditional PUT (``If-None-Match: *``), renewed every
    ``LEASE_S / 3`` seconds by a daemon thread and deleted on release; a lease
    not renewed for ``LEASE_S`` seconds is taken over. Where a server ignores
    the condition, the lease is read back after the PUT, so two writers racing
    within the same few milliseconds is the only case left unguarded.
    """

    def __init__(self, folder: Folder, run_id: str) -> None:
        self.folder = folder
        self.run_id = run_id
        self.owner = {"owner": uuid.uuid4().hex, "pid": os.getpid(), "host": socket.gethostname()}
        self._handle = None
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    def _busy(self, who: dict | None, extra: str = "") -> InputError:
        by = f" by pid {who.get('pid')} on {who.get('host')}" if who else ""
        return InputError(f"run id {self.run_id!r} in {self.folder.url()} is being written{by}{extra}; "
                          "wait for that run to end or use another --run-id")

    def acquire(self, wait_s: float = 0.0) -> None:
        """Take the lock; ``wait_s``: on an object store, keep trying that long while another writer's lease
        is live (a local lock is freed by the kernel when its holder dies, so it is refused at once)."""
        if self.folder.local:
            self._acquire_local()
            return
        deadline = time.monotonic() + max(0.0, float(wait_s))
        while True:
            try:
                self._acquire_lease()
                return
            except InputError:  # busy: a live lease, or one that may belong to a writer that just died
                if time.monotonic() >= deadline:
                    raise
                time.sleep(min(2.0, max(0.1, deadline - time.monotonic())))

    def _acquire_local(self) -> None:
        import fcntl

        os.makedirs(self.folder.path, exist_ok=True)
        path = self.folder.full(LOCK_NAME)
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.seek(0)
            try:
                who = json.loads(handle.read() or "null")
            except ValueError:
                who = None
            handle.close()
            raise self._busy(who) from None
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps(self.owner))
        handle.flush()
        self._handle = handle

    # -- object stores --------------------------------------------------------
    def _lease_body(self) -> bytes:
        return json.dumps({**self.owner, "expires": time.time() + LEASE_S}).encode()

    def _put_if_absent(self) -> bool:
        """Conditional create; False when an object is already there."""
        fs, full = self.folder.fs, self.folder.full(LOCK_NAME)
        bucket, _, key = full.partition("/")
        call = getattr(fs, "call_s3", None)
        if call is None:  # another object store: best effort, check then put
            if bounded(fs, "exists", full):
                return False
            bounded(fs, "pipe_file", full, self._lease_body())
            return True
        try:
            bounded(fs, "call_s3", "put_object", Bucket=bucket, Key=key, Body=self._lease_body(), IfNoneMatch="*")
            return True
        except (FileExistsError, PermissionError) as exc:  # s3fs maps 412 PreconditionFailed onto these
            if "Precondition" in str(exc) or isinstance(exc, FileExistsError):
                return False
            raise
        except OSError as exc:
            if "Precondition" in str(exc) or "412" in str(exc):
                return False
            raise

    def _read_lease(self) -> dict | None:
        raw = self.folder.read_bytes(LOCK_NAME)
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return None

    def _acquire_lease(self) -> None:
        for _ in range(2):
            if self._put_if_absent():
                held = self._read_lease()  # servers that ignore If-None-Match: the last PUT wins, check it is ours
                if held is not None and held.get("owner") != self.owner["owner"]:
                    raise self._busy(held)
                self._renewer = threading.Thread(target=self._renew, daemon=True, name="certeval-run-lease")
                self._renewer.start()
                return
            held = self._read_lease()
            if held is not None and float(held.get("expires", 0)) > time.time() and not _dead_here(held):
                left = float(held["expires"]) - time.time()
                raise self._busy(held, f" (its lease runs {left:.0f} s more unless renewed)")
            bounded(self.folder.fs, "rm_file", self.folder.full(LOCK_NAME))  # a dead writer's lease: take it over
        raise self._busy(self._read_lease())

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_S / 3):
            try:
                bounded(self.folder.fs, "pipe_file", self.folder.full(LOCK_NAME), self._lease_body())
            except Exception:  # storage trouble: the run's own writes will report it
                pass

    def release(self) -> None:
        if self._handle is not None:
            self._handle.close()  # closing the descriptor drops the flock; the file may stay
            self._handle = None
            return
        self._stop.set()

        def drop() -> None:
            try:
                if (self._read_lease() or {}).get("owner") == self.owner["owner"]:
                    bounded(self.folder.fs, "rm_file", self.folder.full(LOCK_NAME))
            except Exception:  # the lease expires on its own
                pass

        # bounded: releasing after a storage failure must not add another stalled call to the exit
        worker = threading.Thread(target=drop, daemon=True, name="certeval-release-lease")
        worker.start()
        worker.join(RELEASE_WAIT_S)


def clean_temporaries(run_path: str, root_path: str) -> list[str]:
    """Remove temporaries a killed write left behind: all of them in the run folder (its lock is held, so no
    write of it is in flight), and old ones in the shared score cache. Returns the removed paths."""
    removed = []
    now = time.time()
    for top, min_age in ((run_path, 0.0), (os.path.join(root_path, CACHE_DIR), STALE_CACHE_TEMP_S)):
        for folder, _, files in os.walk(top):
            for name in files:
                if not _TEMP.match(name):
                    continue
                path = os.path.join(folder, name)
                try:
                    if now - os.path.getmtime(path) >= min_age:
                        os.remove(path)
                        removed.append(path)
                except OSError:
                    pass
    return removed


PROMPT_FIELDS = ("question", "choices", "answer", "answers", "prompt")
ASKED_FIELDS = ("question", "choices", "prompt")  # what the model is shown (answers are the judge's business)


def item_key(item: dict[str, Any], prompt_fields: tuple[str, ...] = PROMPT_FIELDS) -> str:
    """Cache key of one item: its id plus a digest of its prompt fields (same id, other text → other key)."""
    fields = {f: item[f] for f in prompt_fields if f in item and item[f] is not None}
    if not fields:
        return str(item["item_id"])
    digest = hashlib.sha1(json.dumps(fields, sort_keys=True, default=_json_default).encode()).hexdigest()[:12]
    return f"{item['item_id']}|{digest}"


def prompt_hash(item: dict[str, Any]) -> str | None:
    """sha256 (16 hex) of what the model was shown — the item's ``question`` / ``choices`` / ``prompt`` — or None
    when it has none (a recorded-scores bank). Stored next to every output: ``certeval rescore`` checks that the
    bank still asks the same thing (its accepted answers may have been corrected since)."""
    fields = {f: item[f] for f in ASKED_FIELDS if f in item and _text_or_value(item[f]) is not None}
    if not fields:
        return None
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=_json_default).encode()).hexdigest()[:16]


def _text_or_value(value: Any) -> Any:
    return None if value is None or (isinstance(value, float) and value != value) else value


def cache_key(spec_text: str, scorer: str, generation: dict[str, Any]) -> str:
    """Digest naming the cache of one model under one scorer and generation settings."""
    blob = json.dumps({"spec": spec_text, "scorer": scorer, "generation": generation}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


MAX_PARTS = 16  # a cache folder holding more parts than this is merged into one (at a run's start and end)
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
            try:
                part = folder.read_parquet(f"parts/{name}")
            except InputError:  # damaged: skipped by readers, left alone here
                continue
        if part is None or not set(keys) | {"score"} <= set(part.columns):
            continue
        frames.append(part)
        merged.append(name)
    if len(merged) < 2:
        return 0
    whole = pd.concat(frames, ignore_index=True).drop_duplicates(subset=keys, keep="first")
    folder.write_parquet(f"parts/{uuid.uuid4().hex}.parquet", whole)
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
    def add_many(entries: list[tuple["ScoreCache", list[dict[str, Any]]]]) -> None:
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
            folder.write_parquet(f"parts/{uuid.uuid4().hex}.parquet", frame)

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
            try:
                part = self.folder.read_parquet(f"parts/{name}")
            except InputError:
                part = None
                self.skipped.append(name)
            if part is None:
                continue
            if not {"item_key", "score"} <= set(part.columns):
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
    def load_many(caches: list["ScoreCache"], threads: int = 16, compact: bool = False) -> list[dict[str, float]]:
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
                try:
                    part = folder.read_parquet(f"parts/{name}")
                except InputError:  # damaged: its items are scored again
                    part = None
                    for i in (i for ids in index.values() for i in ids):
                        caches[i].skipped.append(f"{ScoreCache.SHARED}/parts/{name}")
                if part is None:
                    continue
                if not {"cache", "item_key", "score"} <= set(part.columns):
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
    def compact_many(caches: list["ScoreCache"]) -> int:
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
