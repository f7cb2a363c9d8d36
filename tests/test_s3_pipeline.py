"""Run folders on S3: moto's S3 server on 127.0.0.1, a flow with --output s3://..., read back, resume.

The server is a real HTTP S3 endpoint (moto's ThreadedMotoServer); s3fs reaches it
through the standard AWS environment (``AWS_ENDPOINT_URL``, dummy keys, no EC2
metadata probe). The model actors write the score cache to the same bucket.
"""

from __future__ import annotations

import json
import socket

import pytest

from certeval.cli import main
from certeval.requests import Rank
from certeval.runs.plan import make_plan

from test_pipeline_support import MIDDLE, WEAK, replay

pytestmark = pytest.mark.slow


class SimulatedCrash(RuntimeError):
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_env(s3_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    import s3fs

    fs = s3fs.S3FileSystem(skip_instance_cache=True)
    if not fs.exists("certeval-test"):
        fs.mkdir("certeval-test")
    return fs


def test_flow_writes_to_s3_reads_back_and_resumes(infra, s3_env, tmp_path, monkeypatch):
    from certeval.flows.pipeline import run_plan
    from certeval.runs.run import Run

    fs = s3_env
    common = dict(models=[replay(MIDDLE), replay(WEAK)], batch_size=20, seed=11, max_items=200)
    # reference: the same run, uninterrupted, on a local folder
    ref_plan, _ = make_plan(Rank(output=str(tmp_path / "local"), run_id="ref", **common))
    ref = run_plan(ref_plan)
    assert ref["rounds"] > 3  # long enough to crash in the middle

    plan, _ = make_plan(Rank(output="s3://certeval-test/runs", run_id="s3run", **common))
    real_store_round = Run.store_round
    calls = {"n": 0}

    def crash_after_two(self, batch):  # the process "dies" once two rounds are committed
        if calls["n"] == 2:
            raise SimulatedCrash("the process died here")
        calls["n"] += 1
        return real_store_round(self, batch)

    monkeypatch.setattr(Run, "store_round", crash_after_two)
    with pytest.raises(SimulatedCrash):
        run_plan(plan)
    monkeypatch.setattr(Run, "store_round", real_store_round)
    assert fs.exists("certeval-test/runs/s3run/config.json")
    assert not fs.exists("certeval-test/runs/s3run/results.json")
    assert len(fs.ls("certeval-test/runs/s3run/rounds")) == 2

    plan, _ = make_plan(Rank(output="s3://certeval-test/runs", run_id="s3run", **common))  # a new command
    res = run_plan(plan)  # the same command again: resumes from S3
    assert res["pipeline"]["resumed"]
    stored = json.loads(fs.cat_file("certeval-test/runs/s3run/results.json"))
    assert stored["ranking"]["tie_groups"] == ref["ranking"]["tie_groups"]
    for mine, theirs in zip(stored["models"], ref["models"]):
        assert (mine["model"], mine["n_scored"]) == (theirs["model"], theirs["n_scored"])
        assert mine["mean"] == pytest.approx(theirs["mean"]) and mine["upper"] == pytest.approx(theirs["upper"])
    # the third round's scores were paid before the crash (cache on S3): the resumed run sent nothing for it
    sent = sum(res["pipeline"]["items_sent"].values())
    assert sent == sum(m["n_scored"] for m in ref["models"]) - 3 * 2 * 20
    assert fs.ls("certeval-test/runs/_cache")  # the score cache lives on S3 too


def test_unreachable_s3_endpoint_is_exit_2(monkeypatch, capsys):
    port = _free_port()  # nothing listens there
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    code = main(["certify", "--model", replay(MIDDLE), "--goal", "halfwidth:0.1",
                 "--output", "s3://certeval-test/runs", "--run-id", "x"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "unreachable" in err and len(err.splitlines()) == 1
