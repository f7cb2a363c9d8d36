"""The session's leak check (tests/conftest.py calls it when the session starts and ends): the suite's run leaves no process behind and no file outside its
temporary folders, or the session fails.

Every process the session starts, however deep (xdist workers, CLI subprocesses, Ray's GCS, raylet and workers,
Prefect's servers, watchdogs), inherits :data:`MARK` from the process that began the session. Once the session is
over (in the controller, after xdist's workers are gone and each process stopped the shared Ray and Prefect), a
process still carrying this session's mark is a leak, even one that was reparented to init when its parent died: the
session waits up to :data:`GRACE_S` for them to end (a watchdog polls every second), then names them and fails.
Sessions running beside it (another checkout's, another user's) carry other marks and are never counted.

Files: the checkout (every path but ``.git``, ``.venv``, caches and the quick benchmarks' results folder) and the
places in HOME certeval or its services would write (``.prefect``, ``.ray``, ``certeval-runs``, ``.certeval``, with
what they hold) are listed when the session starts and again when it ends; a new path is a file written outside the
temporary folders. tests/test_session_leaks.py runs a session with a planted leak of each kind (the control) and one
without.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

MARK = "CERTEVAL_TEST_SESSION"
GRACE_S = 60.0
ROOT = Path(__file__).resolve().parents[1]
SKIPPED = {".git", ".venv", ".cache", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache"}
# the quick benchmarks' results folder is the one place in the checkout the suite writes on purpose (git-ignored;
# tests/test_benchmarks_quick.py runs `python -m benchmarks all --quick`, which writes there)
DECLARED = ("benchmarks/results/_quick",)
HOME_PLACES = (".prefect", ".ray", "certeval-runs", ".certeval")

# the process that begins the session marks it; xdist workers and every child inherit the mark
os.environ.setdefault(MARK, f"{os.getpid()}-{uuid.uuid4().hex[:12]}")


def _controller(config) -> bool:
    return not hasattr(config, "workerinput")


def files_outside(root: Path | None = None, home: Path | None = None) -> set[str]:
    """Every path of the checkout (caches and virtual environments left out) and certeval's places in HOME."""
    out: set[str] = set()
    root = Path(root or ROOT)
    declared = {str(root / d) for d in DECLARED}
    for base, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in SKIPPED and os.path.join(base, d) not in declared]
        out.update(os.path.join(base, name) for name in dirs + files)
    home = Path(home or os.path.expanduser("~"))
    for name in HOME_PLACES:
        place = home / name
        if os.path.lexists(place):
            out.add(str(place))
        if place.is_dir() and not place.is_symlink():  # a place that existed before: what is written inside it
            for base, dirs, files in os.walk(place):
                out.update(os.path.join(base, entry) for entry in dirs + files)
    return out


def marked_processes(mark: str) -> dict[int, str]:
    """Live processes (zombies aside) whose environment holds ``MARK=mark``: pid → command line. This process and its
    own watchdog are left out: a command run in-process (``main([...])``) starts a watchdog of this process, which
    ends once this process does (certeval.runtime.watchdog)."""
    own_watchdog = f"certeval.runtime.watchdog {os.getpid()}"
    needle = f"{MARK}={mark}".encode()
    found: dict[int, str] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/stat", "rb") as fh:
                if fh.read().rsplit(b")", 1)[-1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace").strip()
            if not cmd.endswith(own_watchdog):
                found[int(entry)] = cmd[:160]
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return found


def record_files(config) -> None:
    """At the start of the session (its controller): what exists outside the temporary folders."""
    if _controller(config):
        config._certeval_files_before = files_outside()


def check_session(session) -> None:
    """At the end of the session (its controller, after the workers): fail it for every process left or file
    written outside the temporary folders."""
    config = session.config
    if not _controller(config) or not hasattr(config, "_certeval_files_before"):
        return
    deadline = time.monotonic() + GRACE_S
    left = marked_processes(os.environ[MARK])
    while left and time.monotonic() < deadline:
        time.sleep(1.0)
        left = marked_processes(os.environ[MARK])
    written = sorted(files_outside() - config._certeval_files_before)
    problems = [f"process {pid} left running: {cmd}" for pid, cmd in sorted(left.items())]
    problems += [f"file written outside the temporary folders: {path}" for path in written[:20]]
    if problems:
        for line in problems:
            print(f"session leak check: {line}", file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
