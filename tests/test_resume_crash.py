"""Crash and resume: SIGKILL the CLI mid-run, rerun it with the same run id.

The final results must equal an uninterrupted run with the same seed, and the
backend must never have been asked for the same (model, item) twice. Calls are
counted at the backend: every model actor appends ``model<TAB>item`` for each item
it scored to its ``--call-log``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import pandas as pd
import pytest
from test_network_loopback import connect_targets, is_loopback

from certeval.requests import Certify
from certeval.runs.plan import make_plan

from test_pipeline_support import MIDDLE, PYTHON, WEAK, cli_env, read_log, replay, small_scores

pytestmark = pytest.mark.slow


def _outside(line: str) -> bool:
    """A traced connect() to an address outside 127.0.0.0/8 and ::1 (parser shared with the loopback test)."""
    return any(not is_loopback(addr) for addr in connect_targets(line))


def _rounds(folder) -> pd.DataFrame:
    rows = pd.concat([pd.read_parquet(p) for p in sorted((folder / "rounds").glob("*.parquet"))])
    return rows.sort_values(["model", "round", "item_id"]).reset_index(drop=True)


def test_sigkill_mid_run_then_rerun_equals_uninterrupted(infra, tmp_path):
    from certeval.flows.pipeline import run_plan

    scores = small_scores(tmp_path, n_items=300)
    models = [replay(MIDDLE, scores, latency=0.004), replay(WEAK, scores, latency=0.004)]
    args = dict(goal="halfwidth:0.03", method="adaptive", batch_size=20, max_items=160, seed=7)
    # the uninterrupted reference, in-process, under another root (no shared score cache)
    ref_plan, _ = make_plan(Certify(models=models, output=str(tmp_path / "ref"), run_id="run", **args))
    ref = run_plan(ref_plan)
    assert ref["rounds"] >= 6

    log = tmp_path / "backend.log"
    out = tmp_path / "crash"
    argv = [PYTHON, "-m", "certeval", "certify", "--goal", args["goal"], "--method", args["method"],
            "--batch-size", "20", "--max-items", "160", "--seed", "7", "--output", str(out), "--run-id", "run",
            "--ray-address", infra, "--call-log", str(log), "--json"]
    for m in models:
        argv += ["--model", m]
    env = cli_env(tmp_path)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while time.time() < deadline and len(read_log(log)) < 90 and proc.poll() is None:
        time.sleep(0.01)
    assert proc.poll() is None, f"the run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = len(read_log(log))
    assert 0 < before < 2 * 160  # killed in the middle
    assert not (out / "run" / "results.json").exists()

    trace = tmp_path / "connect.trace"
    strace = shutil.which("strace")
    wrapped = [strace, "-f", "-qq", "-e", "trace=connect", "-o", str(trace)] + argv if strace else argv
    done = subprocess.run(wrapped, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode in (0, 1), done.stderr[-2000:]
    res = json.loads(done.stdout)
    assert res["pipeline"]["resumed"]

    if strace:  # the resumed CLI (Prefect client, Ray driver, S3-less storage) touched loopback only
        outside = [line for line in trace.read_text().splitlines() if "connect(" in line and _outside(line)]
        assert not outside, outside[:3]

    calls = read_log(log)
    assert len(calls) == len(set(calls)), "a (model, item) was sent to the backend twice"
    for mine, theirs in zip(res["models"], ref["models"]):
        assert mine["model"] == theirs["model"]
        for key in ("mean", "lower", "upper", "n_scored"):
            assert mine[key] == pytest.approx(theirs[key], abs=1e-12), key
        assert mine["decision"]["rule"] == theirs["decision"]["rule"]
    assert len(calls) == sum(m["n_scored"] for m in ref["models"])  # every scored item paid exactly once
    mine_rows, ref_rows = _rounds(out / "run"), _rounds(tmp_path / "ref" / "run")
    pd.testing.assert_frame_equal(mine_rows, ref_rows)


def test_connect_filter_flags_outside_addresses():
    line = 'connect(3, {sa_family=AF_INET, sin_port=htons(80), sin_addr=inet_addr("%s")}, 16) = 0'
    assert _outside(line % "10.0.0.1") and _outside(line % "169.254.169.254")
    assert not _outside(line % "127.0.0.1")
    v6 = 'connect(4, {sa_family=AF_INET6, sin6_port=htons(1), inet_pton(AF_INET6, "%s", &sin6_addr)}, 28)'
    assert not _outside(v6 % "::ffff:127.0.0.1") and not _outside(v6 % "::1") and _outside(v6 % "2001:db8::1")
