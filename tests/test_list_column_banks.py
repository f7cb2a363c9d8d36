"""Banks with list columns (``choices``, ``answers``) in every table format run every command kind.

pandas reads a Parquet list column as numpy arrays; a bank saved that way crashed every pipeline command (exit 3,
"can only convert an array of size 1") while the same bank as JSONL worked. Real Prefect flows and Ray replay
actors; one real small-LM run scores multiple choice from a Parquet bank.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from certeval.banks import load_bank, load_scores
from certeval.storage.cache import item_key, prompt_hash
from certeval.storage.io import dumps
from certeval.tasks.plan import PlanRequest, make_plan

from test_pipeline_support import MIDDLE, STRONG, WEAK, needs_small_lm, replay, small_scores

FORMATS = ("parquet", "jsonl", "json")


def _write(frame: pd.DataFrame, path) -> str:
    suffix = path.suffix
    if suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    else:
        frame.to_json(path, orient="records")
    return str(path)


def _bank_frame(item_ids) -> pd.DataFrame:
    return pd.DataFrame({
        "item_id": list(item_ids),
        "question": [f"Question {i}?" for i in range(len(item_ids))],
        "choices": [[f"a{i}", f"b{i}", f"c{i}", f"d{i}"] for i in range(len(item_ids))],
        "answer": [i % 4 for i in range(len(item_ids))],
    })


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_list_column_reads_back_as_plain_lists_that_hash_and_serialise(tmp_path, fmt):
    path = _write(_bank_frame(["x", "y"]), tmp_path / f"bank.{fmt}")
    bank = load_bank(path)
    row = bank.frame.iloc[1].to_dict()
    assert row["choices"] == ["a1", "b1", "c1", "d1"] and type(row["choices"]) is list
    # the same item gives the same cache key and prompt hash whatever format it was read from
    jsonl = load_bank(_write(_bank_frame(["x", "y"]), tmp_path / "ref.jsonl")).frame.iloc[1].to_dict()
    assert item_key(row) == item_key(jsonl) and prompt_hash(row) == prompt_hash(jsonl)
    assert json.loads(dumps({"choices": np.array(["p", "q"], dtype=object)})) == {"choices": ["p", "q"]}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["parquet"])  # the format whose list columns read back as arrays
@pytest.mark.parametrize("kind", ["certify", "compare", "rank", "select"])
def test_every_command_kind_runs_on_a_bank_with_a_list_column(infra, tmp_path, fmt, kind):
    from certeval.flows.pipeline import run_plan

    scores = small_scores(tmp_path, n_items=60)
    ids = pd.unique(load_scores(scores)["item_id"])
    bank = _write(_bank_frame(ids), tmp_path / f"bank.{fmt}")
    models = {"certify": [STRONG], "compare": [STRONG, WEAK]}.get(kind, [STRONG, MIDDLE, WEAK])
    extra = {"certify": {"goal": "halfwidth:0.2"}, "select": {"threshold": 0.3, "halfwidth": 0.1}}.get(kind, {})
    plan, _ = make_plan(PlanRequest(kind, models=[replay(m, scores) for m in models], bank=bank, batch_size=20,
                                    seed=1, output=str(tmp_path / "runs"), run_id=f"{kind}-{fmt}", **extra))
    res = run_plan(plan)
    assert res["done"] is True and res["bank"]
    assert sorted(m["model"] for m in res["models"]) == sorted(models)
    for m in res["models"]:
        assert 0 < m["n_scored"] <= 60 and m["lower"] <= m["mean"] <= m["upper"]


@pytest.mark.slow
def test_the_small_lm_scores_multiple_choice_from_a_parquet_bank(infra, tmp_path):
    needs_small_lm()
    from certeval.flows.pipeline import run_plan

    frame = pd.DataFrame({
        "item_id": ["sky", "sum", "ice"],
        "question": ["What color is the sky on a clear sunny day?", "What is 2 + 2?", "What is frozen water called?"],
        "choices": [["blue", "green", "purple", "orange"], ["4", "9", "17", "31"], ["sand", "smoke", "paper", "ice"]],
        "answer": [0, 0, 3],
    })
    bank = _write(frame, tmp_path / "mc.parquet")
    plan, _ = make_plan(PlanRequest("certify", models=["hf:bundled:smollm2?threads=1"], bank=bank, batch_size=3,
                                    goal="halfwidth:0.01", scorer="mc-loglik", output=str(tmp_path / "runs"),
                                    run_id="hf-parquet"))
    res = run_plan(plan)
    (model,) = res["models"]
    assert model["n_scored"] == model["items_sent_to_model"] == 3 and model["estimate"]["exhausted"] is True
    assert model["lower"] == model["mean"] == model["upper"]  # the bank mean, exact once every item is scored
