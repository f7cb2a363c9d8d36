"""Shared checks of the new-surface tables (tests/test_surfaces_*.py): one case is one command, and each asserts
the exit code, exactly one line on stderr naming the flag and echoing the value, nothing written (a listing of the
watched folders before and after) and no process left behind (this process's children before and after)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from certeval.cli import main


def listing(*folders: Path) -> dict[str, tuple[int, int]]:
    """Every path under ``folders`` (links not followed) with its size and modification time."""
    out: dict[str, tuple[int, int]] = {}
    for folder in folders:
        folder = Path(folder)
        if not folder.exists():
            continue
        for root, dirs, files in os.walk(folder, followlinks=False):
            for name in dirs + files:
                path = os.path.join(root, name)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                out[path] = (st.st_size, st.st_mtime_ns)
    return out


def children() -> set[int]:
    """Live (not zombie) descendants of this process."""
    alive = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.add(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def no_new_children(before: set[int], timeout_s: float = 10.0) -> set[int]:
    """The descendants started since ``before`` still alive after ``timeout_s`` (empty when none is left)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = children() - before
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def run_cli(argv: list[str], capsys) -> tuple[int, list[str], str]:
    """``certeval ARGV`` in this process: (exit code, the non-blank stderr lines, stdout)."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    captured = capsys.readouterr()
    return code, [line for line in captured.err.splitlines() if line.strip()], captured.out


def assert_refused(case_id: str, code: int, lines: list[str], *, want: int | tuple[int, ...] = 2,
                   flag: str | None = None, echo: str | None = None) -> None:
    """Exit ``want``, one stderr line, naming ``flag`` and echoing ``echo``, no traceback."""
    wants = (want,) if isinstance(want, int) else want
    assert code in wants, (case_id, code, lines)
    assert len(lines) == 1, (case_id, lines)
    assert "Traceback" not in lines[0], (case_id, lines[0])
    if flag is not None:
        assert flag.lower() in lines[0].lower(), (case_id, f"flag {flag!r} not named", lines[0])
    if echo is not None:
        assert echo.lower() in lines[0].lower(), (case_id, f"value {echo!r} not echoed", lines[0])
