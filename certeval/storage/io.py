"""Storage primitives: fsspec filesystems with every call bounded, atomic folder writes, the one JSON
encoder, and the checks of an output location (certeval.storage holds the layout)."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import os
import re
import stat
import uuid
from typing import IO, Any

import fsspec
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from certeval.errors import InputError

from ..estimators.results import to_jsonable
from ..messages import shown

DEFAULT_OUTPUT = "./certeval-runs"
CACHE_DIR = "_cache"

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


# the most bytes a file a user names or a run folder holds is read with, checked from its declared size before any
# byte is read (a sparse multi-GiB file would end in MemoryError); ``--max-file-size`` sets one bound for all
MAX_TABLE_BYTES = 2 << 30  # score tables, banks, round files, history tables
MAX_RECORD_BYTES = 256 << 20  # JSON records: results.json, config.json, states, manifests
_max_file_bytes: list[int] = []  # --max-file-size of this command, when given


def set_max_file_bytes(limit: int | None) -> None:
    """``--max-file-size``: every file certeval reads is refused above ``limit`` bytes (None: the defaults)."""
    _max_file_bytes[:] = [] if limit is None else [int(limit)]


def file_limit(default: int) -> int:
    return _max_file_bytes[0] if _max_file_bytes else default


def _refuse(path: str, what: str, why: str) -> InputError:
    return InputError(f"{what} {shown(str(path))} {why}")


def _os_refusal(path: str, what: str, exc: OSError) -> InputError:
    if exc.errno == errno.ELOOP:
        return _refuse(path, what, "is a symbolic link loop (or too many links deep); refused unread")
    if exc.errno == errno.ENOENT:
        dangling = " (a link to nothing)" if os.path.islink(path) else ""
        return _refuse(path, what, f"does not exist{dangling}")
    if exc.errno == errno.ENOTDIR:
        return _refuse(path, what, "lies below a file, not in a folder")
    if exc.errno == errno.ENXIO:  # opening a socket
        return _refuse(path, what, "is not a regular file (a pipe, socket or device); refused unread")
    if exc.errno == errno.EISDIR:
        return _refuse(path, what, "is a folder, not a file")
    if exc.errno == errno.ENAMETOOLONG:
        return _refuse(path, what, "is too long a path for this file system")
    return _refuse(path, what, f"cannot be read ({exc.strerror or type(exc).__name__})")


def _check_size(size: int, path: str, what: str, limit: int) -> int:
    if size > limit:
        raise _refuse(path, what, f"declares {size} bytes, over the {limit} bytes a file is read with "
                                  "(--max-file-size); refused before reading")
    return int(size)


def _check_stat(st: os.stat_result, path: str, what: str, limit: int) -> int:
    if stat.S_ISDIR(st.st_mode):
        raise _refuse(path, what, "is a folder, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise _refuse(path, what, "is not a regular file (a pipe, socket or device); refused unread")
    return _check_size(st.st_size, path, what, limit)


def check_file(path: str, what: str, limit: int = MAX_TABLE_BYTES) -> int:
    """The size ``path`` declares (a sparse file's full length), checked before anything is read: InputError for a
    file that is missing, a folder, not a regular file (a pipe, socket, device), a symbolic link loop, or larger
    than ``limit`` (or ``--max-file-size``). Local paths and any fsspec URL."""
    limit = file_limit(limit)
    fs, local = filesystem(str(path))
    if is_local(fs):
        try:
            return _check_stat(os.stat(local), str(path), what, limit)
        except OSError as exc:
            raise _os_refusal(local, what, exc) from None
    try:
        info = bounded(fs, "info", local)
    except FileNotFoundError:
        raise _refuse(str(path), what, "does not exist") from None
    if info.get("type") == "directory":
        raise _refuse(str(path), what, "is a folder, not a file")
    return _check_size(int(info.get("size") or 0), str(path), what, limit)


def check_folder(path: str, what: str) -> None:
    """A local ``path`` is a folder (links followed): InputError for what is missing, a file, a pipe or device, or a
    symbolic link loop. Other stores have no such things; their reads name what is missing."""
    fs, local = filesystem(str(path))
    if not is_local(fs):
        return
    try:
        mode = os.stat(local).st_mode
    except OSError as exc:
        raise _os_refusal(local, what, exc) from None
    if not stat.S_ISDIR(mode):
        kind = "a file" if stat.S_ISREG(mode) else "a pipe, socket or device"
        raise _refuse(str(path), what, f"is {kind}, not a folder")


def open_file(path: str, what: str, limit: int = MAX_TABLE_BYTES) -> IO[bytes]:
    """The one way certeval opens a file a user names or a run folder holds, for reading in binary: checked as in
    :func:`check_file`. A local file is opened without blocking (``O_NONBLOCK``: a FIFO swapped in after the check
    cannot hang the read) and checked again through its descriptor."""
    fs, local = filesystem(str(path))
    if not is_local(fs):
        check_file(str(path), what, limit)
        return bounded(fs, "open", local, "rb")
    try:
        fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _os_refusal(local, what, exc) from None
    try:
        _check_stat(os.fstat(fd), str(path), what, file_limit(limit))
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_file(path: str, what: str, limit: int = MAX_TABLE_BYTES) -> bytes:
    """The bytes of ``path`` read through :func:`open_file`; a file that grew past the bound while read is refused."""
    bound = file_limit(limit)
    with open_file(path, what, limit) as handle:
        data = handle.read(bound + 1)
    if len(data) > bound:
        raise _refuse(str(path), what, f"holds more than the {bound} bytes a file is read with (--max-file-size)")
    return data


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


def dumps(obj: Any, *, indent: int | None = 2, compact: bool = False) -> bytes:
    """The one JSON encoder of certeval's files and outputs: every value through
    :func:`~certeval.estimators.results.to_jsonable` (numpy values and arrays to Python, NaN/inf to null: strict
    JSON). ``compact``: no whitespace at all (method states, JSON lines)."""
    if compact:
        return json.dumps(to_jsonable(obj), separators=(",", ":"), allow_nan=False).encode()
    return json.dumps(to_jsonable(obj), indent=indent, allow_nan=False).encode()


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

    def read_bytes(self, rel: str, limit: int = MAX_TABLE_BYTES) -> bytes | None:
        """The file's bytes, None when it does not exist; a local file through :func:`read_file` (a pipe, a link
        loop or a file over ``limit`` is refused in one line)."""
        if self.local:
            full = self.full(rel)
            if not os.path.lexists(full):
                return None
            return read_file(full, "run folder file", limit)
        try:
            return bounded(self.fs, "cat_file", self.full(rel))
        except FileNotFoundError:
            return None

    def write_json(self, rel: str, obj: Any) -> None:
        self.write_bytes(rel, dumps(obj))

    def read_json(self, rel: str) -> Any:
        raw = self.read_bytes(rel, MAX_RECORD_BYTES)
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


def nearest_existing(path: str) -> str:
    """``path`` itself if it exists, else its nearest existing ancestor (``.`` for a relative path with none)."""
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    return probe or "."


def _check_local_output(output: str, path: str) -> None:
    """The folder exists and is writable, or its nearest existing ancestor is a writable folder."""
    probe = nearest_existing(path)
    if not os.path.isdir(probe):
        what = "is a file" if probe == path else f"lies below the file {probe!r}"
        raise InputError(f"--output {output!r} {what}, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"--output {output!r} is not writable ({probe!r} does not allow it)")




def _first(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return text or type(exc).__name__


def _damaged(folder: Folder, what: str) -> InputError:
    return InputError(f"run folder {folder.url()} is damaged: {what}; nothing was changed — start a new --run-id "
                      "or restore the folder")
