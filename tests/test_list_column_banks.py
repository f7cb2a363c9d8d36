"""Banks with a list column (``choices``) in every bank format run every command kind.

pandas reads a Parquet list column as numpy arrays; a bank saved that way crashed every pipeline command (exit 3,
"can only convert an array of size 1") while the same bank as JSONL worked. One converter now turns a stored value
into JSON, an item for a model and the score cache's hash input (``certeval.estimators.results.to_jsonable``), so
the same item reads the same from Parquet, JSONL, JSON and CSV (whose list cells are text: parsed back to lists),
and the banks an lm-eval samples file and an Inspect log make keep their choices as lists too. Real Prefect flows
and Ray replay actors, one real small-LM run per table format that needs parsing.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from certeval.inputs.banks import load_bank, load_scores
from certeval.requests import Certify, request_for
from certeval.runs.plan import make_plan
from certeval.storage.cache import item_key, prompt_hash
from certeval.storage.io import dumps

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK, needs_small_lm, replay

# inspect-ai 0.3.285 passes a deprecated argument to tenacity 9.2 on every model call: not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")

TABLES = ("parquet", "jsonl", "json", "csv")
FORMATS = ("parquet", "jsonl", "csv", "lm-eval", "inspect")  # the formats a bank is read from
KINDS = ("certify", "compare", "rank", "select")
N_ITEMS = 60
TASK = "mc_task"


def _write(frame: pd.DataFrame, path) -> str:
    suffix = path.suffix
    if suffix == ".parquet":
        frame.to_parquet(path, index=False)
    elif suffix == ".jsonl":
        frame.to_json(path, orient="records", lines=True)
    elif suffix == ".csv":
        frame.to_csv(path, index=False)  # lists as their text: ['a0', 'b0', ...]
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


@pytest.mark.parametrize("fmt", TABLES)
def test_a_list_column_reads_back_as_plain_lists_that_hash_and_serialise(tmp_path, fmt):
    frame = _bank_frame(["x", "y"])
    frame["note"] = ["[not a list", None]  # a text column stays text
    path = _write(frame, tmp_path / f"bank.{fmt}")
    bank = load_bank(path)
    row = bank.frame.iloc[1].to_dict()
    assert row["choices"] == ["a1", "b1", "c1", "d1"] and type(row["choices"]) is list
    assert bank.frame["note"].iloc[0] == "[not a list" and pd.isna(bank.frame["note"].iloc[1])
    # the same item gives the same cache key and prompt hash whatever format it was read from
    jsonl = load_bank(_write(frame, tmp_path / "ref.jsonl")).frame.iloc[1].to_dict()
    assert item_key(row) == item_key(jsonl) and prompt_hash(row) == prompt_hash(jsonl)
    assert json.loads(dumps({"choices": np.array(["p", "q"], dtype=object)})) == {"choices": ["p", "q"]}


def test_a_gap_is_missing_in_every_format_and_the_hash_input_is_plain_data():
    """NaN (a CSV or Parquet gap), None (JSONL's null) and pd.NA are one missing value for the hash: left out."""
    base = {"item_id": "q1", "question": "What?", "choices": ["a", "b"]}
    keys = {item_key({**base, "answers": gap}) for gap in (float("nan"), None, pd.NA)}
    assert keys == {item_key(base)}
    assert item_key({**base, "choices": np.array(["a", "b"], dtype=object)}) == item_key(base)
    assert prompt_hash({**base, "choices": ("a", "b")}) == prompt_hash(base)
    assert json.loads(dumps({"n": np.int64(3), "when": pd.Timestamp("2026-01-02"), "gap": pd.NA})) == {
        "n": 3, "when": "2026-01-02T00:00:00", "gap": None}


def test_csv_list_cells_in_json_or_python_text_become_lists_and_an_embedding_column_works(tmp_path):
    path = tmp_path / "bank.csv"
    path.write_text('item_id,choices,embedding\na,"[""x"", ""y""]","[0.5, 1.0]"\nb,"[\'z\', \'w\']","[0.0, 2.0]"\n')
    bank = load_bank(str(path))
    assert bank.frame["choices"].tolist() == [["x", "y"], ["z", "w"]]
    assert bank.features.tolist() == [[0.5, 1.0], [0.0, 2.0]]


# --------------------------------------------------------------------------------------- every format x command


def _lm_eval_samples(folder, n: int) -> str:
    """A multiple-choice samples file as lm-eval writes it (one log-likelihood request per choice)."""
    out = folder / "org__model"
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"samples_{TASK}_2026-11-23T10-11-12.123456.jsonl"
    with open(path, "w") as fh:
        for i in range(n):
            choices = [f"a{i}", f"b{i}", f"c{i}", f"d{i}"]
            context = f"Question {i}?\nAnswer:"
            fh.write(json.dumps({
                "doc_id": i, "doc": {"question": f"Question {i}?", "choices": choices, "answer": i % 4},
                "target": i % 4, "arguments": [[context, " " + c] for c in choices],
                "resps": [[[-1.0, False]] for _ in choices], "filtered_resps": [[-1.0, False] for _ in choices],
                "doc_hash": f"h{i}", "prompt_hash": "p", "target_hash": "t", "acc": 1.0}) + "\n")
    return str(path)


def _inspect_log(folder, n: int) -> str:
    """A real Inspect eval (mock model, offline) over multiple-choice samples: its log keeps their choices."""
    pytest.importorskip("inspect_ai")
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    def respond(messages, tools, tool_choice, config):
        out = ModelOutput.from_content(model="mockllm", content="A")
        out.usage = ModelUsage(input_tokens=3, output_tokens=1, total_tokens=4)  # no tiktoken download
        return out

    samples = [Sample(id=i, input=f"Question {i}?", choices=[f"a{i}", f"b{i}", f"c{i}", f"d{i}"],
                      target="ABCD"[i % 4]) for i in range(n)]
    task = Task(dataset=MemoryDataset(samples), solver=generate(), scorer=match(), name=TASK)
    (log,) = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=respond), log_dir=str(folder),
                          display="none", max_samples=4)
    return log.location


