"""Start-up timeline: ``--startup-log FILE`` makes a command append one line per start-up phase.

Each line is ``phase<TAB>unix time<TAB>pid``, written with one ``O_APPEND`` write, by the CLI
process (imports done, plan and bank ready, Prefect's API up, Ray up, model actors up) and by
the model actor itself (``first_call``: the first scoring call reached the actor). Each process
names the file once, by an explicit :func:`configure` call: the CLI from its ``--startup-log``,
an actor from its constructor argument (``RuntimeOptions.startup_log``).
``benchmarks/startup.py`` reads it; not configured (the default), :func:`mark` writes nothing to a file, but
every process keeps its own first marks in memory (:func:`seen`): results.json's ``pipeline.phases`` reads them.

Standard library only and cheap to import: it is imported before anything else.
"""

from __future__ import annotations

import os
import time

_MAX_EARLY = 16  # marks kept before configure() (e.g. "interpreter", before the flags are parsed)
_MAX_SEEN = 64  # phases remembered in memory (the first time each was reached)
_state: dict = {"path": None, "configured": False, "early": [], "seen": {}}


def configure(path: str | os.PathLike | None) -> None:
    """Name this process's timeline file (None: none); marks made before the first call are written then."""
    early, _state["early"] = _state["early"], []
    _state["path"] = os.fspath(path) if path else None
    _state["configured"] = True
    for line in early:
        _append(line)


def mark(phase: str) -> None:
    """Record that ``phase`` was reached now (written only once a timeline file is configured)."""
    now = time.time()
    seen = _state.setdefault("seen", {})
    if phase not in seen and len(seen) < _MAX_SEEN:
        seen[phase] = now
    counts = _state.setdefault("counts", {})
    if phase in seen:
        counts[phase] = counts.get(phase, 0) + 1
    line = f"{phase}\t{now:.6f}\t{os.getpid()}\n".encode()
    if not _state["configured"]:
        if len(_state["early"]) < _MAX_EARLY:
            _state["early"].append(line)
        return
    _append(line)


def seen(phase: str) -> float | None:
    """When this process first reached ``phase`` (unix time), or None."""
    return _state.get("seen", {}).get(phase)


def times_seen(phase: str) -> int:
    """How often this process has reached ``phase`` (a served deployment runs many flows in one process)."""
    return _state.get("counts", {}).get(phase, 0)


def _append(line: bytes) -> None:
    path = _state["path"]
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError:  # a timeline must never break a run
        pass


def read(path: str | os.PathLike) -> list[tuple[str, float, int]]:
    """The marks of a timeline file, in file order: ``(phase, unix time, pid)``."""
    out = []
    with open(path) as handle:
        for line in handle:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 3:
                out.append((parts[0], float(parts[1]), int(parts[2])))
    return out
