"""The synthetic replay source (``replay:synthetic:<M>x<N>[:<seed>]#m<k>``): malformed locations exit 2 with the
value named, rows are rebuilt bit for bit from the location alone and follow the Rasch rule they claim, the
plan builds the bank without materialising the table, and a selection over it runs through the real pipeline
(Prefect flow, Ray replay actor) and picks a model within epsilon of the exact best."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit

from certeval.cli import main
from certeval.errors import InputError
from certeval.hosting.replay import ReplayHost
from certeval.inputs.model_spec import parse_model_spec
from certeval.inputs.synthetic import SyntheticScores, synthetic_scores
from certeval.requests import Select
from certeval.runs.plan import make_plan


@pytest.mark.parametrize("location", ["synthetic:10x", "synthetic:0x10", "synthetic:10x0", "synthetic:ax10",
                                      "synthetic:100000x100000", "synthetic:10x10:-1",
                                      "synthetic:1x1000000000"])  # inside the cell cap: ran out of memory at run time
def test_malformed_locations_name_the_value(location):
    with pytest.raises(InputError, match="synthetic"):
        SyntheticScores.parse(location)


def test_rows_are_reproducible_and_follow_the_rasch_rule():
    table = SyntheticScores.parse("synthetic:400x3000:11")
    again = SyntheticScores(400, 3000, 11)
    assert np.array_equal(table.row(7), again.row(7))
    assert not np.array_equal(table.row(7), table.row(8))
    assert not np.array_equal(table.row(7), SyntheticScores(400, 3000, 12).row(7))
    assert set(np.unique(table.row(3))) <= {0.0, 1.0}
    assert len(set(table.model_names)) == 400 and table.model_names[0] == "m000"
    # each row's mean against its expected accuracy: a z-test per model, all 400 within 4.5 sd
    p = expit(table.abilities[:, None] - table.difficulties[None, :])
    means = table.bank_means()
    sd = np.sqrt((p * (1 - p)).sum(axis=1)) / table.n_items
    z = (means - p.mean(axis=1)) / sd
    assert np.abs(z).max() < 4.5 and abs(z.mean()) < 0.3  # a shifted or miswired row rule fails here
    with pytest.raises(InputError):
        table.row(400)


def test_replay_host_answers_the_generated_row():
    location = "synthetic:30x500:2"
    host = ReplayHost(parse_model_spec(f"replay:{location}#m17"))
    items = [{"item_id": f"i{j:03d}"} for j in (0, 5, 499)]
    got = [r["score"] for r in host.score(items)]
    assert got == list(synthetic_scores(location).row(17)[[0, 5, 499]])


def test_plan_builds_the_bank_and_refuses_unknown_models(tmp_path):
    plan, prepared = make_plan(Select(models=[f"replay:synthetic:50x700:3#m{k:02d}" for k in range(50)],
                                           top=1, halfwidth=0.05, output=str(tmp_path), run_id="syn"))
    bank = prepared.bank
    assert bank.n_items == 700 and bank.item_ids[0] == "i000"
    with pytest.raises(InputError, match="unknown model 'm99'"):
        make_plan(Select(models=["replay:synthetic:50x700:3#m00", "replay:synthetic:50x700:3#m99"],
                              output=str(tmp_path), run_id="syn2"))


def test_cli_bad_synthetic_location_exits_2_with_one_line(tmp_path, capsys):
    rc = main(["select", "--model", "replay:synthetic:5x#m0", "--model", "replay:synthetic:5x#m1",
               "--output", str(tmp_path), "--json"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "synthetic:5x" in err[0]
    assert not any(tmp_path.iterdir())


@pytest.mark.slow
def test_select_over_a_synthetic_table_through_the_pipeline(infra, tmp_path):
    from certeval.flows.pipeline import run_plan

    location = "synthetic:60x1500:5"
    models = [f"replay:{location}#m{k:02d}" for k in range(60)]
    plan, _ = make_plan(Select(models=models, top=1, halfwidth=0.03, batch_size=100, seed=4,
                                    output=str(tmp_path / "runs"), run_id="syn-select"))
    res = run_plan(plan)
    truth = synthetic_scores(location).bank_means()
    chosen = [m["model"] for m in res["models"] if m.get("selection_status") == "selected"]
    assert len(chosen) == 1 and truth[int(chosen[0][1:])] >= truth.max() - 0.03
    assert res["selection"]["fraction_used"] < 0.6  # weak models leave early
