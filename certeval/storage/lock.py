"""One writer per run: :class:`RunLock` (a local lock file or an object-store lease) and the clean-up of
temporaries that killed writes left behind."""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time
import uuid

from certeval.errors import InputError

from .io import CACHE_DIR, Folder, bounded

LOCK_NAME = "run.lock"
RELEASE_WAIT_S = 5.0
LEASE_S = 60.0  # an object-store lease not renewed for this long belongs to a dead writer
# A flow retried by an orchestrator after its worker died finds the dead worker's lease: it waits it out.
STALE_LEASE_WAIT_S = LEASE_S + 10.0
_HELD: dict[str, RunLock] = {}
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
