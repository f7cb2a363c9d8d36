"""Faults a trusted tool survives: a second writer, a frozen S3 server, an unreachable Ray, a SIGKILLed CLI,
secrets in the environment, temporaries left by killed writes.

Real parts throughout: moto's S3 server as a separate process on 127.0.0.1 (so
it can be frozen with SIGSTOP), the session's Ray and Prefect, the real CLI in
subprocesses where exit codes and left-over processes are the point.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from certeval.cli import main
from certeval.storage import RunStore, clean_temporaries

from test_pipeline_support import MIDDLE, PYTHON, WEAK, cli_env, failure_lines, needs_small_lm, replay, small_scores

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow  # real Ray, Prefect, moto_server and CLI subprocesses: about 5 minutes on 2 cores


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- one writer per run ---------------------------------------------------------------------------------------


def _hold_lock(output: str, run_id: str, env: dict | None = None) -> subprocess.Popen:
    """Another process holding the run's lock (as a running certeval would), until killed."""
    code = ("import sys, time; from certeval.storage import RunStore; "
            "RunStore(sys.argv[1], sys.argv[2]).acquire_lock(); print('held', flush=True); time.sleep(300)")
    proc = subprocess.Popen([PYTHON, "-c", code, output, run_id], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_of_the_same_run_is_refused_at_once(tmp_path, capsys):
    scores = small_scores(tmp_path, n_items=40)
    out = tmp_path / "runs"
    holder = _hold_lock(str(out), "busy")
    try:
        t0 = time.monotonic()
        code = main(["certify", "--model", replay(MIDDLE, scores), "--goal", "halfwidth:0.1", "--output", str(out),
                     "--run-id", "busy"])
        waited = time.monotonic() - t0
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1 and "being written" in err, err
        assert waited < 120  # refused, not waited out: the holder keeps the lock for 300 s (generous on a loaded box)
        assert not (out / "busy" / "config.json").exists()  # nothing written by the refused run
    finally:
        holder.kill()
        holder.wait()
    # the kernel drops a killed holder's lock: the run id is free again at once (a crash never blocks resume)
    store = RunStore(str(out), "busy")
    assert store.acquire_lock()
    store.release_lock()


def test_temporaries_of_killed_writes_are_cleaned_on_the_next_start(tmp_path):
    run = tmp_path / "runs" / "r"
    (run / "rounds").mkdir(parents=True)
    dead = run / "rounds" / f".00003.parquet.{'a' * 32}.tmp"
    dead.write_bytes(b"half")
    cache_parts = tmp_path / "runs" / "_cache" / "k" / "parts"
    cache_parts.mkdir(parents=True)
    old, young = cache_parts / f".p.parquet.{'b' * 32}.tmp", cache_parts / f".q.parquet.{'c' * 32}.tmp"
    old.write_bytes(b"x")
    young.write_bytes(b"y")  # may belong to a run writing right now
    os.utime(old, (time.time() - 3600, time.time() - 3600))
    keep = run / "rounds" / "00000.parquet"
    keep.write_bytes(b"data")
    store = RunStore(str(tmp_path / "runs"), "r")
    assert store.acquire_lock()
    store.release_lock()
    assert not dead.exists() and not old.exists()
    assert young.exists() and keep.exists()
    assert clean_temporaries(str(run), str(tmp_path / "runs")) == []


# -- S3: a lease object, and a server that stops answering ------------------------------------------------------


@pytest.fixture
def moto_process(monkeypatch):
    """moto's S3 server as its own process (SIGSTOP-able), with the AWS environment pointing at it."""
    port = _free_port()
    exe = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    env = dict(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
               AWS_EC2_METADATA_DISABLED="true", AWS_DEFAULT_REGION="us-east-1")
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    import s3fs

    s3fs.S3FileSystem(skip_instance_cache=True).mkdir("faults")
    yield proc, env
    proc.send_signal(signal.SIGCONT)
    proc.kill()
    proc.wait()


def test_s3_lease_refuses_a_second_writer_and_is_freed_on_release(moto_process):
    first = RunStore("s3://faults/runs", "r")
    assert first.acquire_lock()
    try:
        holder_env = dict(moto_process[1])
        code = ("import sys; from certeval.storage import RunStore\n"
                "try:\n    RunStore('s3://faults/runs', 'r').acquire_lock(); print('acquired')\n"
                "except Exception as e:\n    print(type(e).__name__, e)")
        out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                             env={**os.environ, "PYTHONPATH": str(ROOT), **holder_env}).stdout
        assert out.startswith("InputError") and "being written" in out, out
    finally:
        first.release_lock()
    again = RunStore("s3://faults/runs", "r")
    assert again.acquire_lock()  # released: the lease object is gone
    again.release_lock()