@pytest.fixture(scope="module")
def banks(tmp_path_factory):
    """Each format's bank of the same N_ITEMS items (a choices list each) and the recorded scores of three models
    on its item ids (HELM MMLU's first items, relabelled where a harness names the items itself)."""
    folder = tmp_path_factory.mktemp("list-banks")
    scores = load_scores(SCORES)
    ids = list(pd.unique(scores["item_id"]))[:N_ITEMS]
    scores = scores[scores["model"].isin([STRONG, MIDDLE, WEAK]) & scores["item_id"].isin(ids)].drop(columns="subset")
    out = {}
    for fmt in ("parquet", "jsonl", "csv"):
        out[fmt] = (_write(_bank_frame(ids), folder / f"bank.{fmt}"), _scores(scores, folder, "table", ids))
    harness_ids = [f"{TASK}/{i}" for i in range(N_ITEMS)]
    out["lm-eval"] = (_lm_eval_samples(folder / "lm-eval", N_ITEMS), _scores(scores, folder, "harness", harness_ids,
                                                                             ids))
    out["inspect"] = (_inspect_log(folder / "inspect", N_ITEMS), out["lm-eval"][1])
    return out


def _scores(scores: pd.DataFrame, folder, name: str, new_ids, ids=None) -> str:
    path = folder / f"{name}.scores.parquet"
    if not path.exists():
        relabel = dict(zip(ids if ids is not None else new_ids, new_ids))
        scores.assign(item_id=scores["item_id"].map(relabel)).to_parquet(path, index=False)
    return str(path)


@pytest.mark.slow  # a real Inspect eval makes the Inspect log
def test_every_format_reads_the_choices_as_lists(banks):
    for fmt, (bank_path, _) in banks.items():
        bank = load_bank(bank_path)
        assert bank.n_items == N_ITEMS, fmt
        choices = bank.frame["choices"].tolist()
        assert all(type(c) is list and len(c) == 4 for c in choices), fmt
        assert choices[5] == ["a5", "b5", "c5", "d5"], fmt


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_command_kind_runs_on_every_bank_format_with_a_list_column(infra, kept_actors, banks, tmp_path_factory,
                                                                         fmt, kind):
    from certeval.flows.pipeline import run_plan

    bank, scores = banks[fmt]
    models = {"certify": [STRONG], "compare": [STRONG, WEAK]}.get(kind, [STRONG, MIDDLE, WEAK])
    extra = {"certify": {"goal": "halfwidth:0.2"}, "select": {"threshold": 0.3, "halfwidth": 0.1}}.get(kind, {})
    # one output root for every run: the table formats hold the same items, so they share the score cache; the
    # replay actors (no CPUs) are kept, so a run on the same scores file and models adopts an earlier one's
    output = str(tmp_path_factory.getbasetemp() / "list-bank-runs")
    plan, _ = make_plan(request_for(kind, models=[replay(m, scores) for m in models], bank=bank, batch_size=20,
                                    seed=1, output=output, run_id=f"{kind}-{fmt}", ray_address=infra,
                                    options={"keep_actors": True}, **extra))
    res = run_plan(plan)
    assert res["done"] is True and res["bank"] == bank
    assert sorted(m["model"] for m in res["models"]) == sorted(models)
    for m in res["models"]:
        assert 0 < m["n_scored"] <= N_ITEMS and m["lower"] <= m["mean"] <= m["upper"]
    if fmt in ("jsonl", "csv") and os.path.isdir(f"{output}/{kind}-parquet"):  # the same items: the same cache keys
        assert all(m["items_sent_to_model"] == 0 for m in res["models"]), [m["items_sent_to_model"]
                                                                          for m in res["models"]]


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["parquet", "csv"])  # list cells read back as arrays / as text
def test_the_small_lm_scores_multiple_choice_from_a_list_column(infra, kept_actors, tmp_path, fmt):
    needs_small_lm()
    from certeval.flows.pipeline import run_plan

    frame = pd.DataFrame({
        "item_id": ["sky", "sum", "ice"],
        "question": ["What color is the sky on a clear sunny day?", "What is 2 + 2?", "What is frozen water called?"],
        "choices": [["blue", "green", "purple", "orange"], ["4", "9", "17", "31"], ["sand", "smoke", "paper", "ice"]],
        "answer": [0, 0, 3],
    })
    bank = _write(frame, tmp_path / f"mc.{fmt}")
    plan, _ = make_plan(Certify(models=["hf:bundled:smollm2?threads=1"], bank=bank, batch_size=3,
                                    goal="halfwidth:0.01", scorer="mc-loglik", output=str(tmp_path / "runs"),
                                    run_id=f"hf-{fmt}", ray_address=infra,
                                    options={"keep_actors": True}))  # the second format's run adopts the first's actor
    res = run_plan(plan)
    (model,) = res["models"]
    assert model["n_scored"] == model["items_sent_to_model"] == 3 and model["estimate"]["exhausted"] is True
    assert model["lower"] == model["mean"] == model["upper"]  # the bank mean, exact once every item is scored
