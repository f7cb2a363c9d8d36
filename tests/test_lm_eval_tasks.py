"""``--tasks task.yaml``: an lm-eval task built by lm-eval's own machinery is a bank whose items are exactly the
requests lm-eval sends (checked against the samples file of a real lm-eval run of the same task, few-shot
included); bad task files exit 2 in one line before anything is written. Offline: a local task over local JSONL."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap

import pytest

from certeval.cli import main
from certeval.errors import InputError
from certeval.harnesses.lm_eval_tasks import load_task_items
from certeval.harnesses.readers import read_lm_eval_items

from lm_eval_support import write_mc_task

pytest.importorskip("lm_eval")

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}

# lm-eval's CLI path (simple_evaluate, then its tracker writes the samples file) with the dummy model
RUNNER = textwrap.dedent("""
    import sys
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    tasks, output_path = sys.argv[1], sys.argv[2]
    tracker = EvaluationTracker(output_path=output_path)
    results = lm_eval.simple_evaluate(model="dummy", tasks=["tiny_mc"], log_samples=True,
                                      task_manager=TaskManager(include_path=tasks, include_defaults=False),
                                      evaluation_tracker=tracker)
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name="tiny_mc", samples=samples["tiny_mc"])
""")


def _task(folder, num_fewshot: int = 2) -> str:
    """A 12-doc multiple-choice task over a local JSONL file, with few-shot examples from its own split."""
    return write_mc_task(folder, n_docs=12, num_fewshot=num_fewshot, gold_cycles=True, metrics=("acc", "acc_norm"))


@pytest.fixture()
def offline(tmp_path, monkeypatch):
    for key, value in {**OFFLINE, "HF_DATASETS_CACHE": str(tmp_path / "hf")}.items():
        monkeypatch.setenv(key, value)


def test_the_task_bank_holds_the_requests_lm_eval_itself_sends(tmp_path, offline):
    yaml = _task(tmp_path / "tasks")
    out = tmp_path / "lm"
    subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / "tasks"), str(out)], check=True, timeout=600,
                   env={**os.environ}, capture_output=True)
    samples = sorted(out.rglob("samples_tiny_mc_*.jsonl"))
    assert len(samples) == 1
    recorded = read_lm_eval_items(str(samples[0])).set_index("item_id")
    built = load_task_items(yaml).set_index("item_id")
    assert list(built.index) == [f"tiny_mc/{i}" for i in range(12)] and set(built.index) == set(recorded.index)
    for item_id, row in built.iterrows():  # the exact context (few-shot examples and all), choices and gold
        other = recorded.loc[item_id]
        assert row["prompt"] == other["prompt"] and list(row["choices"]) == list(other["choices"])
        assert row["answer"] == other["answer"]
    assert built["prompt"].str.count("Question:").eq(3).all()  # two few-shot examples, then the question


def test_a_task_yaml_is_a_bank_for_a_run_and_bad_ones_exit_2_in_one_line(tmp_path, offline, capsys):
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan

    yaml = _task(tmp_path / "tasks", num_fewshot=0)
    plan, prepared = make_plan(Certify(models=["hf:bundled:smollm2"], bank=yaml, goal="halfwidth:0.2",
                                           output=str(tmp_path / "runs")))
    assert prepared.bank.n_items == 12 and plan.scorer == "mc-loglik" and plan.task_name == "tiny_mc"
    assert "Generating" not in capsys.readouterr().err  # lm-eval's and datasets' progress kept off stderr
    (tmp_path / "tasks" / "nothing.yaml").write_text("description: no task here\n")
    (tmp_path / "tasks" / "broken.yaml").write_text("task: broken\ndataset_path: json\noutput_type: nothing\n")
    cases = [(str(tmp_path / "tasks" / "missing.yaml"), "does not exist"),
             (str(tmp_path / "tasks" / "nothing.yaml"), "defines no task or group"),
             (str(tmp_path / "tasks" / "broken.yaml"), "output_type 'nothing' is not one lm-eval knows")]
    for path, message in cases:
        rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", path, "--goal", "halfwidth:0.1",
                   "--output", str(tmp_path / "out")])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()
    with pytest.raises(InputError, match="does not exist"):
        load_task_items(str(tmp_path / "nowhere.yaml"))


def _group(folder, weight_by_size: bool) -> str:
    """Two multiple-choice tasks (12 and 6 docs) and a group over them with lm-eval's aggregation of acc."""
    write_mc_task(folder, n_docs=12, gold_cycles=True)
    write_mc_task(folder, n_docs=6, name="tiny_mc_b")
    path = folder / "tiny_group.yaml"
    path.write_text(textwrap.dedent(f"""\
        group: tiny_group
        task:
          - tiny_mc
          - tiny_mc_b
        aggregate_metric_list:
          - metric: acc
            weight_by_size: {str(weight_by_size).lower()}
        """))
    return str(path)


