"""Damaged run folders are refused in one line naming the object, never resumed into a loop."""

from __future__ import annotations

import json

import pytest

from certeval.cli import main
from certeval.errors import InputError
from certeval.requests import Certify, Rank
from certeval.runs.plan import make_plan
from certeval.runs.run import Run

from test_pipeline_support import MIDDLE, STRONG, WEAK, replay, small_scores

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished_rank(infra, tmp_path_factory):
    """A completed 3-model rank run over 150 items (several rounds), to damage in copies."""
    from certeval.flows.pipeline import run_plan

    tmp = tmp_path_factory.mktemp("damaged")
    scores = small_scores(tmp, n_items=150)
    plan, _ = make_plan(Rank(models=[replay(m, scores) for m in (STRONG, MIDDLE, WEAK)], batch_size=25,
                                    seed=2, output=str(tmp / "runs"), run_id="rank"))
    res = run_plan(plan)
    assert res["rounds"] >= 3
    return plan, tmp / "runs" / "rank"


def _copy(plan, folder, tmp_path):
    import shutil
    from dataclasses import replace

    shutil.copytree(folder, tmp_path / "runs" / "rank")
    return replace(plan, output=str(tmp_path / "runs"))


def _reopen(plan):
    run = Run.open(plan)
    run.restore()
    return run


def test_a_missing_round_file_is_refused_not_looped(finished_rank, tmp_path):
    plan, folder = finished_rank
    plan = _copy(plan, folder, tmp_path)
    marker = tmp_path / "runs" / "rank" / "state" / "_run.json"
    data = json.loads(marker.read_text())
    data.update(round=2, active=list(plan.labels), decisions={})  # as if it had crashed after round 2
    marker.write_text(json.dumps(data))
    (tmp_path / "runs" / "rank" / "rounds" / "00001.parquet").unlink()
    with pytest.raises(InputError, match=r"damaged: rounds/00001.parquet is missing"):
        _reopen(plan)


@pytest.mark.parametrize("target", ["state/_run.json", "rounds/00000.parquet"])
def test_truncated_files_are_named_in_one_line(finished_rank, tmp_path, target):
    plan, folder = finished_rank
    plan = _copy(plan, folder, tmp_path)
    path = tmp_path / "runs" / "rank" / target
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    with pytest.raises(InputError, match=f"{target}.*damaged"):
        _reopen(plan)


def test_the_cli_exits_2_on_a_damaged_folder(finished_rank, tmp_path, capsys, infra):
    plan, folder = finished_rank
    plan = _copy(plan, folder, tmp_path)
    (tmp_path / "runs" / "rank" / "state" / "_run.json").write_text("{not json")
    argv = ["rank", "--output", str(tmp_path / "runs"), "--run-id", "rank", "--batch-size", "25", "--seed", "2",
            "--ray-address", infra]
    for m in plan.models:
        argv += ["--model", m]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "damaged" in err and len(err.splitlines()) == 1, err


# -- single-model runs: the manifest (size, sha256, rows per model of every round) is checked on resume --------


@pytest.fixture(scope="module")
def stopped_certify(infra, tmp_path_factory):
    """A certify run of two models stopped by its item budget after several rounds (resumable, not done)."""
    from certeval.flows.pipeline import run_plan

    tmp = tmp_path_factory.mktemp("damaged-single")
    scores = small_scores(tmp, n_items=150)
    plan, _ = make_plan(Certify(models=[replay(m, scores) for m in (MIDDLE, WEAK)], goal="halfwidth:0.01",
                                    method="uniform", batch_size=10, max_items=40, seed=3, output=str(tmp / "runs"),
                                    run_id="cert"))
    res = run_plan(plan)
    assert res["rounds"] == 4 and not res["reached"]
    return plan, tmp / "runs" / "cert"


def _copy_single(plan, folder, tmp_path):
    import shutil
    from dataclasses import replace

    shutil.copytree(folder, tmp_path / "runs" / "cert")
    return replace(plan, output=str(tmp_path / "runs")), tmp_path / "runs" / "cert"


def _state_path(folder, label):
    from certeval.storage import safe_name

    return folder / "state" / f"{safe_name(label)}.json"


def test_an_intact_single_run_reopens(stopped_certify, tmp_path):
    plan, folder = stopped_certify
    plan, _ = _copy_single(plan, folder, tmp_path)
    run = _reopen(plan)
    assert run.round == 4 and all(run.n_scored(m) == 40 for m in plan.labels)


