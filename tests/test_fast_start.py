"""The overlapped start-up (certeval.services.fast_start): switches, what counts as a user's Prefect, and a zero-config
run through ``benchmarks/startup.py --quick`` (both start-ups, the JSON's shape, no process left behind).
No timings are asserted here: they live in benchmarks/results/startup.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest

from certeval.cli import build_parser
from certeval.cli._runtime import runtime_options
from certeval.runtime import startup
from certeval.runtime.options import RuntimeOptions
from certeval.services import fast_start

ROOT = Path(__file__).resolve().parents[1]
CERTIFY = ["certify", "--model", "replay:bundled:helm_mmlu#openai_ada", "--goal", "halfwidth:0.1"]


@pytest.mark.parametrize("flags, parallel", [([], True), (["--sequential-start"], False)])
def test_sequential_start_flag(flags, parallel):
    assert runtime_options(build_parser().parse_args(CERTIFY + flags)).parallel_start is parallel


def test_prefect_settings_files_in_the_working_folder_leave_the_server_to_prefect(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not fast_start._settings_files()
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (tmp_path / ".env").write_text("OTHER=1\n")
    assert not fast_start._settings_files()
    (tmp_path / ".env").write_text("PREFECT_API_URL=http://127.0.0.1:4200/api\n")
    assert fast_start._settings_files()
    (tmp_path / ".env").unlink()
    (tmp_path / "pyproject.toml").write_text("[tool.prefect]\napi.url = 'http://127.0.0.1:4200/api'\n")
    assert fast_start._settings_files()
    (tmp_path / "pyproject.toml").unlink()
    (tmp_path / "prefect.toml").write_text("")
    assert fast_start._settings_files()


def test_sequential_start_starts_nothing_early():
    plan = SimpleNamespace(options=RuntimeOptions(parallel_start=False))  # nothing but the switch is looked at
    warm = fast_start.prestart(plan, user_prefect=False)
    assert warm.prefect is None and warm.run_id is None
    warm.ready()
    warm.close()


def test_timeline_marks_are_appended_only_when_asked(tmp_path, monkeypatch):
    log = tmp_path / "timeline.tsv"
    monkeypatch.setattr(startup, "_state", {"path": None, "configured": False, "early": []})
    startup.mark("early")  # before the flags are parsed: kept until the process names its timeline (or none)
    startup.configure(None)
    startup.mark("nothing")
    assert not log.exists() and startup._state["early"] == []
    monkeypatch.setattr(startup, "_state", {"path": None, "configured": False, "early": []})
    startup.mark("interpreter")
    startup.configure(log)
    startup.mark("a")
    startup.mark("b")
    marks = startup.read(log)
    assert [m[0] for m in marks] == ["interpreter", "a", "b"] and marks[0][1] <= marks[1][1] <= marks[2][1]
    assert marks[0][2] == os.getpid()


def _processes_mentioning(text: str) -> list[int]:
    """Live processes whose environment contains ``text`` (Linux)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as handle:
                if text.encode() in handle.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="needs /proc")
def test_startup_benchmark_quick_runs_both_start_ups_and_leaves_nothing_running():
    """Zero-config (no PREFECT_*/RAY_ADDRESS): the embedded server on loopback and a local Ray, once
    sequential (before) and once overlapped (after), and once reusing what ``certeval up`` started (reused);
    every phase is in the timeline, in order, and every process the commands (and up) started is gone
    afterwards."""
    quick = ROOT / "benchmarks" / "results" / "_quick" / "startup.json"
    started = quick.stat().st_mtime if quick.exists() else 0.0
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_ADDRESS"))}
    marker = f"startup-{uuid.uuid4().hex}"
    env["CERTEVAL_TEST_MARKER"] = marker  # inherited by every process the commands start (Ray, Prefect, actors)
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "startup", "--quick"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert quick.stat().st_mtime > started
    doc = json.loads(quick.read_text())
    assert doc["meta"]["quick"] is True and doc["meta"]["machine"]["load_avg_at_start"] is not None
    assert {r["mode"] for r in doc["runs"]} == {"before", "after", "reused"}
    for run in doc["runs"]:
        assert run["exit_code"] in (0, 1) and run["first_call_s"] > 0 and run["load_avg_before"]
        marks = run["marks"]
        assert marks["cli_parsed"] <= marks["plan_ready"] <= marks["flow_started"] <= marks["first_call"]
        if run["mode"] == "after":  # launched right after the checks; the flow starts once the server answers
            assert marks["plan_ready"] <= marks["prefect_launched"] <= marks["ray_ready"] <= marks["first_call"]
            assert marks["prefect_launched"] <= marks["prefect_ready"] <= marks["flow_started"]
        elif run["mode"] == "reused":  # nothing launched: Ray and Prefect were up before the command
            assert "prefect_launched" not in marks and marks["plan_ready"] <= marks["ray_ready"] <= marks["first_call"]
        else:  # sequential: Ray only inside the flow's start-models task
            assert "prefect_launched" not in marks and marks["flow_started"] <= marks["ray_ready"]
        assert set(run["phases"]) == set(doc["summary"][run["mode"]]["phases_median"])
    for mode in ("before", "after", "reused"):
        assert doc["summary"][mode]["first_call_s_median"] > 0
    assert "first_call_speedup" in doc["summary"]
    deadline = time.monotonic() + 120  # the watchdog's poll + grace, Ray's and the server's own shutdown (a loaded box)
    while _processes_mentioning(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    left = _processes_mentioning(marker)
    details = []
    for pid in left:
        try:
            details.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:160].decode())
        except OSError:
            pass
    assert not left, f"processes left running: {details}"


def test_a_port_answered_in_another_protocol_is_waited_out_not_a_crash():
    """Another program on the server's port answering non-HTTP bytes (a Ray gRPC port that took it first) is
    'not ready yet', as a refused connection is: the wait ends in its own one-line error, not BadStatusLine."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer_garbage() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"\x00\x00\x12\x04\x00\x00\x00\x00\x00\xfe\xff\n")

    threading.Thread(target=answer_garbage, daemon=True).start()
    server = fast_start.EmbeddedPrefect()
    server.port = listener.getsockname()[1]
    server.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        with pytest.raises(RuntimeError, match="did not answer within 0.5 s"):
            server.wait_ready(timeout_s=0.5)
    finally:
        server.proc.kill()
        server.proc.wait()
        listener.close()
