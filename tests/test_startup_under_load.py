"""Start-up on a busy machine (docs/robustness.md, "Start-up on a busy machine"): Ray's local node and Prefect's
embedded server are retried, a failed try leaves no process behind, every try failing is one line and exit 3,
model actors run at niceness 0, and a plain replay ``certify`` completes while three processes keep the CPUs
busy. No wall-clock speed is asserted (subprocess timeouts are hang guards only)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import psutil
import pytest

from certeval.runtime.start_retry import Retries, StartError, start_with_retries

ROOT = Path(__file__).resolve().parents[1]
REPLAY = "replay:bundled:helm_mmlu#openai_ada"


# -- the retry policy itself (no Ray, no load) ------------------------------------------------------------------

def test_a_start_failing_twice_then_succeeding_is_tried_three_times_with_the_waits_between():
    calls, cleanups, slept = [], [], []

    def start():
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("The current node timed out during startup.\nmore detail")
        return "up"

    out = start_with_retries(start, what="Ray's local node", hint="retry", cleanup=lambda: cleanups.append(1),
                             retries=Retries(3, (5.0, 15.0), sleep=slept.append))
    assert out == "up" and len(calls) == 3 and len(cleanups) == 2 and slept == [5.0, 15.0]


def test_every_try_failing_is_one_line_naming_what_to_try():
    cleanups, slept = [], []

    def start():
        raise Exception("The current node timed out during startup. This could happen because\nsecond line")

    with pytest.raises(StartError) as info:
        start_with_retries(start, what="Ray's local node", hint="retry, or run `certeval up` first",
                           cleanup=lambda: cleanups.append(1), retries=Retries(3, (1.0,), sleep=slept.append))
    text = str(info.value)
    assert "\n" not in text and "3 tries" in text and "timed out during startup" in text and "certeval up" in text
    assert len(cleanups) == 3 and slept == [1.0, 1.0]  # the last wait repeats; no pause after the last try


def test_an_error_outside_retry_on_is_cleaned_up_and_raised_at_once():
    cleanups = []

    def start():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        start_with_retries(start, what="x", hint="y", cleanup=lambda: cleanups.append(1),
                           retries=Retries(3, sleep=lambda s: pytest.fail("no pause")))
    assert cleanups == [1]
    cleanups.clear()

    def bad_argument():
        raise ValueError("object_store_memory is too large")

    with pytest.raises(ValueError):
        start_with_retries(bad_argument, what="x", hint="y", cleanup=lambda: cleanups.append(1),
                           retries=Retries(3, never_retry=(ValueError,), sleep=lambda s: pytest.fail("no pause")))
    assert cleanups == [1]


# -- Ray: a failed node start leaves nothing behind; actors at niceness 0 -----------------------------------------

def _ray_descendants() -> list[psutil.Process]:
    from certeval.hosting.ray_setup import _is_ray_process

    return [p for p in psutil.Process().children(recursive=True) if _is_ray_process(p)]


@pytest.fixture
def no_ray_here():
    from test_pipeline_support import shutdown_ray

    # a test file run earlier in this worker may have left the shared Ray up: these tests start Ray themselves
    shutdown_ray()
    before = {p.pid for p in _ray_descendants()}
    yield before
    shutdown_ray()


@pytest.mark.slow
def test_a_failed_local_node_start_is_ended_before_the_next_try_and_every_try_failing_is_a_start_error(
        no_ray_here, monkeypatch, tmp_path):
    """The raylet's registration check is made to fail at once (after Ray started the GCS and the raylet): each
    try's processes are gone before the next, and none is left after the last."""
    import ray._private.services as ray_services

    from certeval.hosting import ray_setup

    seen: list[set[int]] = []

    def failing_get_node(*args, **kwargs):
        seen.append({p.pid for p in _ray_descendants()} - no_ray_here)
        raise OSError("injected: the raylet did not register")

    monkeypatch.setattr(ray_services, "get_node", failing_get_node)
    monkeypatch.setattr(ray_setup, "START_TRIES", 2)
    monkeypatch.setattr(ray_setup, "START_WAITS_S", (0.0,))
    with pytest.raises(StartError) as info:
        ray_setup.init_ray(None, num_cpus=1, state_dir=tmp_path, prestart_workers=False)
    assert "\n" not in str(info.value) and "2 tries" in str(info.value) and "certeval up" in str(info.value)
    assert len(seen) == 2 and all(seen), "each try started the node's processes"
    assert not seen[0] & seen[1], "the first try's processes were still there during the second"
    assert "RAY_gcs_server_port_wait_time_s" not in os.environ  # raised only while the node starts
    left = [p for p in _ray_descendants() if p.pid not in no_ray_here]
    assert not left, [" ".join(p.cmdline())[:120] for p in left]