@pytest.mark.parametrize("weight_by_size, aggregate", [(True, "mean"), (False, None)])
def test_task_names_include_path_and_groups_are_banks_with_lm_evals_aggregation(tmp_path, offline, weight_by_size,
                                                                                 aggregate):
    """``--tasks NAME --include_path DIR`` (lm-eval's own form) and a group YAML: the group's leaf tasks are the
    sub-datasets, and the estimand follows the group's weight_by_size unless --aggregate names another."""
    from certeval.cli.pipeline import plan_from_args
    from certeval.requests import Certify
    from certeval.runs.plan import make_plan

    folder = tmp_path / "tasks"
    group_yaml = _group(folder, weight_by_size)
    for source in (group_yaml, "tiny_group"):
        args = argparse.Namespace(command="certify", models=["hf:bundled:smollm2"], bank=source,
                                  include_path=None if source.endswith(".yaml") else str(folder),
                                  output=str(tmp_path / "runs"), run_id=None, goal="halfwidth:0.2", method=None,
                                  confidence=0.95, batch_size=8, max_items=None, seed=0, scorer=None, ray_address=None,
                                  replicas=1, num_gpus=0, in_flight=1, num_cpus=None, aggregate=None, history=None)
        plan, prepared = plan_from_args(args)
        bank = prepared.bank
        assert bank.n_items == 18 and set(bank.subset_names) == {"tiny_mc", "tiny_mc_b"}
        assert bank.item_ids[0] == "tiny_mc/0" and "tiny_mc_b/5" in bank.item_ids
        assert plan.aggregate == aggregate and plan.scorer == "mc-loglik"
    assert plan.bank.startswith("lm-eval:tiny_group?include_path=") and plan.task_name == "tiny_group"
    chosen, _ = make_plan(Certify(models=["hf:bundled:smollm2"], bank=group_yaml,
                                      goal="halfwidth:0.2", aggregate="subset-mean" if aggregate else "mean",
                                      output=str(tmp_path / "runs")))
    assert chosen.aggregate == (None if aggregate else "mean")  # the user's choice stands


@pytest.mark.slow
def test_unknown_task_names_and_a_stray_include_path_exit_2_in_one_line(tmp_path, offline, capsys):
    folder = tmp_path / "tasks"
    write_mc_task(folder)
    cases = [(["--tasks", "tiny_nope", "--include_path", str(folder)], "lm-eval knows no task or group 'tiny_nope'"),
             (["--tasks", "tiny_mc", "--include_path", str(tmp_path / "nowhere")], "is not a folder"),
             (["--bank", "bundled:trivia", "--include_path", str(folder)], "applies to lm-eval task names"),
             (["--include_path", str(folder)], "needs --tasks NAME")]
    for extra, message in cases:
        rc = main(["certify", "--model", "hf:bundled:smollm2", "--goal", "halfwidth:0.1",
                   "--output", str(tmp_path / "out"), *extra])
        err = capsys.readouterr().err.strip()
        assert rc == 2 and message in err and len(err.splitlines()) == 1, (extra, err)
    assert not (tmp_path / "out").exists()


