"""CPU seconds per test, for whoever trims the suite next (the suite is CPU-bound on 2 cores: wall time per test
says little when three workers share them).

As a pytest plugin it appends one JSON line per test to ``$SUITE_CPU_PROFILE_DIR/<worker pid>.jsonl`` (default: the
temporary folder's ``certeval-suite-cpu``; give each run a fresh folder, the summary reads every file in it): the CPU
time of the test process, of the children it waited for, and of its live descendants (Ray's processes and actors,
servers, CLI subprocesses) between the test's start and its end. Run as a script it sums the lines per file::

    SUITE_CPU_PROFILE_DIR=/tmp/cpu PYTHONPATH=scripts .venv/bin/python -m pytest -p suite_cpu_profile -n 3 ...
    .venv/bin/python scripts/suite_cpu_profile.py /tmp/cpu

A descendant that exits during a test is counted through its parent's reaped-children time (if the parent is in
the tree), so a long-lived process ended in a test adds its whole life to that test. Left out: the workers' own
start-up and collection, and processes that leave the tree (a daemon re-parented to init), so the suite's total is
a lower bound of what it costs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

_DEFAULT_DIR = Path(tempfile.gettempdir()) / "certeval-suite-cpu"


def _cpu_now() -> tuple[float, dict[int, float]]:
    import psutil

    times = os.times()
    own = times.user + times.system + times.children_user + times.children_system
    live: dict[int, float] = {}
    try:
        descendants = psutil.Process().children(recursive=True)
    except psutil.Error:
        descendants = []
    for proc in descendants:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        live[proc.pid] = t.user + t.system + t.children_user + t.children_system
    return own, live


def _out_file():
    folder = Path(os.environ.get("SUITE_CPU_PROFILE_DIR") or _DEFAULT_DIR)
    folder.mkdir(parents=True, exist_ok=True)
    return (folder / f"{os.getpid()}.jsonl").open("a")


try:
    import pytest
except ImportError:  # run as the summing script outside the venv
    pytest = None

if pytest is not None:
    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        own0, live0 = _cpu_now()
        yield
        own1, live1 = _cpu_now()
        used = own1 - own0 + sum(cpu - live0.get(pid, 0.0) for pid, cpu in live1.items())
        with _out_file() as out:
            out.write(json.dumps({"test": item.nodeid, "cpu_s": round(used, 2)}) + "\n")


def summarise(folder: Path, top: int = 30) -> str:
    per_file: Counter = Counter()
    tests = 0
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            row = json.loads(line)
            per_file[row["test"].split("::")[0]] += row["cpu_s"]
            tests += 1
    lines = [f"{tests} tests, {sum(per_file.values()):.0f} CPU-s"]
    lines += [f"{cpu:8.1f}  {name}" for name, cpu in per_file.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(Path(sys.argv[1]) if len(sys.argv) > 1 else _DEFAULT_DIR))
