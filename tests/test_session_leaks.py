"""The session's leak check (tests/session_leaks.py) run on small sessions of its own: a session whose test leaves
a process (in a session of its own, as a daemon would be) or writes a file outside its temporary folders fails and
names it; the same session without the leak passes. The control: without these, a check that never fires would
pass the suite."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

CONFTEST = '''
import os
from pathlib import Path
import pytest
import session_leaks
from session_leaks import check_session, record_files

session_leaks.ROOT = Path(os.environ["LEAK_ROOT"])  # the checkout this small session watches
session_leaks.GRACE_S = 2.0

def pytest_configure(config):
    record_files(config)

@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session, exitstatus):
    pid_file = Path(os.environ["LEAK_ROOT"]).parent / "leaked.pid"
    if pid_file.exists():  # for a failure message: the leaked process as the check is about to look for it
        pid = pid_file.read_text()
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[:2]
        except OSError:
            state = "gone"
        (pid_file.parent / "leaked.state").write_text(f"pid {pid}: state, ppid {state}")
    check_session(session)
'''

LEAKY = '''
import os, subprocess, sys
from pathlib import Path

def test_it():
    if os.environ["LEAK"] == "process":
        leaked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", os.environ["LEAK_TAG"]],
                                  start_new_session=True)
        (Path(os.environ["LEAK_ROOT"]).parent / "leaked.pid").write_text(str(leaked.pid))
    elif os.environ["LEAK"] == "file":
        (Path(os.environ["LEAK_ROOT"]) / "certeval-runs").mkdir()
    elif os.environ["LEAK"] == "home":
        (Path(os.environ["HOME"]) / ".prefect").mkdir()
    elif os.environ["LEAK"] == "home-content":  # inside a place that existed before the session
        (Path(os.environ["HOME"]) / ".prefect" / "storage").mkdir()
'''


def _kill_tagged(tag: str) -> None:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if tag.encode() in cmd:
                os.kill(int(entry), signal.SIGKILL)


@pytest.mark.parametrize("leak,fails,workers", [("none", False, 0), ("process", True, 0), ("file", True, 0),
                                                ("home", True, 0), ("home-content", True, 0),
                                                ("process", True, 1)])
def test_a_session_that_leaves_a_process_or_a_file_fails_naming_it(leak, fails, workers, tmp_path):
    """``workers``: 1 runs the small session under pytest-xdist (the check in its controller, the leak in a worker
    that has exited by then)."""
    root, home, tests = tmp_path / "checkout", tmp_path / "home", tmp_path / "checkout" / "tests"
    tests.mkdir(parents=True)
    home.mkdir()
    if leak == "home-content":
        (home / ".prefect").mkdir()
    (tests / "conftest.py").write_text(CONFTEST)
    (tests / "test_leaky.py").write_text(LEAKY)
    tag = f"leak-{uuid.uuid4().hex}"
    env = {k: v for k, v in os.environ.items() if k != "CERTEVAL_TEST_SESSION"}  # a session of its own
    env.update(LEAK=leak, LEAK_ROOT=str(root), LEAK_TAG=tag, HOME=str(home),
               PYTHONPATH=f"{HERE}{os.pathsep}{env.get('PYTHONPATH', '')}")
    try:
        xdist = ["-n", str(workers)] if workers else ["-p", "no:xdist"]
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *xdist, str(tests)],
                              cwd=root, env=env, capture_output=True, text=True, timeout=120)
    finally:
        _kill_tagged(tag)
    report = [line for line in proc.stderr.splitlines() if line.startswith("session leak check:")]
    state = tmp_path / "leaked.state"  # missed once in a full run (2026-12-07): was it gone, or not found?
    assert (proc.returncode != 0) == fails, (leak, proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:],
                                             state.read_text() if state.exists() else None)
    assert bool(report) == fails, (leak, report)
    if leak == "process":
        assert tag in report[0] and "left running" in report[0]
    elif fails:
        assert "written outside" in report[0] and ("certeval-runs" in report[0] or ".prefect" in report[0])
