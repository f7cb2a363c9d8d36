"""The scheduled checkpoint selection, exercised once: a served flow (cron schedule, no work pool)
and a deployment run against the shared Prefect server, over a folder of three checkpoints."""

from __future__ import annotations

import json
import subprocess
import time

import pytest
import yaml

from test_pipeline_support import MIDDLE, PYTHON, STRONG, WEAK, cli_env, replay, small_scores

pytestmark = pytest.mark.slow

SERVE = """
import sys
from certeval.flows.checkpoints import select_checkpoints_flow
select_checkpoints_flow.serve(name="nightly-checkpoints", cron="0 3 * * *", parameters={
    "checkpoints": sys.argv[1], "request": {"output": sys.argv[2], "ray_address": sys.argv[3],
                                            "threshold": 0.3, "halfwidth": 0.05, "batch_size": 50, "seed": 1}})
"""


def test_prefect_yaml_declares_the_scheduled_selection_and_ranking():
    from pathlib import Path

    spec = yaml.safe_load((Path(__file__).resolve().parents[1] / "deployments" / "prefect.yaml").read_text())
    by_name = {d["name"]: d for d in spec["deployments"]}
    sel = by_name["nightly-checkpoints"]
    assert sel["entrypoint"] == "certeval/flows/checkpoints.py:select_checkpoints_flow"
    assert sel["schedules"][0]["cron"]
    assert by_name["weekly-ranking"]["entrypoint"].endswith(":rank_models_flow")
    for dep in spec["deployments"]:  # a tick never runs beside the previous one of its deployment
        assert dep["concurrency_limit"] == {"limit": 1, "collision_strategy": "ENQUEUE"}, dep["name"]


def test_served_checkpoint_selection_picks_the_best(infra, tmp_path):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    scores = small_scores(tmp_path, n_items=300)
    ckpt = tmp_path / "checkpoints"
    ckpt.mkdir()
    for step, model in (("step-1000", WEAK), ("step-2000", MIDDLE), ("step-3000", STRONG)):
        (ckpt / f"{step}.spec").write_text(replay(model, scores) + "\n")
    out = tmp_path / "runs"
    env = cli_env(tmp_path, PREFECT_RUNNER_POLL_FREQUENCY="1")
    server = subprocess.Popen([PYTHON, "-c", SERVE, str(ckpt), str(out), infra], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        async def deployment():
            async with get_client() as client:
                return await client.read_deployment_by_name("select-checkpoints/nightly-checkpoints")

        import asyncio

        dep, deadline = None, time.time() + 120
        while dep is None and time.time() < deadline:
            assert server.poll() is None, server.stderr.read().decode()[-3000:]
            try:
                dep = asyncio.run(deployment())
            except Exception:  # not registered yet
                time.sleep(0.5)
        assert dep is not None, "the served deployment never registered"
        assert any(getattr(s.schedule, "cron", None) == "0 3 * * *" for s in dep.schedules)
        run = run_deployment("select-checkpoints/nightly-checkpoints", timeout=240)
        assert run.state.is_completed(), run.state
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
    reports = list(out.glob("checkpoints-*/best.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    assert report["best"] == STRONG and report["best_spec"].endswith(f"#{STRONG}")
    assert WEAK in report["discarded"]
    assert report["best_estimate"]["n_scored"] < 300  # decided before the whole bank was scored
    results = json.loads((reports[0].parent / "results.json").read_text())
    assert results["selection"]["selected"][0] == STRONG


@pytest.mark.parametrize("flow_name", ["select_checkpoints_flow", "certify_checkpoints_flow", "rank_models_flow"])
def test_deployment_flows_pass_cpus_and_gpus_to_the_plan(flow_name, monkeypatch, tmp_path):
    """``num_cpus`` / ``num_gpus`` reach the run's plan from a deployment's parameters, as from the CLI's flags
    (the plan is stopped there: what it does with them is tested with the CLI)."""
    import certeval.flows.checkpoints as flows

    seen = {}

    class Planned(Exception):
        pass

    def capture(request):
        seen["request"] = request
        raise Planned

    monkeypatch.setattr(flows, "make_plan", capture)
    monkeypatch.setattr(flows, "find_checkpoints", lambda folder: [replay(MIDDLE), replay(WEAK)])
    request = {"num_cpus": 2, "num_gpus": 0.5}  # as a deployment gives it: a mapping of the request's fields
    kwargs = {"request": request}
    if flow_name == "rank_models_flow":
        request["models"] = [replay(MIDDLE), replay(WEAK)]
    else:
        kwargs["checkpoints"] = str(tmp_path)
        if flow_name == "certify_checkpoints_flow":
            request["output"] = str(tmp_path / "runs")
    with pytest.raises(Planned):
        getattr(flows, flow_name).fn(**kwargs)
    assert (seen["request"].num_cpus, seen["request"].num_gpus) == (2, 0.5)