HF_RUNNER = textwrap.dedent("""
    import json, sys
    import lm_eval
    from lm_eval.tasks import TaskManager

    from lm_eval.loggers import EvaluationTracker

    tasks, model_dir, output_path = sys.argv[1], sys.argv[2], sys.argv[3]
    tracker = EvaluationTracker(output_path=output_path)
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32", device="cpu",
                                      batch_size=4, tasks=["tiny_mc"], log_samples=True, evaluation_tracker=tracker,
                                      task_manager=TaskManager(include_path=tasks, include_defaults=False))
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    tracker.save_results_samples(task_name="tiny_mc", samples=samples["tiny_mc"])
    print(json.dumps({f"tiny_mc/{s['doc_id']}": [s["acc"], s["acc_norm"]] for s in samples["tiny_mc"]}))
""")


def _scores(folder) -> dict[str, float]:
    import pandas as pd

    frame = pd.concat(pd.read_parquet(p) for p in sorted((folder / "rounds").glob("*.parquet")))
    return dict(zip(frame["item_id"], frame["score"]))


@pytest.mark.slow
def test_smollm2_scores_each_item_of_a_task_as_lm_eval_does_and_stops_early_when_the_goal_allows(
        infra, kept_actors, tmp_path, offline, capsys):
    from certeval.inputs.smollm import ensure_converted

    yaml = _task(tmp_path / "tasks")
    done = subprocess.run([sys.executable, "-c", HF_RUNNER, str(tmp_path / "tasks"), str(ensure_converted()),
                           str(tmp_path / "lm")], check=True, timeout=600, env={**os.environ}, capture_output=True,
                          text=True)
    lm_eval_scores = json.loads(done.stdout.strip().splitlines()[-1])
    samples = next((tmp_path / "lm").rglob("samples_tiny_mc_*.jsonl"))
    runs = tmp_path / "runs"
    # the task YAML, and lm-eval's own samples file of that run as a bank (an import once scored SmolLM2 0 of 10
    # on such a file by free generation), both give lm-eval's per-item acc / acc_norm. The mc-loglik-norm run's
    # actor is its own, first; the mc-loglik runs then share one kept actor with the early run and with the next
    # test's runs (the module's kept_actors kills it after the module)
    for source, scorer, column in (("--tasks", "mc-loglik-norm", 1), ("--tasks", "mc-loglik", 0),
                                   ("--bank", "mc-loglik", 0)):
        run_id = f"{source[2:]}-{scorer}"
        keep = ["--keep-actors"] if scorer == "mc-loglik" else []
        rc = main(["certify", "--model", "hf:bundled:smollm2", source, yaml if source == "--tasks" else str(samples),
                   "--scorer", scorer, "--goal", "halfwidth:0.0001", "--batch-size", "12", "--output", str(runs),
                   "--run-id", run_id, "--log_samples", "--ray-address", infra, *keep])
        out = capsys.readouterr()
        assert rc in (0, 1), out.err
        ours = _scores(runs / run_id)
        assert ours == {item: pair[column] for item, pair in lm_eval_scores.items()}, (run_id, ours, lm_eval_scores)
        if not keep:
            kept_actors()  # the mc-loglik-norm actor's CPUs back before the kept one asks for its share
    _early_run(yaml, runs, infra, capsys)  # the task's own scorer (mc-loglik) on the kept actor
    # the task run's samples as lm-eval's own: the same doc, target, requests and hashes, (loglik, is_greedy) per
    # choice, and acc and acc_norm both (one run, one set of log-likelihoods)
    theirs = {line["doc_id"]: line for line in map(json.loads, samples.read_text().splitlines())}
    mine = next((runs / "tasks-mc-loglik" / "samples").rglob("samples_tiny_mc_*.jsonl"))
    for line in map(json.loads, mine.read_text().splitlines()):
        other = theirs[line["doc_id"]]
        for key in ("doc", "target", "arguments", "filter", "metrics", "doc_hash", "prompt_hash", "target_hash", "acc",
                    "acc_norm"):
            assert line[key] == other[key], (key, line[key], other[key])
        assert [g for _, g in line["filtered_resps"]] == [g for _, g in other["filtered_resps"]]
        assert [float(ll) for ll, _ in line["filtered_resps"]] == pytest.approx(
            [float(ll) for ll, _ in other["filtered_resps"]], abs=1e-3)
    # a task YAML named by a run folder is never built (its hooks are code): rescore refuses in one line
    assert main(["rescore", str(runs / "early"), "--scorer", "exact", "--output", str(tmp_path / "re")]) == 2
    err = capsys.readouterr().err.strip()
    assert "was built from the lm-eval task" in err and len(err.splitlines()) == 1 and not (tmp_path / "re").exists()


