"""Start-up timeline: ``CERTEVAL_STARTUP_LOG=<file>`` makes a command append one line per start-up phase.

Each line is ``phase<TAB>unix time<TAB>pid``, written with one ``O_APPEND`` write, by the CLI
process (imports done, plan and bank ready, Prefect's API up, Ray up, model actors up) and by
the model actor itself (``first_call``: the first scoring call reached the actor). The
variable starts with ``CERTEVAL_``, so the actors receive it through their ``runtime_env``.
``benchmarks/startup.py`` reads it; unset (the default), :func:`mark` does nothing.

Standard library only and cheap to import: it is imported before anything else.
"""

from __future__ import annotations

import os
import time

ENV = "CERTEVAL_STARTUP_LOG"


def mark(phase: str) -> None:
    """Record that ``phase`` was reached now (no-op unless ``$CERTEVAL_STARTUP_LOG`` is set)."""
    path = os.environ.get(ENV)
    if not path:
        return
    line = f"{phase}\t{time.time():.6f}\t{os.getpid()}\n".encode()
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
