"""``--aggregate``: on a bank with sub-datasets the estimand is a named choice — the mean of sub-dataset means (the
default) or the plain mean over items — and every output names it; a resumed run cannot switch it."""

from __future__ import annotations

import json

import pytest

from certeval.cli import main
from certeval.inputs.banks import load_scores

from test_pipeline_support import MIDDLE, SCORES, WEAK, replay

pytestmark = pytest.mark.slow


def _means(model: str) -> tuple[float, float]:
    frame = load_scores(SCORES)
    mine = frame[frame["model"] == model]
    return float(mine["score"].mean()), float(mine.groupby("subset")["score"].mean().mean())


COMMAND = ["rank", "--model", replay(MIDDLE), "--model", replay(WEAK), "--batch-size", "300",
           "--goal", "halfwidth:0.00001"]  # leaderboard precision this fine is met only at exhaustion


def _run(tmp_path, capsys, *extra) -> dict:
    rc = main([*COMMAND, "--output", str(tmp_path / "runs"), "--json", *extra])
    assert rc in (0, 1), capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def test_the_plain_mean_and_the_mean_of_sub_dataset_means_are_named_and_computed(infra, tmp_path, capsys):
    plain, per_subset = _means(MIDDLE)
    assert abs(plain - per_subset) > 1e-3  # helm_mmlu's sub-datasets differ in size: the two estimands differ
    # at exhaustion the estimate is the exact estimand
    mean = _run(tmp_path, capsys, "--aggregate", "mean", "--run-id", "plain")
    default = _run(tmp_path, capsys, "--run-id", "per-subset")
    by_model = {m["model"]: m for m in mean["models"]}
    assert by_model[MIDDLE]["mean"] == pytest.approx(plain, abs=1e-9)
    assert {m["model"]: m for m in default["models"]}[MIDDLE]["mean"] == pytest.approx(per_subset, abs=1e-9)
    assert mean["aggregate"]["name"] == "mean" and "each item counts once" in mean["aggregate"]["text"]
    assert default["aggregate"]["name"] == "subset-mean" and default["aggregate"]["subsets"] > 1
    block = next(iter(mean["lm_eval"].values()))
    assert block["configs"][mean["task"]]["metric_list"][0]["aggregation"] == "mean"
    block = next(iter(default["lm_eval"].values()))
    assert block["configs"][default["task"]]["metric_list"][0]["aggregation"] == "mean_of_subset_means"
    report = (tmp_path / "runs" / "plain" / "report.md").read_text()
    assert "**estimand** the mean over the items of all" in report
    # the same run id with the other estimand is another run: refused before anything is written
    rc = main([*COMMAND, "--output", str(tmp_path / "runs"), "--run-id", "plain"])
    err = capsys.readouterr().err
    assert rc == 2 and "aggregate" in err and len(err.strip().splitlines()) == 1


def test_a_bad_aggregate_exits_2_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:  # argparse's own refusal of a value outside the choices
        main(["certify", "--model", replay(MIDDLE), "--goal", "halfwidth:0.1", "--aggregate", "median",
              "--output", str(tmp_path / "runs")])
    assert stop.value.code == 2 and "--aggregate" in capsys.readouterr().err and not (tmp_path / "runs").exists()
    from certeval.errors import InputError
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan

    with pytest.raises(InputError, match="--aggregate must be one of subset-mean, mean; got 'median'"):
        make_plan(Certify(models=[replay(MIDDLE)], goal="halfwidth:0.1", aggregate="median",
                              output=str(tmp_path / "runs")))