@pytest.mark.slow
def test_model_actors_run_at_niceness_0(no_ray_here, tmp_path):
    import ray

    from certeval.hosting.ray_setup import init_ray

    init_ray(None, num_cpus=1, state_dir=tmp_path, prestart_workers=False)

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    actor = Probe.remote()
    pid = ray.get(actor.pid.remote(), timeout=300)
    ps = subprocess.run(["ps", "-o", "ni=", "-p", str(pid)], capture_output=True, text=True, timeout=30)
    assert ps.stdout.strip() == "0", ps.stdout
    assert psutil.Process(pid).nice() == 0
    ray.kill(actor)


# -- through the CLI ----------------------------------------------------------------------------------------------

def _zero_config_env(tmp_path: Path) -> dict[str, str]:
    """No Prefect or Ray of the test session's: the command starts its own (embedded server, local Ray)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_ADDRESS"))}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["HOME"] = str(tmp_path / "home")
    (tmp_path / "home").mkdir(exist_ok=True)
    env["CERTEVAL_TEST_MARKER"] = f"under-load-{uuid.uuid4().hex}"  # inherited by every process the command starts
    return env


def _marked(marker: str) -> list[str]:
    """Command lines of live processes whose environment holds ``marker`` (Linux /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if marker.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                found.append(Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")[:160].decode())
        except OSError:
            continue
    return found


def _assert_nothing_left(marker: str, within_s: float = 120.0) -> None:
    deadline = time.monotonic() + within_s  # the watchdog's poll and grace, Ray's own shutdown on a loaded box
    while _marked(marker) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _marked(marker), _marked(marker)


@pytest.mark.slow
def test_ray_never_starting_is_exit_3_and_one_line(tmp_path):
    """Every local node start failing (injected): exit 3, one line naming what to try, no Ray process left."""
    script = textwrap.dedent(f"""
        import sys
        import ray._private.services as s
        def fail(*a, **k):
            raise OSError("injected: the raylet did not register")
        s.get_node = fail
        from certeval.hosting import ray_setup
        ray_setup.START_TRIES, ray_setup.START_WAITS_S = 2, (0.0,)
        from certeval.cli import main
        sys.exit(main(["certify", "--model", {REPLAY!r}, "--goal", "halfwidth:0.1", "--output", "out"]))
    """)
    env = _zero_config_env(tmp_path)
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("certeval:")]
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert len(lines) == 1 and "Ray's local node did not start in 2 tries" in lines[0], proc.stderr[-3000:]
    assert "certeval up" in lines[0]
    assert not list((tmp_path / "out").glob("*/results.json"))
    _assert_nothing_left(env["CERTEVAL_TEST_MARKER"])


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_replay_certify_completes_while_three_processes_keep_the_cpus_busy(tmp_path):
    hogs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"], stdin=subprocess.DEVNULL,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range(3)]
    try:
        time.sleep(2)  # the hogs are running before the command starts
        argv = [sys.executable, "-m", "certeval", "certify", "--model", REPLAY, "--goal", "halfwidth:0.1",
                "--output", str(tmp_path / "out"), "--run-id", "busy", "--json"]
        env = _zero_config_env(tmp_path)
        proc = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=1200)  # a hang guard only
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = tmp_path / "out" / "busy" / "results.json"
        assert results.exists()
        assert json.loads(results.read_text())["models"][0]["model"]
        _assert_nothing_left(env["CERTEVAL_TEST_MARKER"])
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(timeout=30)


# -- Prefect's embedded server: one restart on its port ------------------------------------------------------------

class _FlakyServer:
    """Stands in for fast_start.EmbeddedPrefect: its first ``fail`` waits time out."""

    def __init__(self, fail: int) -> None:
        self.fail, self.port, self.events = fail, 43210, []

    def launch(self, port=None):
        self.events.append(("launch", port))
        return self

    def wait_ready(self, timeout_s=None):
        self.events.append(("wait", self.port))
        if self.fail:
            self.fail -= 1
            raise RuntimeError("Prefect's embedded API server did not answer within 120 s")

    def stop(self):
        self.events.append(("stop", self.port))


def test_prefect_embedded_server_not_answering_is_stopped_and_started_again_on_its_port(monkeypatch):
    from certeval.services import fast_start

    monkeypatch.setattr(fast_start, "PREFECT_START_WAITS_S", (0.0,))
    warm = fast_start.Prestart()
    warm.prefect = server = _FlakyServer(fail=1)
    warm.ready()
    assert server.events == [("wait", 43210), ("stop", 43210), ("launch", 43210), ("wait", 43210)]


def test_prefect_embedded_server_failing_twice_is_one_line_naming_what_to_try(monkeypatch):
    from certeval.services import fast_start

    monkeypatch.setattr(fast_start, "PREFECT_START_WAITS_S", (0.0,))
    warm = fast_start.Prestart()
    warm.prefect = server = _FlakyServer(fail=5)
    with pytest.raises(StartError) as info:
        warm.ready()
    assert "\n" not in str(info.value) and "2 tries" in str(info.value) and "certeval up" in str(info.value)
    assert server.events[-1] == ("stop", 43210)  # nothing of the failed server is left running
