"""``certeval demo`` (README command 1) shows the product's point: the certified ranking beside the full run's
answer, in a fraction of its calls. Real Prefect flows and Ray replay actors; the small-LM part is covered by the
hf-host pipeline tests (``--skip-lm`` here keeps this test to seconds)."""

from __future__ import annotations

import json

import pytest

from certeval.cli import main
from certeval.flows.demo import RANK_EPSILON, RANK_MODELS, describe_full_run

pytestmark = pytest.mark.slow


def test_demo_ranking_matches_the_full_run_in_under_0_6_of_its_calls(infra, tmp_path, capsys):
    assert main(["demo", "--skip-lm", "--ray-address", infra, "--output", str(tmp_path / "runs"), "--json"]) == 0
    (rank,) = json.loads(capsys.readouterr().out)
    full = rank["full_run"]
    assert rank["ranking"]["epsilon"] == RANK_EPSILON and full["full_calls"] == 5 * 567
    assert full["fraction_of_calls"] < 0.6, full
    assert full["calls"] == sum(m["items_sent_to_model"] for m in rank["models"])
    assert full["order"][0] == RANK_MODELS[0] and sorted(full["means"]) == sorted(RANK_MODELS)
    assert full["listing_holds"] is True
    # the certified listing is the full run's order, model by model (these five are ≥ 0.028 apart)
    listed = [m for group in rank["ranking"]["tie_groups"] for m in group]
    assert listed == full["order"]
    # what the console prints (the CLI prints exactly this under each run's summary)
    lines = describe_full_run(rank).splitlines()
    assert lines[0] == "  certified listing: " + "  >  ".join(listed)
    best = full["order"][0]
    assert lines[1].startswith(f"  full run (every item, exact means): {best} {full['means'][best]:.3f}  >  ")
    assert lines[2] == (f"  the certified listing holds against the full run; calls: {full['calls']:,} of a full "
                        f"run's 2,835 ({full['fraction_of_calls']:.2f} of the full run)")
