"""An lm-eval ``generate_until`` task through ``--tasks``: each item is generated at the request's own stop strings
and budget and judged by the task's own filter pipelines and metric, run by lm-eval itself (checked against
``lm_eval --model hf`` on the same converted SmolLM2, per item and per filter); tasks certeval could not score as
lm-eval does (sampling, the task's own code, unbounded metrics) exit 2 in one line. Offline: local JSONL."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from certeval.cli import main
from certeval.errors import InputError
from certeval.harnesses.lm_eval_tasks import load_task_items
from certeval.scoring.lm_eval_generation import GENERATION, SCORING, judge, qualified

from lm_eval_support import write_gen_task

pytest.importorskip("lm_eval")

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
FILTERS = ("strict-match", "flexible-extract")


@pytest.fixture()
def offline(tmp_path, monkeypatch):
    for key, value in {**OFFLINE, "HF_DATASETS_CACHE": str(tmp_path / "hf")}.items():
        monkeypatch.setenv(key, value)


def test_generation_items_carry_the_request_and_lm_evals_own_filters_judge_them(tmp_path, offline):
    items = load_task_items(write_gen_task(tmp_path / "tasks")).set_index("item_id")
    item = items.loc["tiny_gen/0"].to_dict()  # 3 + 5 = 8
    assert json.loads(item[GENERATION]) == {"until": ["\n", "Question:"], "max_gen_toks": 12}
    assert item["prompt"].endswith("Question: What is 3 + 5?\nAnswer:") and item["prompt"].count("Question:") == 3
    assert qualified("lm-eval", item[SCORING]) == "lm-eval:exact_match,strict-match"  # the task's first pair
    strict, flexible = ("exact_match", "strict-match"), ("exact_match", "flexible-extract")
    # strict-match takes a two-digit answer only; flexible-extract the first number anywhere
    assert [judge(" 8", item, c) for c in (strict, flexible)] == [0.0, 1.0]
    assert [judge(" 9", item, c) for c in (strict, flexible)] == [0.0, 0.0]
    assert [judge("It is 8.", item, c) for c in (strict, flexible)] == [0.0, 1.0]
    twelve = items.loc["tiny_gen/1"].to_dict()  # 10 + 16 = 26
    assert [judge(" 26", twelve, c) for c in (strict, flexible)] == [1.0, 1.0]
    with pytest.raises(InputError, match="reports exact_match,strict-match, exact_match,flexible-extract"):
        judge(" 8", item, ("exact_match", "other"))


def _lm_eval_scores(yaml: str, name: str, answers: list[str]) -> dict:
    """lm-eval's own path for each answer to every doc: its filters (``apply_filters``), then ``process_results``."""
    from pathlib import Path

    from lm_eval.tasks import TaskManager

    task = TaskManager(include_path=str(Path(yaml).parent), include_defaults=False).load([name])["tasks"][name]
    task.set_fewshot_seed(seed=1234)
    task.build_all_requests(limit=None, rank=0, world_size=1)
    out = {}
    for answer in answers:
        for instance in task.instances:
            instance.resps, instance.filtered_resps = [answer], {}
        task.apply_filters()
        for instance in task.instances:
            for ensemble in task._filters:
                result = task.process_results(instance.doc, [instance.filtered_resps[ensemble.name]])
                out[(answer, f"{name}/{instance.doc_id}", ensemble.name)] = float(result["exact_match"])
    return out


ANSWERS = [" 8", "8", " 26", "26\n", " It is 26.", "The answer: 44", " 62 or 63", "", " A", " a", "Paris", " paris!"]


@pytest.mark.parametrize("variant", ["filters", "several golds", "choices"])
def test_the_lm_eval_scorer_agrees_with_lm_evals_own_process_results(tmp_path, offline, variant):
    """A second method: for a dozen answers to every doc, the scorer equals lm-eval's apply_filters +
    process_results on the task itself — two filter pipelines; a task with several golds (multiple_target: any
    gold counts); a generation task with doc_to_choice (the gold is a choice's text) and no filter_list."""
    folder = tmp_path / "tasks"
    yaml = write_gen_task(folder, n_docs=4, num_fewshot=0, filters=variant != "choices")  # else lm-eval's take_first
    name = "tiny_gen"
    if variant == "several golds":
        name, yaml = "tiny_golds", _variant(folder, "tiny_golds", ('doc_to_target: "{{answer}}"',
                                                                   'doc_to_target: "{{[answer, \'Paris\']}}"'))
    elif variant == "choices":
        name, yaml = "tiny_choice", _variant(folder, "tiny_choice", ('doc_to_target: "{{answer}}"',
                                                                    "doc_to_target: 1\ndoc_to_choice: ['a', 'paris']"))
    items = {row["item_id"]: row for row in load_task_items(yaml).to_dict("records")}
    theirs = _lm_eval_scores(yaml, name, ANSWERS)
    ours = {(answer, item_id, filt): judge(answer, items[item_id], ("exact_match", filt))
            for answer, item_id, filt in theirs}
    assert ours == theirs
    assert 0 < sum(theirs.values()) < len(theirs)  # some answers right and some wrong: the check can fail


def _variant(folder, name: str, replace: tuple[str, str], extra: str = "") -> str:
    text = (folder / "tiny_gen.yaml").read_text().replace("task: tiny_gen", f"task: {name}")
    assert replace[0] in text
    path = folder / "variants" / f"{name}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace(*replace) + extra)
    return str(path)


