"""A watchdog that ends the processes a certeval command started once the command is gone.

Ray (GCS, raylet, agents, workers) and Prefect's embedded API server run as
descendants of the CLI. A normal exit, an exception or SIGTERM stops them through
their own shutdown hooks; a SIGKILL of the CLI runs no hook, and they would stay
(≈ 400 MB). :func:`watch_parent` starts one small detached process
(``python -m certeval.runtime.watchdog <pid>``) that records the command's descendants
every second (psutil) and, when the command has ended, sends them SIGTERM and,
two seconds later, SIGKILL. A process is recorded with its creation time, so a
reused pid is never signalled.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil

POLL_S = 1.0
GRACE_S = 2.0
_STARTED: dict[int, int] = {}  # this process's pid -> its watchdog's pid


def start_watchdog(options) -> None:
    """Ray and Prefect processes this process starts end with it, even after a SIGKILL, unless the run's options
    say ``watchdog=False`` (``--no-watchdog``)."""
    if options.watchdog:
        watch_parent()


def watch_parent() -> None:
    """Start the watchdog for this process (once per process; the CLI skips it under ``--no-watchdog``)."""
    me = os.getpid()
    if me in _STARTED:
        return
    proc = subprocess.Popen(
        [sys.executable, "-m", "certeval.runtime.watchdog", str(me)], stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,  # survives the parent's group
        close_fds=True,
    )
    # only its pid is kept: the watchdog outlives this process by design, and a Popen object still holding it at
    # exit makes Python note on stderr that the subprocess "is still running" (a second line beside the outcome)
    _STARTED[me] = proc.pid  # the Popen object goes now (subprocess reaps it later), while warnings are quiet


def _start_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return None


def descendants(root: int) -> dict[int, float]:
    """``pid -> creation time`` of every process below ``root``."""
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return {}
    out = {}
    for child in children:
        try:
            out[child.pid] = child.create_time()
        except psutil.Error:  # ended meanwhile
            continue
    return out


def _alive(pid: int, start: float) -> bool:
    return _start_time(pid) == start


def _signal_all(procs: dict[int, float], sig: int) -> None:
    for pid, start in procs.items():
        if pid != os.getpid() and _alive(pid, start):
            try:
                os.kill(pid, sig)
            except OSError:
                pass


def watch(parent: int) -> None:
    parent_start = _start_time(parent)
    if parent_start is None:
        return
    seen: dict[int, float] = {}
    while _alive(parent, parent_start):
        now = descendants(parent)
        now.pop(os.getpid(), None)
        seen = {pid: start for pid, start in {**seen, **now}.items() if _alive(pid, start)}
        time.sleep(POLL_S)
    # the orphans were re-parented: look below the recorded ones too (processes they started since the last poll)
    for pid in list(seen):
        seen.update(descendants(pid))
    _signal_all(seen, signal.SIGTERM)
    deadline = time.time() + GRACE_S
    while time.time() < deadline and any(_alive(p, s) for p, s in seen.items()):
        time.sleep(0.1)
    _signal_all(seen, signal.SIGKILL)


if __name__ == "__main__":
    watch(int(sys.argv[1]))