def test_a_frozen_s3_server_fails_the_run_in_bounded_time_with_exit_3(infra, moto_process, tmp_path):
    proc_s3, s3_env = moto_process
    scores = small_scores(tmp_path, n_items=150)
    argv = [PYTHON, "-m", "certeval", "rank", "--output", "s3://faults/runs", "--run-id", "frozen",
            "--batch-size", "10", "--ray-address", infra]
    for m in (MIDDLE, WEAK):
        argv += ["--model", replay(m, scores, latency=0.05)]  # ~1 s a round: the run outlives the freeze
    proc = subprocess.Popen(argv, env=cli_env(tmp_path, **s3_env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        fs.invalidate_cache()
        if fs.exists("faults/runs/frozen/state/_run.json"):  # a round is committed: the run is under way
            break
        time.sleep(0.5)
    assert proc.poll() is None, proc.communicate()
    proc_s3.send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=300)  # an unbounded storage call would hang here for ever
    finally:
        proc_s3.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.kill()
    waited = time.monotonic() - t0
    lines = failure_lines(err)  # progress lines (one per finished round) aside
    assert proc.returncode == 3, err
    assert len(lines) == 1 and "runtime failure" in lines[0], err
    # the bound is storage.CALL_TIMEOUT_S (30 s) per call; minutes leave room for a loaded 2-core machine
    assert waited < 240, f"took {waited:.0f} s"


# -- Ray ------------------------------------------------------------------------------------------------------


def test_an_unreachable_ray_address_fails_in_bounded_time(tmp_path):
    port = _free_port()  # closed
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.run([PYTHON, "-m", "certeval", "certify", "--model", replay(MIDDLE), "--goal", "halfwidth:0.1",
                           "--output", str(tmp_path / "runs"), "--ray-address", f"127.0.0.1:{port}"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert time.monotonic() - t0 < 240  # the probe's own bound is seconds; the rest is a loaded box's start-up
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1 and "ray-address" in lines[0], proc.stderr
    assert not (tmp_path / "runs").exists()


def test_init_ray_itself_bounds_an_unreachable_address():
    """The flow's own connect (not only the CLI's plan check) gives up in seconds, in one line."""
    from certeval.errors import InputError
    from certeval.runtime.envsetup import check_ray_address

    t0 = time.monotonic()
    with pytest.raises(InputError, match="did not answer"):
        check_ray_address(f"127.0.0.1:{_free_port()}")
    assert time.monotonic() - t0 < 60  # RAY_PROBE_S; a closed port answers at once, a hang would not


# -- secrets --------------------------------------------------------------------------------------------------


def test_secrets_reach_actors_but_no_file_under_ray_or_the_run_folder(infra, tmp_path, monkeypatch):
    import ray

    from certeval.flows.pipeline import run_plan
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan

    secret = "sEcReT-" + os.urandom(8).hex()
    api_key = "sk-" + os.urandom(8).hex()
    named_key = "alt-" + os.urandom(8).hex()  # read through api_key_env=OPENAI_KEY: not a secret-looking name
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("OPENAI_API_KEY", api_key)
    monkeypatch.setenv("OPENAI_KEY", named_key)
    scores = small_scores(tmp_path, n_items=60)
    plan, _ = make_plan(Certify(models=[replay(MIDDLE, scores)], goal="halfwidth:0.2", batch_size=30,
                                    output=str(tmp_path / "runs"), run_id="sec"))
    run_plan(plan)

    # the channel works: an actor of a pool sees the credentials in its own environment
    from certeval.hosting.pool import ModelPool
    from certeval.hosting.ray_setup import key_variables

    assert key_variables(["openai:http://127.0.0.1:9/v1#m?api_key_env=OPENAI_KEY", "openai:http://h/v1#n",
                          replay(MIDDLE, scores)]) == {"OPENAI_KEY", "OPENAI_API_KEY"}
    pool = ModelPool({"m": replay(MIDDLE, scores)})
    # the key variable an openai spec names (its endpoint is not needed to check how the key travels)
    pool.key_variables = key_variables(["openai:http://127.0.0.1:9/v1#m?api_key_env=OPENAI_KEY"])
    pool.start()
    try:
        handle = next(iter(pool.slots.values()))[0].handle
        seen = ray.get(handle.__ray_call__.remote(lambda self: (os.environ.get("AWS_SECRET_ACCESS_KEY"),
                                                                os.environ.get("OPENAI_API_KEY"),
                                                                os.environ.get("OPENAI_KEY"))))
        assert seen == (secret, api_key, named_key)
    finally:
        pool.shutdown()
    time.sleep(1.0)  # let Ray's agents flush their logs
    session = Path(ray._private.worker._global_node.get_session_dir_path())
    roots = [session, tmp_path / "runs"]
    hits = []
    for root in roots:
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                try:
                    data = path.read_bytes()
                except OSError:
                    continue
                if any(v.encode() in data for v in (secret, api_key, named_key)):
                    hits.append(str(path))
    assert sum(1 for root in roots for p in root.rglob("*") if p.is_file()) > 10  # the grep saw real folders
    assert hits == []


# -- no orphans -----------------------------------------------------------------------------------------------


def _descendants(pid: int) -> dict[int, str]:
    from certeval.runtime.watchdog import descendants

    out = {}
    for p in descendants(pid):
        try:
            out[p] = Path(f"/proc/{p}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]
        except OSError:
            pass
    return out


def test_sigkill_of_the_cli_leaves_no_ray_or_prefect_process_after_10_s(tmp_path):
    """The CLI starts its own Ray and Prefect's embedded server; SIGKILL it mid-run; all of them end."""
    scores = small_scores(tmp_path, n_items=150)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "RAY_ADDRESS"))}
    env.update(PYTHONPATH=str(ROOT), PREFECT_HOME=str(tmp_path / "prefect"), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120")
    argv = [PYTHON, "-m", "certeval", "rank", "--output", str(tmp_path / "runs"), "--run-id", "orphans",
            "--batch-size", "10", "--num-cpus", "1"]
    for m in (MIDDLE, WEAK):
        argv += ["--model", replay(m, scores, latency=0.2)]  # slow: still running when killed
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
    seen: dict[int, str] = {}
    deadline = time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            seen.update(_descendants(proc.pid))
            if (tmp_path / "runs" / "orphans" / "rounds").exists():  # a round stored: Ray and Prefect are up
                break
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it could be killed"
        seen.update(_descendants(proc.pid))
        seen = {p: c for p, c in seen.items() if "certeval.runtime.watchdog" not in c}
        assert any("raylet" in c for c in seen.values()), seen
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        alive = dict(seen)
        while alive and time.monotonic() - t0 < 90:  # the watchdog polls each second; room for a loaded box
            time.sleep(0.5)
            alive = {p: c for p, c in alive.items() if Path(f"/proc/{p}").exists()
                     and Path(f"/proc/{p}/stat").read_text().split(") ")[-1][:1] != "Z"}
        assert alive == {}, f"still running 90 s after SIGKILL: {alive}"
    finally:
        if proc.poll() is None:
            proc.kill()
        for p in list(seen):
            try:
                os.kill(p, signal.SIGKILL)
            except OSError:
                pass


def test_a_damaged_cache_part_is_skipped_so_its_items_are_scored_again(tmp_path):
    import pandas as pd

    from certeval.storage import ScoreCache, filesystem

    cache = ScoreCache(*filesystem(str(tmp_path / "_cache" / "k")))
    row = dict(item_id="a", score=1.0, tokens=0, latency_s=0.0)
    cache.add([{**row, "item_key": "a"}])
    cache.add([{**row, "item_id": "b", "item_key": "b", "score": 0.0}])
    parts = sorted((tmp_path / "_cache" / "_shared" / "parts").glob("*.parquet"))  # one part per batch
    damaged = next(p for p in parts if pd.read_parquet(p)["item_key"].iloc[0] == "b")
    damaged.write_bytes(damaged.read_bytes()[:30])
    assert cache.load() == {"a": 1.0}  # 'b' is no longer cached: the run asks the model again
    assert cache.skipped == [f"_shared/parts/{damaged.name}"]
    own = tmp_path / "_cache" / "k" / "parts"  # a part of the older per-model layout, damaged the same way
    own.mkdir(parents=True)
    (own / "old.parquet").write_bytes(damaged.read_bytes())
    assert cache.load() == {"a": 1.0} and cache.skipped == ["old.parquet", f"_shared/parts/{damaged.name}"]


def test_a_storage_failure_mid_run_is_exit_3_with_the_traceback_in_the_run_folder(infra, tmp_path):
    """A real storage fault: the run's rounds/ folder cannot be created (a file took its name). One line,
    exit 3, the traceback in <run>/logs/; with the obstacle gone the same run id resumes and finishes."""
    import json

    import pandas as pd

    scores = small_scores(tmp_path, n_items=60)
    run = tmp_path / "runs" / "fault"
    argv = [PYTHON, "-m", "certeval", "certify", "--goal", "halfwidth:0.2", "--method", "uniform", "--batch-size",
            "20", "--output", str(tmp_path / "runs"), "--run-id", "fault", "--ray-address", infra, "--json"]
    for m in (MIDDLE, WEAK):
        argv += ["--model", replay(m, scores)]
    proc = subprocess.Popen(argv, env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "config.json").exists() and proc.poll() is None:
        time.sleep(0.05)
    (run / "rounds").write_text("in the way")
    _, err = proc.communicate(timeout=300)
    lines = failure_lines(err)  # progress lines (one per finished round) aside
    assert proc.returncode == 3, err
    assert len(lines) == 1 and lines[0].startswith("certeval: runtime failure:") and "logs/failure-" in lines[0], err
    logs = list((run / "logs").glob("failure-*.log"))
    assert len(logs) == 1 and "Traceback" in logs[0].read_text()
    (run / "rounds").unlink()
    done = subprocess.run(argv, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(done.stdout)["pipeline"]["resumed"]
    rows = pd.concat(pd.read_parquet(p) for p in sorted((run / "rounds").glob("*.parquet")))
    assert not rows.duplicated(["model", "item_id"]).any()


def test_sigterm_stops_the_run_cleanly_and_the_folder_resumes(infra, tmp_path):
    import json

    import pandas as pd

    scores = small_scores(tmp_path, n_items=150)
    run = tmp_path / "runs" / "term"
    argv = [PYTHON, "-m", "certeval", "rank", "--batch-size", "10", "--output", str(tmp_path / "runs"),
            "--run-id", "term", "--ray-address", infra, "--json"]
    for m in (MIDDLE, WEAK):
        argv += ["--model", replay(m, scores, latency=0.05)]
    proc = subprocess.Popen(argv, env=cli_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    while time.time() < deadline and not (run / "state" / "_run.json").exists() and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    lines = failure_lines(err)  # progress lines (one per finished round) aside
    assert proc.returncode == 143 and len(lines) == 1 and "resumable" in lines[0], (proc.returncode, err)
    done = subprocess.run(argv, env=cli_env(tmp_path), capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(done.stdout)["pipeline"]["resumed"]
    rows = pd.concat(pd.read_parquet(p) for p in sorted((run / "rounds").glob("*.parquet")))
    assert not rows.duplicated(["model", "item_id"]).any()


def test_s3_lease_of_a_writer_that_died_on_this_host_is_taken_over_at_once(moto_process):
    """A SIGKILLed writer leaves its lease object behind (renewed, so not expired); a writer on the same host
    whose process is gone is dead for sure, so the next writer takes over without waiting for the lease."""
    holder_env = dict(moto_process[1])
    code = ("import os, signal; from certeval.storage import RunStore\n"
            "RunStore('s3://faults/runs', 'dead').acquire_lock(); print('held', flush=True)\n"
            "os.kill(os.getpid(), signal.SIGKILL)")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT), **holder_env}).stdout
    assert out.strip() == "held"
    store = RunStore("s3://faults/runs", "dead")
    assert store.folder.exists("run.lock")  # the dead writer's lease is still there, not expired
    t0 = time.monotonic()
    assert store.acquire_lock()
    assert time.monotonic() - t0 < 50  # taken over, not waited out (the lease runs 60 s)
    store.release_lock()


def test_sigterm_while_the_model_actors_start_ends_the_run_and_leaves_it_resumable(infra, tmp_path):
    """SIGTERM while a real model's actor is loading (SmolLM2 on CPU takes seconds to build): the command ends
    with 143 and one line, without waiting for the actor, and the same command then resumes and finishes."""
    import json

    needs_small_lm()
    timeline = tmp_path / "timeline.log"
    argv = [PYTHON, "-m", "certeval", "certify", "--model", "hf:bundled:smollm2", "--bank",
            "bundled:trivia?categories=uscapitals", "--goal", "halfwidth:0.1", "--max-items", "4", "--batch-size", "4",
            "--output", str(tmp_path / "runs"), "--run-id", "starting", "--ray-address", infra, "--json"]
    # the resume below runs without --startup-log: a runtime flag is not part of the run's identity
    proc = subprocess.Popen(argv + ["--startup-log", str(timeline)], env=cli_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)

    def phases() -> list[str]:
        return [line.split("\t")[0] for line in timeline.read_text().splitlines()] if timeline.exists() else []

    deadline = time.time() + 240
    while time.time() < deadline and "models_starting" not in phases() and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None and "actors_ready" not in phases(), phases()
    proc.send_signal(signal.SIGTERM)
    t0 = time.monotonic()
    _, err = proc.communicate(timeout=120)
    ended_s = time.monotonic() - t0
    assert "actors_ready" not in phases(), "the actor had finished loading: SIGTERM did not land during its start"
    lines = failure_lines(err)
    assert proc.returncode == 143 and len(lines) == 1 and "resumable" in lines[0], (proc.returncode, err)
    assert ended_s < 60, f"took {ended_s:.1f} s"  # generous on a loaded box; about 2 s on an idle one
    done = subprocess.run(argv, env=cli_env(tmp_path), capture_output=True, text=True, timeout=600)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    res = json.loads(done.stdout)
    assert res["pipeline"]["resumed"] and res["models"][0]["n_scored"] == 4
