"""Damaged run folders are refused in one line naming the object, never resumed into a loop."""

from __future__ import annotations

import json

import pytest

from certeval.cli import main
from certeval.estimators import InputError
from certeval.tasks.plan import make_plan
from certeval.tasks.run import Run

from test_pipeline_support import MIDDLE, STRONG, WEAK, replay, small_scores

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished_rank(infra, tmp_path_factory):
    """A completed 3-model rank run over 150 items (several rounds), to damage in copies."""
    from certeval.flows.pipeline import run_plan

    tmp = tmp_path_factory.mktemp("damaged")
    scores = small_scores(tmp, n_items=150)
    plan, _ = make_plan("rank", models=[replay(m, scores) for m in (STRONG, MIDDLE, WEAK)], batch_size=25,
                        seed=2, output=str(tmp / "runs"), run_id="rank")
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
