"""The checkpoint selection run the way a team runs it: ``prefect server start`` on 127.0.0.1, a process work
pool and worker, the ``nightly-checkpoints`` deployment of ``deployments/prefect.yaml`` deployed with a cron
of every minute, checkpoints and results on an S3 server (moto on 127.0.0.1).

The cron fires on its own: the first tick's flow run is killed mid-flow together with its worker; a new
worker is started and the orphaned run is put back in the queue (Prefect's retry); it resumes the same run
folder (its run id is the tick's scheduled time) and selects among two checkpoints. A third (better)
checkpoint is then put in the bucket and a later tick picks it. The score cache in the bucket and the
deployment's concurrency limit (one tick at a time: on a loaded machine a tick outlasts the minute) mean no
tick and no retry asks a model for an item already scored (backend call log). Every process started here is
stopped at the end, by pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from test_pipeline_support import MIDDLE, STRONG, WEAK, ray_address, read_log, replay, small_scores

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PREFECT = str(Path(sys.executable).with_name("prefect"))
BUCKET = "certeval-cron"


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Kill a process we started and everything below it (its own session group)."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=10)


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a process and every descendant (the worker and the flow-run process it started)."""
    import psutil

    try:
        tree = [psutil.Process(proc.pid)] + psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    for p in tree:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(tree, timeout=10)
    proc.wait(timeout=10)


def _api(url: str, path: str, body: dict | None = None, method: str | None = None, attempts: int = 8):
    """One call to the server's REST API. A busy SQLite server answers 503 ("database is locked") or 429, which
    Prefect's own client retries: so do we, a bounded number of times (every call made here is idempotent), and so
    for a read that times out on a loaded machine."""
    for attempt in range(attempts):
        req = urllib.request.Request(f"{url}{path}", data=None if body is None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"},
                                     method=method or ("GET" if body is None else "POST"))
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            if exc.code not in (429, 503) or attempt == attempts - 1:
                raise
        except TimeoutError:
            if attempt == attempts - 1:
                raise
        time.sleep(min(4.0, 0.5 * 2 ** attempt))


@pytest.fixture
def moto(tmp_path):
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