def test_a_deleted_single_round_file_is_refused(stopped_certify, tmp_path):
    plan, folder = stopped_certify
    plan, copy = _copy_single(plan, folder, tmp_path)
    (copy / "rounds" / "00002.parquet").unlink()
    with pytest.raises(InputError, match=r"damaged: rounds/00002.parquet is missing"):
        _reopen(plan)


def test_an_edited_round_file_is_refused(stopped_certify, tmp_path):
    import pandas as pd

    plan, folder = stopped_certify
    plan, copy = _copy_single(plan, folder, tmp_path)
    path = copy / "rounds" / "00001.parquet"
    frame = pd.read_parquet(path)
    frame["score"] = 1.0 - frame["score"]  # a valid Parquet file with other content
    frame.to_parquet(path, index=False)
    with pytest.raises(InputError, match=r"rounds/00001.parquet differs from what was written"):
        _reopen(plan)


def test_a_raised_round_counter_is_refused(stopped_certify, tmp_path):
    plan, folder = stopped_certify
    plan, copy = _copy_single(plan, folder, tmp_path)
    path = _state_path(copy, plan.labels[0])
    state = json.loads(path.read_text())
    state["round"] = 9  # rounds 4..9 were never written
    path.write_text(json.dumps(state))
    with pytest.raises(InputError, match=r"says round 9 was committed, but rounds/00004.parquet holds no row"):
        _reopen(plan)


def test_a_swapped_state_file_is_refused(stopped_certify, tmp_path):
    """Model A's state holds B's scores count under A's name: the rows per model disagree."""
    plan, folder = stopped_certify
    plan, copy = _copy_single(plan, folder, tmp_path)
    a, b = (_state_path(copy, m) for m in plan.labels)
    state = json.loads(b.read_text())
    state["round"] = 1  # B's state, as of round 1, under A's name: 40 scored items recorded up to round 1
    a.write_text(json.dumps(state))
    with pytest.raises(InputError, match=r"says 40 items were scored, the committed rounds hold 20"):
        _reopen(plan)


@pytest.mark.parametrize("content", ['{"round": "x", "method_state": {}}', '{"method_state": 3}', "[]"])
def test_a_mistyped_state_file_is_named_in_one_line(stopped_certify, tmp_path, content):
    plan, folder = stopped_certify
    plan, copy = _copy_single(plan, folder, tmp_path)
    _state_path(copy, plan.labels[0]).write_text(content)
    with pytest.raises(InputError, match=r"state/.*\.json is damaged"):
        _reopen(plan)


@pytest.mark.parametrize("damage", ["delete", "truncate", "not-a-manifest"])
def test_a_missing_or_damaged_manifest_is_refused(stopped_certify, tmp_path, damage):
    plan, folder = stopped_certify
    plan, copy = _copy_single(plan, folder, tmp_path)
    path = copy / "manifest.json"
    if damage == "delete":
        path.unlink()
    elif damage == "truncate":
        path.write_bytes(path.read_bytes()[:20])
    else:
        path.write_text('{"rounds": []}')
    with pytest.raises(InputError, match=r"manifest.json"):
        _reopen(plan)


@pytest.mark.parametrize("damage", ["results-truncated", "results-no-models", "results-mean-text", "round-deleted",
                                    "round-truncated", "round-wrong-columns", "state-truncated", "state-a-list",
                                    "config-truncated", "config-a-list", "marker-truncated"])
def test_report_on_a_damaged_run_folder_is_one_line(finished_rank, tmp_path, damage, capsys):
    import pandas as pd

    plan, folder = finished_rank
    _copy(plan, folder, tmp_path)
    run = tmp_path / "runs" / "rank"
    kind, _, how = damage.partition("-")
    target = {"results": run / "results.json", "round": run / "rounds" / "00001.parquet",
              "state": next(p for p in (run / "state").glob("*.json") if not p.name.startswith("_")),
              "config": run / "config.json", "marker": run / "state" / "_run.json"}[kind]
    if how == "truncated":
        target.write_bytes(target.read_bytes()[: len(target.read_bytes()) // 2])
    elif how == "deleted":
        target.unlink()
    elif how == "no-models":
        target.write_text(json.dumps({**json.loads(target.read_text()), "models": []}))
    elif how == "mean-text":
        data = json.loads(target.read_text())
        data["models"][0]["mean"] = "high"
        target.write_text(json.dumps(data))
    elif how == "wrong-columns":
        pd.DataFrame({"a": [1, 2]}).to_parquet(target, index=False)
    elif how == "a-list":
        target.write_text("[]")
    code = main(["report", str(run)])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if code != 0:  # damage the report cannot work around: refused in one line naming the problem
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1, err
        assert "damaged" in lines[0] or "not" in lines[0], err
