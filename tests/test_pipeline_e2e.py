"""End to end: real Prefect flows driving real Ray model actors, on recorded HELM MMLU scores.

One shared Prefect server and Ray (``test_pipeline_support``). Each test checks what
the run wrote (results.json, rounds, states, cache) and the statistics' verdicts on
models whose true bank accuracies are known (0.59 / 0.41 / 0.24).
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from certeval.cli import main
from certeval.inputs.banks import load_scores
from certeval.requests import Certify, request_for
from certeval.runs.plan import make_plan

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK, needs_small_lm, read_log, replay

pytestmark = pytest.mark.slow


def _truth(model: str) -> float:
    frame = load_scores(SCORES)
    return float(frame[frame["model"] == model]["score"].mean())


def _run(kind, tmp_path, **kw):
    from certeval.flows.pipeline import run_plan

    kw.setdefault("output", str(tmp_path / "runs"))
    plan, _ = make_plan(request_for(kind, **kw))
    return plan, run_plan(plan)


def test_certify_flow_stores_everything_and_reuses_paid_scores(infra, tmp_path):
    plan, res = _run("certify", tmp_path, models=[replay(MIDDLE)], goal="halfwidth:0.12", method="uniform",
                     batch_size=60, seed=3, run_id="cert-a")
    m = res["models"][0]
    assert m["lower"] <= _truth(MIDDLE) <= m["upper"]  # the bank mean is inside the certified interval
    assert res["reached"] and m["halfwidth"] <= 0.12 and m["n_scored"] < m["n_total"]
    assert res["pipeline"]["items_sent"][MIDDLE] == m["n_scored"]  # fresh run: every score paid once
    assert res["pipeline"]["resumed"] is False
    block = res["results"]["helm_mmlu"]
    # recorded scores replayed: the metric's name is "score" (lm-eval's names for the scorers that are lm-eval's)
    assert {"score,none", "score_stderr,none", "score_ci_lower,none", "score_ci_upper,none", "items_scored,none"} <= set(block)
    assert all(isinstance(v, (int, float)) for k, v in block.items() if k != "alias")  # numbers only (lm-eval)
    assert block["score,none"] == pytest.approx(m["mean"]) and block["items_scored,none"] == m["n_scored"]
    folder = tmp_path / "runs" / "cert-a"
    stored = json.loads((folder / "results.json").read_text())
    assert stored["models"][0]["mean"] == pytest.approx(m["mean"])
    assert json.loads((folder / "config.json").read_text())["models"] == [replay(MIDDLE)]
    rounds = sorted((folder / "rounds").glob("*.parquet"))
    assert len(rounds) == res["rounds"]
    import pandas as pd

    rows = pd.concat([pd.read_parquet(p) for p in rounds])
    assert list(rows.columns) == ["model", "item_id", "score", "output", "prompt_hash", "round", "prob",
                                  "look_n_scored", "look_mean", "look_lower", "look_upper", "look_rule"]
    assert rows["output"].isna().all() and rows["prompt_hash"].isna().all()  # replay: no output, no prompt
    last = rows[rows["round"] == rows["round"].max()].iloc[0]  # the look log's last look is the result
    assert (last["look_n_scored"], last["look_lower"], last["look_upper"]) == (m["n_scored"], m["lower"], m["upper"])
    assert len(rows) == m["n_scored"] and rows["item_id"].is_unique
    state = json.loads((folder / "state" / f"{MIDDLE}.json").read_text())
    assert state["method_state"]["method"] == "uniform" and state["round"] == res["rounds"] - 1
    assert not list(folder.rglob("*.tmp"))  # atomic writes leave no temporaries
    # the same command again: the run is complete, nothing is scored, results are identical
    _, again = _run("certify", tmp_path, models=[replay(MIDDLE)], goal="halfwidth:0.12", method="uniform",
                    batch_size=60, seed=3, run_id="cert-a")
    assert again["pipeline"]["items_sent"][MIDDLE] == 0 and again["pipeline"]["resumed"] is True
    assert again["models"][0]["mean"] == m["mean"] and again["models"][0]["upper"] == m["upper"]
    # another run (another goal) under the same root reuses the cached scores
    _, other = _run("certify", tmp_path, models=[replay(MIDDLE)], goal="halfwidth:0.08", method="uniform",
                    batch_size=60, seed=3, run_id="cert-b")
    assert other["models"][0]["n_scored"] > m["n_scored"]
    assert other["pipeline"]["items_sent"][MIDDLE] == other["models"][0]["n_scored"] - m["n_scored"]


def test_a_fresh_cli_run_is_not_resumed_and_the_same_command_again_is(infra, tmp_path, capsys):
    """The CLI claims the run folder and then its flow claims it again: only another command's claim of an
    existing run is a resume (results.json's ``pipeline.resumed``)."""
    argv = ["certify", "--model", replay(MIDDLE), "--goal", "halfwidth:0.15", "--method", "uniform",
            "--batch-size", "40", "--ray-address", infra, "--output", str(tmp_path / "runs"), "--run-id", "fresh",
            "--json"]
    assert main(argv) in (0, 1)
    first = json.loads(capsys.readouterr().out)
    assert first["pipeline"]["resumed"] is False
    stored = json.loads((tmp_path / "runs" / "fresh" / "results.json").read_text())
    assert stored["pipeline"]["resumed"] is False
    assert main(argv) in (0, 1)
    assert json.loads(capsys.readouterr().out)["pipeline"]["resumed"] is True


def test_compare_flow_separates_strong_from_weak_with_part_of_the_bank(infra, tmp_path):
    _, res = _run("compare", tmp_path, models=[replay(STRONG), replay(WEAK)], batch_size=50, seed=1, run_id="cmp")
    pair = res["pairs"][0]
    assert pair["verdict"] == "a>b" and pair["lower"] > 0
    assert pair["n_items"] < pair["n_total"]  # stopped early
    truth = _truth(STRONG) - _truth(WEAK)
    assert pair["lower"] <= truth <= pair["upper"]
    assert res["reached"] and {m["model"] for m in res["models"]} == {STRONG, WEAK}


def test_rank_flow_orders_three_models(infra, tmp_path):
    _, res = _run("rank", tmp_path, models=[replay(WEAK), replay(STRONG), replay(MIDDLE)], batch_size=50,
                  seed=2, run_id="rank", margin=0.02)
    ranking = res["ranking"]
    flat = [m for group in ranking["tie_groups"] for m in group]
    assert flat.index(STRONG) < flat.index(WEAK)
    assert ranking["tie_groups"][0] == [STRONG]  # the best model is separated from both others
    assert len(res["pairs"]) == 3 and all(p["verdict"] != "undecided" for p in res["pairs"])
    # paired: every model in play was scored on the same items (the prefix of one order)
    import pandas as pd

    rows = pd.concat([pd.read_parquet(p) for p in (tmp_path / "runs" / "rank" / "rounds").glob("*.parquet")])
    by_model = {m: set(g["item_id"]) for m, g in rows.groupby("model")}
    smallest = min(by_model.values(), key=len)
    assert all(smallest <= items for items in by_model.values())


def test_select_flow_keeps_the_best_and_discards_the_weak(infra, tmp_path):
    _, res = _run("select", tmp_path, models=[replay(WEAK), replay(MIDDLE), replay(STRONG)], batch_size=50,
                  seed=4, run_id="sel", threshold=0.3, halfwidth=0.05)
    sel = res["selection"]
    assert sel["selected"] == [STRONG]
    assert WEAK in sel["discarded"] and MIDDLE in sel["discarded"]
    status = {m["model"]: m["selection_status"] for m in res["models"]}
    assert status[WEAK] in ("below", "not-best") and status[STRONG] == "selected"  # bank target (default)
    assert res["target"] == "bank" and sel["top"] == 1 and sel["fraction_used"] < 1


def test_killed_actor_mid_batch_every_item_scored_exactly_once(infra, tmp_path):
    import ray

    from certeval.runtime.options import RuntimeOptions

    log = tmp_path / "calls.log"
    killed = []

    def killer():  # kill the model actor while it sleeps inside a batch
        deadline = time.time() + 60
        while time.time() < deadline and not killed:
            names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "kill-me" in a["name"]]
            if names and log.exists():
                time.sleep(0.15)
                ray.kill(ray.get_actor(names[0], namespace="certeval"))
                killed.append(names[0])
            time.sleep(0.05)

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    _, res = _run("certify", tmp_path, models=[replay(MIDDLE, latency=0.03)], goal="halfwidth:0.01",
                  method="uniform", batch_size=40, max_items=160, seed=5, run_id="kill-me", in_flight=2,
                  options=RuntimeOptions(call_log=str(log)))
    thread.join(timeout=5)
    assert killed, "the actor was never killed"
    assert res["pipeline"]["actors_replaced"] >= 1 and res["pipeline"]["batches_resubmitted"] >= 1
    calls = read_log(log)
    items = [i for _, i in calls]
    assert len(items) == len(set(items)) == 160  # every item scored once, none twice, none lost
    assert res["models"][0]["n_scored"] == 160


