"""Runtime failures (exit 3): one line on stderr, the full traceback in the run folder's log.

A pipeline command names its run folder with :func:`set_run_folder` once the
folder is claimed; :func:`record` then writes ``logs/failure-<UTC time>.log``
there (atomically, like every other object). When the run folder itself cannot
be written (the storage is what failed), the traceback goes to a private file
in the local temporary folder instead, and the one line says where.
"""

from __future__ import annotations

import datetime as _dt
import os
import tempfile
import threading
import traceback

from certeval.runtime.redact import redact

_RUN_FOLDER: dict[str, object] = {}


def set_run_folder(store) -> None:
    """The :class:`~certeval.storage.RunStore` whose ``logs/`` receives a failure's traceback."""
    _RUN_FOLDER["store"] = store


def clear_run_folder() -> None:
    _RUN_FOLDER.pop("store", None)


def one_line(exc: BaseException, limit: int = 300) -> str:
    """``Type: first line of the message`` (Ray and Prefect wrap causes in many-line messages)."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException) and cause is not exc:  # ray.exceptions.RayTaskError
        exc = cause
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    text = redact(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _causes(exc: BaseException) -> list[BaseException]:
    out, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        out.append(exc)
        cause = getattr(exc, "cause", None)  # ray.exceptions.RayTaskError
        exc = cause if isinstance(cause, BaseException) else (exc.__cause__ or exc.__context__)
    return out


def next_step(exc: BaseException) -> str:
    """What to try after a runtime failure, for its one line: a start failure already names it (retry, or
    ``certeval up``); a claimed run folder is resumed by the same command; a failure of Ray or Prefect may need
    them started once with ``certeval up``."""
    causes = _causes(exc)
    if any(type(c).__name__ == "StartError" for c in causes):
        return ""  # its message ends with what to try
    services = any(type(c).__module__.split(".")[0] in ("ray", "prefect", "grpc") for c in causes)
    also = "; if Ray or Prefect keeps failing, start them once with `certeval up` and run from the same folder" \
        if services else ""
    if _RUN_FOLDER.get("store") is None:
        return "retry the command" + also
    return "the run folder is resumable: rerun the same command (same --run-id) to go on from its last round" + also


def record(exc: BaseException) -> str | None:
    """Write the traceback; return where it went (a URL or local path), or None when nothing could be written."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%dT%H%M%S")
    body = redact("".join(traceback.format_exception(type(exc), exc, exc.__traceback__))).encode()
    store = _RUN_FOLDER.get("store")
    if store is not None:
        rel = f"logs/failure-{stamp}-{os.getpid()}.log"
        if _write_bounded(store.folder, rel, body):
            return store.folder.url(rel)
    try:
        fd, path = tempfile.mkstemp(prefix=f"certeval-failure-{stamp}-", suffix=".log")
        with os.fdopen(fd, "wb") as handle:  # mkstemp: mode 0600, only the user reads it
            handle.write(body)
        return path
    except OSError:
        return None


def _write_bounded(folder, rel: str, body: bytes, timeout_s: float = 10.0) -> bool:
    """Write within ``timeout_s`` (a stalled object store must not hold the exit); False if it did not."""
    done: list[bool] = []

    def write() -> None:
        try:
            folder.write_bytes(rel, body)
            done.append(True)
        except Exception:  # the storage is what failed: the caller keeps the traceback locally
            pass

    worker = threading.Thread(target=write, daemon=True, name="certeval-failure-log")
    worker.start()
    worker.join(timeout_s)
    return bool(done)