def _early_run(yaml: str, runs, infra: str, capsys) -> None:
    """The task's own scorer (acc: mc-loglik) at a wide goal stops before the 12 items."""
    rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", yaml, "--goal", "halfwidth:0.4",
               "--batch-size", "3", "--output", str(runs), "--run-id", "early", "--json", "--ray-address", infra,
               "--keep-actors"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    res = json.loads(out.out)
    assert res["reached"] and res["models"][0]["n_scored"] < 12 and res["task"] == "tiny_mc"


def _table_rows(table: str) -> list[list[str]]:
    """lm-eval's make_table (Markdown) as rows of cells."""
    lines = [line for line in table.splitlines() if line.startswith("|")][2:]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines]


@pytest.mark.slow
def test_make_table_of_a_3_shot_task_run_shows_its_shots_version_and_each_metric_with_its_certified_interval(
        infra, kept_actors, tmp_path, offline, capsys):
    """One ``--tasks`` run of a 3-shot task of version 1.0 listing acc and acc_norm: lm-eval's own table shows
    n-shot 3, the version, both metrics (acc_norm read off the same log-likelihoods, no second run) each with its
    certified interval, and says that ± is the stderr; the samples hold lm-eval's fields (the dataset row, the
    gold's index as text, (loglik, is_greedy) per choice)."""
    from lm_eval.utils import make_table

    yaml = write_mc_task(tmp_path / "tasks", n_docs=12, num_fewshot=3, gold_cycles=True, metrics=("acc", "acc_norm"),
                         version="1.0")
    runs = tmp_path / "runs"
    rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", yaml, "--goal", "halfwidth:0.4",
               "--batch-size", "4", "--output", str(runs), "--run-id", "table", "--log_samples", "--ray-address", infra,
               "--keep-actors"])
    first = capsys.readouterr()
    assert rc == 0, first.err
    stored = json.loads((runs / "table" / "results.json").read_text())
    entry = stored["models"][0]
    other = entry["metrics"]["acc_norm,none"]
    assert entry["metric"] == "acc,none" and other["anytime_valid"] and "same draws" in other["interval"]
    assert other["lower"] <= other["mean"] <= other["upper"] and other["n_scored"] == entry["n_scored"]
    block = stored["lm_eval"][entry["model"]]
    assert block["n-shot"] == {"tiny_mc": 3} and block["versions"] == {"tiny_mc": 1.0}
    assert block["configs"]["tiny_mc"]["output_type"] == "multiple_choice"
    assert block["configs"]["tiny_mc"]["num_fewshot"] == 3
    rows = _table_rows(make_table(block))
    assert rows[0][0].startswith("tiny_mc (± is the stderr; certified 95% interval")
    assert rows[0][1] == "1" and {row[3] for row in rows} == {"3"}  # 1.0 as lm-eval's table prints it
    assert entry["n_scored"] < 12 and entry["upper"] - entry["lower"] > 0  # stopped early: a real interval
    cells = {row[4]: row[6] for row in rows}
    assert cells["acc"] == f"{entry['mean']:.4f}" and cells["acc_norm"] == f"{other['mean']:.4f}"
    assert cells["acc_ci_lower"] == f"{entry['lower']:.4f}" and cells["acc_ci_upper"] == f"{entry['upper']:.4f}"
    assert cells["acc_norm_ci_lower"] == f"{other['lower']:.4f}"
    assert cells["acc_norm_ci_upper"] == f"{other['upper']:.4f}"
    samples = next((runs / "table" / "samples").rglob("samples_tiny_mc_*.jsonl"))
    lines = [json.loads(line) for line in samples.read_text().splitlines()]
    assert len(lines) == entry["n_scored"]
    for line in lines:
        doc = line["doc"]
        assert set(doc) == {"question", "choices", "label"} and line["target"] == str(doc["label"])
        assert line["metrics"] == ["acc", "acc_norm"] and line["filter"] == "none"
        assert len(line["arguments"]) == 3 and line["arguments"]["gen_args_1"]["arg_1"] == " " + doc["choices"][1]
        lls = [float(ll) for ll, greedy in line["filtered_resps"]]
        assert all(greedy in ("True", "False") for _, greedy in line["filtered_resps"])
        assert line["resps"] == [[pair] for pair in line["filtered_resps"]]
        best = max(range(3), key=lambda i: lls[i] / len(doc["choices"][i]))
        assert line["acc_norm"] == float(best == doc["label"])
        assert line["acc"] == float(max(range(3), key=lambda i: lls[i]) == doc["label"])
    # the same run again under the same --output: every item answered from the score cache, which kept the
    # log-likelihoods, so acc_norm is still there, the same
    rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", yaml, "--goal", "halfwidth:0.4",
               "--batch-size", "4", "--output", str(runs), "--run-id", "again", "--json", "--ray-address", infra,
               "--keep-actors"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    again = json.loads(out.out)["models"][0]
    assert again["items_sent_to_model"] == 0
    assert again["metrics"]["acc_norm,none"]["upper"] == other["upper"]