@pytest.mark.parametrize("argv, needle", [
    (["certify", "--model", "nosuch:thing", "--goal", "halfwidth:0.1"], "unknown model spec kind"),
    (["certify", "--model", "replay:bundled:helm_mmlu#no_such_model", "--goal", "halfwidth:0.1"], "unknown model"),
    (["certify", "--model", "replay:bundled:helm_mmlu#openai_ada", "--bank", "/nonexistent/bank.parquet",
      "--goal", "halfwidth:0.1"], "does not exist"),
    (["rank", "--model", "replay:bundled:helm_mmlu#openai_ada"], "at least 2"),
    (["certify", "--model", "replay:bundled:helm_mmlu#openai_ada", "--goal", "width:3"], "goal kind"),
    # nothing listens on port 9: the endpoint is probed (bounded) before anything is written
    (["certify", "--model", "openai:http://127.0.0.1:9/v1#m", "--bank", "bundled:trivia?limit=20",
      "--goal", "halfwidth:0.1"], "is unreachable"),
    (["certify", "--model", "replay:bundled:helm_mmlu#openai_ada", "--goal", "halfwidth:0.1", "--method", "faq"],
     "backtests only"),
    (["certify", "--model", "replay:bundled:helm_mmlu#openai_ada", "--goal", "halfwidth:0.1", "--num-gpus", "-1"],
     "--num-gpus must be"),
])
def test_bad_input_is_one_line_exit_2_and_fast(argv, needle, tmp_path, capsys):
    t0 = time.perf_counter()
    code = main(argv + ["--output", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and needle in err and len(err.splitlines()) == 1
    assert time.perf_counter() - t0 < 120  # before Ray/Prefect: seconds idle; minutes allow a loaded box
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_bank_without_the_fields_the_scorer_needs(tmp_path, capsys):
    import pandas as pd

    bank = tmp_path / "bank.csv"
    pd.DataFrame({"item_id": ["a", "b"], "text": ["x", "y"]}).to_csv(bank, index=False)
    code = main(["certify", "--model", "openai:http://127.0.0.1:9/v1#m", "--bank", str(bank),
                 "--goal", "halfwidth:0.1", "--output", str(tmp_path / "runs")])
    err = capsys.readouterr().err
    assert code == 2 and "needs field" in err


def test_changed_config_for_an_existing_run_id_is_refused(tmp_path, capsys):
    from certeval.runs.plan import claim_run

    out = str(tmp_path / "runs")
    plan, _ = make_plan(Certify(models=[replay(WEAK)], goal="halfwidth:0.1", output=out, run_id="same"))
    claim_run(plan)
    config = (tmp_path / "runs" / "same" / "config.json").read_bytes()
    code = main(["certify", "--model", replay(WEAK), "--goal", "halfwidth:0.05", "--output", out, "--run-id", "same"])
    err = capsys.readouterr().err
    assert code == 2 and "was started with goal=" in err
    assert (tmp_path / "runs" / "same" / "config.json").read_bytes() == config  # nothing overwritten


def test_certify_the_real_small_lm_on_a_handful_of_trivia_items(infra, tmp_path):
    needs_small_lm()
    _, res = _run("certify", tmp_path, models=["hf:bundled:smollm2"], bank="bundled:trivia?categories=uscapitals",
                  goal="halfwidth:0.1", method="uniform", batch_size=4, max_items=8, seed=0, run_id="lm")
    m = res["models"][0]
    assert m["n_scored"] == 8 and res["pipeline"]["items_sent"][m["model"]] == 8
    assert 0.0 <= m["lower"] <= m["upper"] <= 1.0
    assert m["decision"]["rule"] == "budget" and res["results"]["trivia"]["items_scored,none"] == 8


def test_pool_keeps_several_batches_in_flight_across_replicas(infra, tmp_path):
    from certeval.hosting.pool import Actors, ModelPool

    ids = list(load_scores(SCORES).drop_duplicates("item_id")["item_id"][:60])
    pool = ModelPool({"m": replay(MIDDLE, latency=0.005)}, Actors(replicas=2, in_flight=3),
                     cache_urls={"m": str(tmp_path / "cache")}, run_id="pool").start()
    try:
        arrived = []
        out = pool.score({"m": [(i, {"item_id": i}) for i in ids]}, batch_size=5,
                         on_result=lambda label, res: arrived.append(len(res)))
    finally:
        pool.shutdown()
    assert sorted(r["item_id"] for r in out["m"]) == sorted(ids)
    assert pool.stats.max_in_flight == 6  # 2 replicas x 3 queued batches
    assert set(pool.stats.per_replica_batches) == {"m/0", "m/1"} and sum(arrived) == 60
    from certeval.storage import ScoreCache, filesystem

    assert set(ScoreCache(*filesystem(str(tmp_path / "cache"))).load()) == set(ids)  # written by the actors


def test_gpus_asked_for_on_a_machine_without_gpus_fail_before_start(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # what a GPU-less machine looks like to a local Ray
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    code = main(["certify", "--model", replay(WEAK), "--goal", "halfwidth:0.1", "--num-gpus", "1",
                 "--output", str(tmp_path / "runs")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "0 GPU(s)" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_bounds_with_a_huge_number_of_looks_is_refused_at_once(capsys):
    t0 = time.perf_counter()
    assert main(["bounds", "--looks", "1000000", "--alpha", "0.05"]) == 2
    err = capsys.readouterr().err.strip()
    # refused before any integration: computing 10^6 looks would take hours, not the minute allowed here
    assert "at most 1000" in err and len(err.splitlines()) == 1 and time.perf_counter() - t0 < 60


def test_ray_address_from_the_environment_is_used(infra, tmp_path):
    """RAY_ADDRESS names a running cluster: the CLI joins it instead of starting its own."""
    import subprocess

    from test_pipeline_support import PYTHON, cli_env

    out = tmp_path / "runs"
    proc = subprocess.run([PYTHON, "-m", "certeval", "certify", "--model", replay(WEAK), "--goal",
                           "halfwidth:0.2", "--batch-size", "60", "--output", str(out), "--run-id", "env-ray",
                           "--json"], env=cli_env(tmp_path, RAY_ADDRESS=infra), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    res = json.loads((out / "env-ray" / "results.json").read_text())
    assert res["pipeline"]["ray_address"] == infra
    # the command's phases (issue 58): stored and printed alike, the report's time filled in after report.md
    phases = res["pipeline"]["phases"]
    assert json.loads(proc.stdout)["pipeline"]["phases"] == phases
    assert phases["report_s"] > 0 and phases["startup_s"] > 0 and phases["rounds_s"] > 0, phases


def test_a_users_prefect_profile_is_used(infra, tmp_path):
    """A user whose ~/.prefect/profiles.toml points at a Prefect server gets their flow runs there
    (certeval only falls back to its embedded server when nothing is configured)."""
    import asyncio
    import subprocess

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.sorting import FlowRunSort

    from test_pipeline_support import PYTHON, cli_env, prefect_api

    home = tmp_path / "home"
    (home / ".prefect").mkdir(parents=True)
    (home / ".prefect" / "profiles.toml").write_text(
        f'active = "team"\n\n[profiles.team]\nPREFECT_API_URL = "{prefect_api()}"\n')

    async def certify_runs() -> set[str]:
        async with get_client() as client:
            # newest first: the worker's shared server holds every flow run of its earlier tests
            runs = await client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=200)
            return {str(r.id) for r in runs if r.parameters.get("plan", {}).get("run_id") == "via-profile"
                    or "via-profile" in str(r.parameters)}

    before = asyncio.run(certify_runs())
    env = cli_env(tmp_path, HOME=str(home))
    for key in ("PREFECT_API_URL", "PREFECT_HOME", "PREFECT_PROFILE", "PREFECT_PROFILES_PATH"):
        env.pop(key, None)
    proc = subprocess.run([PYTHON, "-m", "certeval", "certify", "--model", replay(WEAK), "--goal", "halfwidth:0.2",
                           "--batch-size", "60", "--output", str(tmp_path / "runs"), "--run-id", "via-profile",
                           "--ray-address", infra], env=env, capture_output=True, text=True, timeout=300,
                          cwd=str(tmp_path))
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    assert not (tmp_path / ".prefect").exists()  # no project-local embedded server was started
    assert len(asyncio.run(certify_runs()) - before) >= 1, "the flow run did not reach the profile's server"


def test_a_hung_model_fails_the_run_in_bounded_time_exit_3_one_line(infra, tmp_path, capsys):
    """Every wait is bounded: a model whose batches never come back (here: 3 s per item, with the stall bound set
    to 2 s by --batch-timeout) ends the run with exit 3 and one line naming the flag, instead of waiting for ever;
    the folder stays resumable."""
    t0 = time.perf_counter()
    code = main(["certify", "--model", replay(MIDDLE, latency=3), "--goal", "halfwidth:0.1", "--batch-size", "5",
                 "--ray-address", infra, "--output", str(tmp_path / "runs"), "--run-id", "hung",
                 "--batch-timeout", "2"])
    err = capsys.readouterr().err.strip()
    assert code == 3, err
    assert "within 2 s" in err and "--batch-timeout" in err and len(err.splitlines()) == 1
    assert time.perf_counter() - t0 < 300  # the 2 s stall bound, not the 3 s x items the batches would take
    assert (tmp_path / "runs" / "hung" / "config.json").exists()  # resumable: the request is recorded