def test_tasks_certeval_cannot_score_as_lm_eval_does_exit_2_in_one_line(tmp_path, offline, capsys):
    write_gen_task(tmp_path / "tasks")
    folder = tmp_path / "tasks"
    (folder / "variants").mkdir()
    (folder / "variants" / "hooks.py").write_text("def mine(references, predictions, **kw):\n    return 1.0\n")
    cases = [
        (_variant(folder, "sampled", ("do_sample: false", "do_sample: true\n  temperature: 0.7")), "samples its answers"),
        (_variant(folder, "bleu", ("- metric: exact_match", "- metric: bleu")), "metric 'bleu' is not one certeval"),
        (_variant(folder, "own_metric", ("- metric: exact_match", "- metric: !function hooks.mine")),
         "its own metric function"),
    ]
    for path, message in cases:
        rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", path, "--goal", "halfwidth:0.1",
                   "--output", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", str(folder / "tiny_gen.yaml"),
               "--scorer", "lm-eval:exact_match,nowhere", "--goal", "halfwidth:0.1", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "'lm-eval:exact_match,nowhere'" in err and "strict-match" in err, err
    assert not (tmp_path / "out").exists()


HF_RUNNER = textwrap.dedent("""
    import json, sys
    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks, model_dir = sys.argv[1], sys.argv[2]
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32", device="cpu",
                                      batch_size=1, tasks=["tiny_gen"], log_samples=True,
                                      task_manager=TaskManager(include_path=tasks, include_defaults=False))
    print(json.dumps([[s["filter"], f"tiny_gen/{s['doc_id']}", s["exact_match"], s["resps"][0][0],
                       s["filtered_resps"][0]] for s in results["samples"]["tiny_gen"]]))
""")


def _rounds(folder):
    import pandas as pd

    return pd.concat(pd.read_parquet(p) for p in sorted((folder / "rounds").glob("*.parquet")))


@pytest.mark.slow
def test_smollm2_generates_and_scores_each_item_as_lm_eval_does_per_filter_and_stops_early(
        infra, kept_actors, tmp_path, offline, capsys):
    from certeval.inputs.smollm import ensure_converted

    yaml = write_gen_task(tmp_path / "tasks")
    done = subprocess.run([sys.executable, "-c", HF_RUNNER, str(tmp_path / "tasks"), str(ensure_converted())],
                          check=True, timeout=600, env={**os.environ}, capture_output=True, text=True)
    samples = json.loads(done.stdout.strip().splitlines()[-1])
    lm_eval_scores = {f: {item: s for g, item, s, _, _ in samples if g == f} for f in FILTERS}
    answers = {item: text for _, item, _, text, _ in samples}
    kept = {f: {item: str(text) for g, item, _, _, text in samples if g == f} for f in FILTERS}
    # the two filters disagree on some item, so the comparison below shows which filter ran
    assert lm_eval_scores["strict-match"] != lm_eval_scores["flexible-extract"]
    assert 0 < sum(lm_eval_scores["flexible-extract"].values()) < 12
    runs = tmp_path / "runs"
    common = ["--model", "hf:bundled:smollm2", "--tasks", yaml, "--output", str(runs), "--ray-address", infra]
    # strict-match by default (the task's first filter), then by name; the default run's actor is kept for the
    # early run below, whose items its score cache answers
    for filt, scorer in (("strict-match", []), ("flexible-extract", ["--scorer", "lm-eval:exact_match,flexible-extract"])):
        if scorer:
            kept_actors()  # another scorer, another actor: the kept one's CPUs back first
        rc = main(["certify", *common, *scorer, "--goal", "halfwidth:0.0001", "--batch-size", "5", "--run-id", filt,
                   "--log_samples", *([] if scorer else ["--keep-actors"])])
        out = capsys.readouterr()
        assert rc in (0, 1), out.err
        frame = _rounds(runs / filt)
        assert dict(zip(frame["item_id"], frame["score"])) == lm_eval_scores[filt], filt
        assert dict(zip(frame["item_id"], frame["output"])) == answers  # the same generated text, uncut
        stored = json.loads((runs / filt / "results.json").read_text())
        block = next(iter(stored["lm_eval"].values()))["results"]["tiny_gen"]
        assert f"exact_match,{filt}" in block and f"exact_match_ci_upper,{filt}" in block
        # the other filter from the same answers, with its own interval
        other = next(f for f in FILTERS if f != filt)
        entry = stored["models"][0]["metrics"][f"exact_match,{other}"]
        assert block[f"exact_match,{other}"] == entry["mean"] and block[f"exact_match_ci_lower,{other}"] == entry["lower"]
        assert entry["mean"] == pytest.approx(sum(lm_eval_scores[other].values()) / 12)  # all 12 scored
        lines = [json.loads(text) for text in
                 next((runs / filt / "samples").rglob("samples_*.jsonl")).read_text().splitlines()]
        # a line per item and filter, as lm-eval writes them: filtered_resps the answer after that filter, and
        # exact_match judged after it
        for f in FILTERS:
            mine = [line for line in lines if line["filter"] == f]
            assert {line["item_id"]: line["filtered_resps"][0] for line in mine} == kept[f], f
            assert {line["item_id"]: line["exact_match"] for line in mine} == lm_eval_scores[f], f
        line = lines[0]
        assert line["filter"] == filt
        assert line["arguments"]["gen_args_0"]["arg_1"] == {"until": ["\n", "Question:"], "max_gen_toks": 12}
        assert set(line["doc"]) == {"a", "b", "answer"} and line["target"] == line["doc"]["answer"]
        if not scorer:
            rc = main(["certify", *common, "--goal", "halfwidth:0.45", "--batch-size", "3", "--run-id", "early",
                       "--json", "--keep-actors"])
            out = capsys.readouterr()
            assert rc == 0, out.err
            res = json.loads(out.out)
            assert res["reached"] and res["models"][0]["n_scored"] < 12
            assert res["models"][0]["items_sent_to_model"] == 0