def test_cron_deployment_on_a_prefect_server_survives_a_killed_worker_and_picks_up_a_new_checkpoint(moto, tmp_path, state_dir):
    import s3fs
    import sqlalchemy

    # the server's scheduler inserts no run at all under SQLAlchemy 2.1 (pinned < 2.1 in pyproject/requirements.lock)
    assert tuple(int(x) for x in sqlalchemy.__version__.split(".")[:2]) < (2, 1), \
        f"SQLAlchemy {sqlalchemy.__version__}: Prefect 3.7.7's scheduler cannot insert scheduled runs; install requirements.lock"

    ray_addr = ray_address(state_dir)  # the session's local Ray; the flow runs connect to it
    api_port = _free_port()
    api = f"http://127.0.0.1:{api_port}/api"
    log = tmp_path / "calls.log"
    env = dict(os.environ)
    env.update({
        "PYTHONPATH": f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}", "CERTEVAL_HOME": str(ROOT),
        "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_UI_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "5",
        "PREFECT_WORKER_QUERY_SECONDS": "2", "PREFECT_WORKER_PREFETCH_SECONDS": "5",
        # a tick queued behind the running one (the deployment's concurrency limit) asks again this often
        "PREFECT_SERVER_DEPLOYMENTS_CONCURRENCY_SLOT_WAIT_SECONDS": "3",
        "AWS_ENDPOINT_URL": moto, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true", "AWS_DEFAULT_REGION": "us-east-1",
    })
    env.pop("PREFECT_PROFILE", None)
    for key in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        os.environ[key] = env[key]  # this process reads the bucket too
    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    fs.mkdir(BUCKET)
    scores = small_scores(tmp_path, n_items=200)  # the replay scores file the checkpoints point at
    # latency: the first tick lasts long enough to be killed mid-flow
    fs.pipe_file(f"{BUCKET}/checkpoints/step-1000.spec", replay(WEAK, scores, latency=0.02).encode())
    fs.pipe_file(f"{BUCKET}/checkpoints/step-2000.spec", replay(MIDDLE, scores, latency=0.02).encode())

    started: list[subprocess.Popen] = []

    def spawn(*argv: str, name: str) -> subprocess.Popen:
        out = open(tmp_path / f"{name}.log", "w")
        proc = subprocess.Popen(list(argv), env=env, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        started.append(proc)
        return proc

    def tail(name: str) -> str:
        return (tmp_path / f"{name}.log").read_text()[-3000:]

    def runs_now() -> str:  # what the server holds, for a failure message
        try:
            runs = _api(api, "/flow_runs/filter", {})
        except OSError as exc:
            return f"(server unreachable: {exc})"
        return "\n".join(f"{r['name']} {r['state_type']} {r['expected_start_time']} pool={r.get('work_pool_name')} "
                         f"deployment={r.get('deployment_id')}" for r in runs if r["state_type"] != "SCHEDULED")

    try:
        server = spawn(PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(api_port), name="server")
        deadline = time.time() + 120
        while True:
            assert server.poll() is None, tail("server")
            try:
                _api(api, "/health")
                break
            except OSError:
                assert time.time() < deadline, "the Prefect server never answered:\n" + tail("server")
                time.sleep(0.5)
        subprocess.run([PREFECT, "work-pool", "create", "certeval", "--type", "process"], env=env, cwd=ROOT,
                       check=True, capture_output=True, timeout=120)
        params = {"checkpoints": f"s3://{BUCKET}/checkpoints/",
                  "request": {"bank": None, "output": f"s3://{BUCKET}/runs", "threshold": 0.3, "halfwidth": 0.05,
                              "batch_size": 50, "seed": 1, "ray_address": ray_addr,
                              "options": {"call_log": str(log)}}}  # the request's RuntimeOptions, as a deployment gives them
        deploy = subprocess.run(
            [PREFECT, "--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--name",
             "nightly-checkpoints", "--cron", "* * * * *", "--timezone", "UTC", "--params", json.dumps(params)],
            env=env, cwd=ROOT, capture_output=True, text=True, timeout=180)
        assert deploy.returncode == 0, deploy.stdout[-3000:] + deploy.stderr[-3000:]
        dep = _api(api, "/deployments/name/select-checkpoints/nightly-checkpoints")
        crons = {s["schedule"].get("cron"): s["id"] for s in dep["schedules"]}
        assert "* * * * *" in crons, dep["schedules"]
        # one tick at a time: on a slow machine a tick outlasts the minute, and overlapping ticks would each
        # score the items the other has not cached yet
        assert (dep["global_concurrency_limit"] or {}).get("limit") == 1, dep
        assert dep["concurrency_options"]["collision_strategy"] == "ENQUEUE", dep
        for cron, schedule_id in crons.items():  # the yaml's nightly cron stays, paused: only our ticks fire
            if cron != "* * * * *":
                _api(api, f"/deployments/{dep['id']}/schedules/{schedule_id}", {"active": False}, method="PATCH")
        worker = spawn(PREFECT, "worker", "start", "--pool", "certeval", "--type", "process", name="worker")

        def best_reports() -> list[dict]:
            fs.invalidate_cache()
            return [json.loads(fs.cat_file(p)) for p in sorted(fs.glob(f"{BUCKET}/runs/checkpoints-*/best.json"))]

        # the first tick's flow run starts scoring: kill the worker and its flow-run process mid-flow
        deadline = time.time() + 300
        while not (log.exists() and log.stat().st_size > 0):
            assert time.time() < deadline, "no tick started scoring:\n" + tail("worker") + runs_now()
            time.sleep(0.1)
        running = _api(api, "/flow_runs/filter", {"flow_runs": {"state": {"type": {"any_": ["RUNNING"]}}}})
        # the tick (a deployment run) and its select subflow (no deployment) both run; one tick at a time
        ticks = [r for r in running if r.get("deployment_id") == dep["id"]]
        assert len(ticks) == 1, runs_now()
        killed = ticks[0]
        _kill_tree(worker)
        scored_before = len(read_log(log))
        assert not best_reports()  # killed mid-flow: nothing final written yet

        # the next worker start; the orphaned run is put back in the queue (what `Retry` in the UI does)
        spawn(PREFECT, "worker", "start", "--pool", "certeval", "--type", "process", name="worker2")
        for run in running:
            _api(api, f"/flow_runs/{run['id']}/set_state",
                 {"state": {"type": "SCHEDULED", "name": "AwaitingRetry"}, "force": True})
        deadline = time.time() + 300
        while _api(api, f"/flow_runs/{killed['id']}")["state_type"] != "COMPLETED":
            assert time.time() < deadline, "the retried run never completed:\n" + tail("worker2") + runs_now()
            time.sleep(2)
        stamp = killed["expected_start_time"][:19].replace("-", "").replace(":", "").replace("T", "-")
        reports = best_reports()
        first = next((r for r in reports if r["run_id"] == f"checkpoints-{stamp}"), None)
        assert first is not None, (f"no best.json for the retried run checkpoints-{stamp}; reports: "
                                   f"{[r['run_id'] for r in reports]}\n{runs_now()}\n{tail('worker2')}")
        assert first["best"] == MIDDLE and len(first["checkpoints"]) == 2
        resumed = json.loads(fs.cat_file(f"{first['run_folder'].replace('s3://', '')}/results.json"))
        assert resumed["pipeline"]["resumed"]  # the same run folder, picked up where the killed one stopped

        fs.pipe_file(f"{BUCKET}/checkpoints/step-3000.spec", replay(STRONG, scores).encode())  # a new checkpoint
        deadline = time.time() + 300
        while not any(len(r["checkpoints"]) == 3 for r in best_reports()):
            assert time.time() < deadline, "no tick picked up the new checkpoint:\n" + tail("worker2") + runs_now()
            time.sleep(2)
        second = next(r for r in best_reports() if len(r["checkpoints"]) == 3)

        def completed() -> list[dict]:
            return _api(api, "/flow_runs/filter", {"deployments": {"id": {"any_": [dep["id"]]}},
                                                   "flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}})

        # best.json is written inside the tick's flow, before Prefect marks the run COMPLETED: on a loaded machine
        # the second tick can still be RUNNING here (seen once)
        deadline = time.time() + 120
        while len(runs := completed()) < 2:
            assert time.time() < deadline, "the second tick never completed:\n" + tail("worker2") + runs_now()
            time.sleep(2)
    finally:
        for proc in reversed(started):
            _stop(proc)

    assert second["best"] == STRONG and len(second["checkpoints"]) == 3
    assert second["run_id"] != first["run_id"]
    for report in (first, second):  # results and report written to the bucket
        folder = report["run_folder"].replace("s3://", "")
        assert fs.exists(f"{folder}/results.json") and fs.exists(f"{folder}/report.md")
    assert len(runs) >= 2 and all(r["auto_scheduled"] for r in runs)  # started by the cron, not by hand
    calls = Counter(read_log(log))
    # no item scored twice: not by the retried run (the killed run's cached scores), not by later ticks
    assert 0 < scored_before < len(calls) and max(calls.values()) == 1
    assert {m for m, _ in calls} == {WEAK, MIDDLE, STRONG}
