"""Fixed-seed compare / rank / select runs (both targets, with and without history, one stopped by the budget)
give the results stored in ``tests/data/paired_fixed_seed.json``: the same items each round, the same verdicts
and decisions, every recorded statistic within 1e-9. Written before the paired rounds moved into the engine
(``certeval.engine.PairedRounds``), it holds them to what the old round code computed; a change of results
must be intended, rewritten with ``python tests/paired_fixed_seed.py`` and said in its commit."""

from __future__ import annotations

import json

import pytest

from paired_fixed_seed import CASES, STORED, differences, run_case

TOLERANCE = 1e-9  # the stored digest came from one machine; vector units may round the last bits differently


@pytest.mark.parametrize("name", sorted(CASES))
def test_fixed_seed_paired_run_matches_the_stored_results(tmp_path, name):
    stored = json.loads(STORED.read_text())[name]
    fresh = run_case(name, tmp_path)
    assert differences(stored, fresh, TOLERANCE) == []


def test_the_comparison_catches_a_changed_statistic_and_a_changed_item():
    stored = json.loads(STORED.read_text())["rank-bank"]
    moved = json.loads(json.dumps(stored))
    moved["looks"][0]["look_lower"] += 1e-6
    moved["looks"][1]["items_sha256"] = "0" * 16
    found = differences(stored, moved, TOLERANCE)
    assert len(found) == 2 and "look_lower" in found[0] and "items_sha256" in found[1]
