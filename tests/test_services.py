"""``certeval up`` / ``certeval down``: a Ray head and a Prefect server started once on 127.0.0.1 and reused by
the runs of the same working folder, then stopped with nothing left behind. Real processes throughout."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from test_pipeline_support import MIDDLE, PYTHON, replay

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]


def _env(home: Path) -> dict[str, str]:
    """A user's shell with no Ray or Prefect settings of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_"))}
    env.update(HOME=str(home), PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    return env


def _cli(work: Path, *argv: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "certeval", *argv], cwd=work, env=_env(work / "home"), capture_output=True,
                          text=True, timeout=timeout)


def _alive(groups: list[int]) -> list[int]:
    import psutil

    return [p.pid for p in psutil.process_iter(["pid"]) if _pgid(p.pid) in groups]


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


def test_runs_reuse_the_services_of_certeval_up_until_certeval_down(tmp_path):
    work = tmp_path / "project"
    (work / "home").mkdir(parents=True)
    certify = ["certify", "--model", replay(MIDDLE), "--goal", "halfwidth:0.1", "--json", "--quiet"]
    up = _cli(work, "up", "--num-cpus", "1")
    record = work / ".certeval" / "services.json"
    try:
        assert up.returncode == 0 and record.exists(), up.stdout + up.stderr
        services = json.loads(record.read_text())
        groups = [p["pid"] for p in services["processes"]]  # each service leads its own session and group
        assert len(groups) == 2 and _alive(groups)
        assert "already up" in _cli(work, "up").stdout  # a second up keeps the running ones

        run = _cli(work, *certify, "--run-id", "reused")
        assert run.returncode in (0, 1), run.stderr[-2000:]
        res = json.loads(run.stdout)
        assert res["pipeline"]["ray_address"] == services["ray_address"]  # connected, not started
        assert not (work / ".prefect").exists()  # no embedded Prefect server: the running one took the flow
        assert _alive(groups)  # the run left the services running
    finally:
        down = _cli(work, "down")
    assert down.returncode == 0 and not record.exists(), down.stdout + down.stderr
    assert _alive(groups) == []  # every process of both services ended

    # a record whose services are gone is ignored: the run starts its own Ray and Prefect, as without up
    record.write_text(json.dumps(services))
    run = _cli(work, *certify, "--run-id", "own")
    assert run.returncode in (0, 1), run.stderr[-2000:]
    assert json.loads(run.stdout)["pipeline"]["ray_address"] == "local"
    assert "nothing to stop" in _cli(work, "down").stdout or not record.exists()


def test_down_never_signals_a_process_the_record_did_not_start(tmp_path):
    """A stale record whose process id now belongs to another program: down removes the record and leaves it."""
    from certeval.services.up_down import proc_identity

    work = tmp_path / "project"
    (work / ".certeval").mkdir(parents=True)
    (work / "home").mkdir()
    other = subprocess.Popen(["sleep", "120"], start_new_session=True)
    try:
        ticks, cmdline, _ = proc_identity(other.pid)
        record = {"version": 2, "owner_uid": os.getuid(), "state": "up", "ray_address": "127.0.0.1:9",
                  "prefect_api_url": "http://127.0.0.1:9/api", "ray_dir": "/tmp/certeval-up-gone",
                  "processes": [{"role": "ray-head", "pid": other.pid, "start_ticks": ticks - 1,
                                 "cmdline": ["ray", "start", "/tmp/certeval-up-gone"]}]}
        (work / ".certeval" / "services.json").write_text(json.dumps(record))
        down = _cli(work, "down")
        assert down.returncode == 0 and not (work / ".certeval" / "services.json").exists(), down.stderr
        assert f"left alone pid {other.pid}" in down.stdout
        assert other.poll() is None  # still running: not one of ours
    finally:
        other.kill()
        other.wait()


def test_up_killed_while_ray_starts_leaves_a_record_down_acts_on(tmp_path):
    """certeval up SIGKILLed right after its Ray head's process started: the record already names that process
    (state starting), a run ignores it, and down stops the head with everything it started: no orphan."""
    import signal
    import time

    import psutil

    work = tmp_path / "project"
    (work / "home").mkdir(parents=True)
    record = work / ".certeval" / "services.json"
    up = subprocess.Popen([PYTHON, "-m", "certeval", "up", "--num-cpus", "1"], cwd=work, env=_env(work / "home"),
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    head = None
    try:
        deadline = time.monotonic() + 300
        while head is None and time.monotonic() < deadline and up.poll() is None:
            try:
                head = next(p for p in json.loads(record.read_text())["processes"] if p["role"] == "ray-head")
            except (OSError, ValueError, StopIteration, KeyError):
                time.sleep(0.1)
        assert head is not None, "up never recorded its Ray head"
        os.kill(up.pid, signal.SIGKILL)
        up.wait(timeout=30)
        assert json.loads(record.read_text())["state"] == "starting"
        time.sleep(2)  # the head's own children appear
        tree = {head["pid"]} | {c.pid for c in psutil.Process(head["pid"]).children(recursive=True)}
        down = _cli(work, "down")
        assert down.returncode == 0 and "stopped" in down.stdout and not record.exists(), down.stdout + down.stderr
        time.sleep(1)
        assert [pid for pid in tree if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"] == []
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
        if record.exists():
            _cli(work, "down")