@pytest.mark.parametrize("docs, target, message", [
    ([{"q": "2 + 1?", "c": ["3", "5", "6"], "label": 0}, {"q": "2 + 2?", "c": ["4", "5", "6"], "label": 3}], "label",
     "target 3 is no index among its 3 choices"),
    ([{"q": "Capital of France?", "c": ["Paris", "Rome"], "a": "Berlin"}], "a", "target 'Berlin' is none of its 2"),
    ([{"q": "Capital of France?", "c": ["Paris"], "label": 0}], "label", "needs at least 2 choices, got 1"),
    ([{"q": "Even?", "c": ["2", "3"], "label": [0]}, {"q": "Odd?", "c": ["2", "3"], "label": 1}], "label",
     "target 1 is not a list of golds"),
])
def test_a_gold_lm_eval_cannot_resolve_or_one_choice_exits_2_before_start_up(tmp_path, offline, capsys, monkeypatch,
                                                                            docs, target, message):
    """lm-eval's gold rule (certeval.scoring.lm_eval_gold) applied while the bank is built: one line, exit 2, before Ray or
    Prefect start, nothing written (the working folder stays empty)."""
    from lm_eval_conformance_support import Shape

    yaml = Shape("bad_gold", docs, {"doc_to_text": "Question: {{q}}\nAnswer:", "doc_to_choice": "c",
                                    "doc_to_target": target}).write(tmp_path / "tasks")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", str(yaml), "--goal", "halfwidth:0.1",
               "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and len(err.splitlines()) == 1, err
    assert "doc 0" in err or "doc 1" in err
    assert not (tmp_path / "out").exists() and list(work.iterdir()) == []
