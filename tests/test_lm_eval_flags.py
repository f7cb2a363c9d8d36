"""lm-eval's run flags on ``certify --tasks`` mean what they mean in lm-eval 0.4.13, checked against lm-eval itself:
``--apply_chat_template``, ``--system_instruction``, ``--fewshot_as_multiturn``, ``--gen_kwargs`` (the requests lm-eval
builds, and with the chat template the generated answers and scores of ``lm_eval --model hf`` on SmolLM2-Instruct),
a fractional ``--limit`` (lm-eval's count of docs), ``--batch_size auto`` / ``--device cpu`` (accepted, the answers
unchanged), ``--tasks list`` (lm-eval's own table, nothing started) and the metric names lm-eval computes.
Offline: local JSONL tasks (tests/lm_eval_support.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lm_eval_support import write_gen_task, write_mc_task

pytest.importorskip("lm_eval")

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
SYSTEM = "Answer with the number only."


@pytest.fixture()
def offline(tmp_path, monkeypatch):
    for key, value in {**OFFLINE, "HF_DATASETS_CACHE": str(tmp_path / "hf")}.items():
        monkeypatch.setenv(key, value)


def _lm_eval_task(yaml: str):
    from lm_eval.tasks import TaskManager

    name = Path(yaml).stem
    task = TaskManager(include_path=str(Path(yaml).parent), include_defaults=False).load([name])["tasks"][name]
    task.set_fewshot_seed(seed=1234)
    return task


def test_system_instruction_and_gen_kwargs_build_lm_evals_own_requests(tmp_path, offline):
    """Without a chat template: lm-eval's build_all_requests with the system instruction (put before the few-shot
    examples) and simple_evaluate's gen_kwargs update give exactly certeval's items; a control without the flags
    differs."""
    from certeval.harnesses.lm_eval_requests import RequestOptions, parse_gen_kwargs
    from certeval.harnesses.lm_eval_tasks import load_task_items, tasks_bank
    from certeval.scoring.lm_eval_generation import GENERATION

    yaml = write_gen_task(tmp_path / "tasks")
    gen_kwargs = parse_gen_kwargs(["max_gen_toks=5,until=['\\n\\n']"])
    location = tasks_bank(yaml, None, None, RequestOptions(system_instruction=SYSTEM, gen_kwargs=gen_kwargs))
    items = load_task_items(location).set_index("item_id")
    task = _lm_eval_task(yaml)
    task.set_config(key="generation_kwargs", value={"max_gen_toks": 5, "until": ["\n\n"]}, update=True)
    task.build_all_requests(limit=None, rank=0, world_size=1, system_instruction=SYSTEM)
    theirs = {f"tiny_gen/{i.doc_id}": i.arguments for i in task.instances}
    assert {k: items.loc[k, "prompt"] for k in theirs} == {k: a[0] for k, a in theirs.items()}
    assert all(json.loads(items.loc[k, GENERATION]) == {"until": a[1]["until"], "max_gen_toks": a[1]["max_gen_toks"]}
               for k, a in theirs.items())
    assert items["prompt"].str.startswith(SYSTEM).all()
    plain = load_task_items(yaml).set_index("item_id")  # the control: the task's own requests
    assert not any(plain.loc[k, "prompt"] == a[0] for k, a in theirs.items())
    assert json.loads(plain.iloc[0][GENERATION])["max_gen_toks"] == 12


@pytest.mark.parametrize("multiturn, system", [(True, SYSTEM), (False, None)])
def test_chat_template_requests_equal_those_lm_evals_hf_model_renders(tmp_path, offline, multiturn, system):
    """With a chat template, on SmolLM2-Instruct's tokenizer: lm-eval's build_all_requests given lm-eval's own
    ``HFLM.apply_chat_template`` (bound to the tokenizer alone: no weights) builds exactly certeval's prompts, the
    few-shot examples as chat turns or (``--fewshot_as_multiturn false``) in one user turn."""
    from types import SimpleNamespace

    from lm_eval.models.huggingface import HFLM
    from transformers import AutoTokenizer

    from certeval.harnesses.lm_eval_requests import RequestOptions
    from certeval.harnesses.lm_eval_tasks import load_task_items, tasks_bank
    from certeval.inputs.smollm import ensure_converted

    folder = str(ensure_converted())
    yaml = write_gen_task(tmp_path / "tasks", n_docs=4)
    options = RequestOptions(chat_template="true", tokenizer=folder, system_instruction=system,
                             fewshot_as_multiturn=multiturn)
    items = load_task_items(tasks_bank(yaml, None, None, options)).set_index("item_id")
    lm = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(folder), chat_template_args={})
    task = _lm_eval_task(yaml)
    task.build_all_requests(limit=None, rank=0, world_size=1, system_instruction=system, apply_chat_template=True,
                            fewshot_as_multiturn=multiturn,
                            chat_template=lambda history, add_generation_prompt=True: HFLM.apply_chat_template(
                                lm, history, add_generation_prompt))
    theirs = {f"tiny_gen/{i.doc_id}": i.arguments[0] for i in task.instances}
    assert {k: items.loc[k, "prompt"] for k in theirs} == theirs
    assert all(p.count("<|im_start|>user") == (3 if multiturn else 1) for p in theirs.values())


def test_the_flags_are_recorded_as_lm_evals_results_file_records_them(offline):
    """The lm-eval results block certeval writes records the flags where and as lm-eval 0.4.13's command line does:
    its ``GeneralConfigTracker`` fields (the template lm-eval's ``TemplateLM.chat_template`` picks, the system
    instruction, their sha256, ``fewshot_as_multiturn``) and ``config.gen_kwargs`` as ``EvaluatorConfig.from_cli``
    parses ``--gen_kwargs``; without flags, what lm-eval records without them."""
    from dataclasses import asdict
    from types import SimpleNamespace

    from lm_eval._cli.harness import HarnessCLI
    from lm_eval.api.model import TemplateLM
    from lm_eval.config.evaluate_config import EvaluatorConfig
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker
    from transformers import AutoTokenizer

    from certeval.harnesses.lm_eval_output import LmEvalRun, lm_eval_block
    from certeval.harnesses.lm_eval_requests import RequestOptions, parse_gen_kwargs
    from certeval.inputs.smollm import ensure_converted

    folder = str(ensure_converted())
    block = {"acc,none": 0.5, "items_scored,none": 2, "items_total,none": 4}
    fields = ("system_instruction", "system_instruction_sha", "fewshot_as_multiturn", "chat_template",
              "chat_template_sha")
    gen = "max_gen_toks=8,until=['\\n\\n']"
    lm = SimpleNamespace(tokenizer=AutoTokenizer.from_pretrained(folder))  # loaded once for the three cases
    for flags, options in (
            ([], RequestOptions()),
            (["--apply_chat_template", "--system_instruction", SYSTEM, "--gen_kwargs", gen],
             RequestOptions(chat_template="true", tokenizer=folder, system_instruction=SYSTEM,
                            fewshot_as_multiturn=True, gen_kwargs=parse_gen_kwargs([gen]))),
            (["--apply_chat_template", "--fewshot_as_multiturn", "false"],
             RequestOptions(chat_template="true", tokenizer=folder, fewshot_as_multiturn=False))):
        cfg = EvaluatorConfig.from_cli(HarnessCLI()._parser.parse_args(["run", "--model", "hf", "--tasks", "t",
                                                                        *flags]))
        tracker = GeneralConfigTracker()
        tracker.log_experiment_args(model_source="hf", model_args="", system_instruction=cfg.system_instruction,
                                    chat_template=TemplateLM.chat_template(lm, cfg.apply_chat_template)
                                    if cfg.apply_chat_template else None,
                                    fewshot_as_multiturn=cfg.fewshot_as_multiturn)
        theirs = asdict(tracker)
        mine = lm_eval_block(LmEvalRun("t", batch_size=1, limit=None, seed=0, requests=options), "m", f"hf:{folder}",
                             block)
        assert {k: mine[k] for k in fields} == {k: theirs[k] for k in fields}, flags
        assert mine["config"]["gen_kwargs"] == cfg.gen_kwargs, flags
    assert theirs["chat_template_sha"] and mine["config"]["gen_kwargs"] == {}  # the control: flags change the record
    assert mine["fewshot_as_multiturn"] is False and mine["system_instruction_sha"] is None


def test_batch_size_and_device_are_the_hf_hosts_options(tmp_path, offline):
    """--batch_size N caps an hf host's rows per forward pass (its batch option), auto keeps the host's own;
    --device cpu is its device option."""
    from certeval.cli import build_parser
    from certeval.cli.pipeline import plan_from_args

    yaml = write_mc_task(tmp_path / "tasks", n_docs=4)
    common = ["certify", "--model", "hf:bundled:smollm2", "--tasks", yaml, "--goal", "halfwidth:0.1", "--device", "cpu"]
    for batch, query in (("4", "?batch=4&device=cpu"), ("auto", "?device=cpu"), ("auto:3", "?device=cpu")):
        plan, _ = plan_from_args(build_parser().parse_args([*common, "--batch_size", batch]))
        assert plan.models == (f"hf:bundled:smollm2{query}",), batch


def test_a_fractional_limit_is_as_many_items_as_lm_eval_scores(tmp_path, offline):
    """--limit 0.25 on a 10-doc and a 7-doc task: lm-eval scores ceil(n × 0.25) docs of each (get_sample_size);
    certeval's budget is their sum, drawn across both tasks."""
    from lm_eval.evaluator_utils import get_sample_size

    from certeval.cli import build_parser
    from certeval.cli.pipeline import plan_from_args

    folder = tmp_path / "tasks"
    write_mc_task(folder, n_docs=10)
    write_mc_task(folder, n_docs=7, name="tiny_mc_b")
    (folder / "both.yaml").write_text("group: both\ntask:\n  - tiny_mc\n  - tiny_mc_b\n")
    want = sum(get_sample_size(_lm_eval_task(str(folder / f"{n}.yaml")), 0.25) for n in ("tiny_mc", "tiny_mc_b"))
    args = build_parser().parse_args(["certify", "--model", "hf:bundled:smollm2", "--tasks", str(folder / "both.yaml"),
                                      "--goal", "halfwidth:0.1", "--limit", "0.25", "--output", str(tmp_path / "o")])
    plan, _ = plan_from_args(args)
    assert want == 3 + 2 and plan.max_items == want
    assert not (tmp_path / "o").exists()


def test_the_metric_names_are_those_lm_eval_computes(tmp_path, offline):
    """lm-eval's own process_results, given a multiple-choice task listing every name certeval accepts for it,
    returns each of them (and nothing else)."""
    from certeval.harnesses.lm_eval_metric_names import COMPUTED

    names = COMPUTED["multiple_choice"]
    entries = "".join(f"  - metric: {m}\n    aggregation: mean\n" for m in names)
    yaml = write_mc_task(tmp_path / "tasks", n_docs=3)
    text = Path(yaml).read_text().replace("metric_list:\n  - metric: acc\n", "metric_list:\n" + entries)
    Path(yaml).write_text(text)
    task = _lm_eval_task(yaml)
    doc = next(iter(task.test_docs()))
    conditional, unconditional = [(-1.0, True), (-2.0, False), (-3.0, False)], [(-1.5, False)] * 3  # acc_mutual_info
    got = task.process_results(doc, conditional + unconditional)
    assert set(got) == set(COMPUTED["multiple_choice"])


def test_tasks_list_prints_lm_evals_table_and_starts_nothing(tmp_path, offline, monkeypatch, capsys):
    """--tasks list prints what `lm-eval ls tasks` prints, exit 0, before anything starts: no run folder, no
    .prefect, no process. lm-eval's ~14,000 built-in tasks take over a minute to index, so this test lists only the
    --include_path folder (lm-eval's TaskManager without its defaults): the same code path, a smaller index."""
    import lm_eval.tasks
    from surface_table_support import children, no_new_children

    from certeval.cli import main

    class FolderOnly(lm_eval.tasks.TaskManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{**kwargs, "include_defaults": False})

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", FolderOnly)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "tasks"
    write_mc_task(folder)
    write_gen_task(folder)
    procs = children()
    for what, kwargs in (("list", {}), ("list_subtasks", {"list_groups": False, "list_tags": False})):
        rc = main(["certify", "--tasks", what, "--include_path", str(folder), "--output", str(tmp_path / "out")])
        out = capsys.readouterr().out
        assert rc == 0
        assert out.strip() == FolderOnly(include_path=str(folder)).list_all_tasks(**kwargs).strip()
        assert "tiny_mc" in out and "generate_until" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tasks"]  # no run folder, no .prefect
    assert not no_new_children(procs)


LM_EVAL_CHAT = textwrap.dedent("""
    import json, sys
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    tasks, model_dir, system, output = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    tracker = EvaluationTracker(output_path=output)  # what lm-eval's command line writes its results file with
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32", device="cpu",
                                      batch_size=1, tasks=["tiny_gen"], log_samples=True, apply_chat_template=True,
                                      system_instruction=system, fewshot_as_multiturn=True,
                                      gen_kwargs="max_gen_toks=8", evaluation_tracker=tracker,
                                      task_manager=TaskManager(include_path=tasks, include_defaults=False))
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    print(json.dumps([[s["filter"], f"tiny_gen/{s['doc_id']}", s["exact_match"], s["resps"][0][0],
                       s["arguments"][0]] for s in samples["tiny_gen"]]))
""")


@pytest.mark.slow
def test_chat_template_requests_answers_and_scores_equal_lm_evals(infra, kept_actors, tmp_path, offline, capsys):
    """One `lm_eval --model hf --apply_chat_template --system_instruction ... --fewshot_as_multiturn --gen_kwargs
    max_gen_toks=8` run on SmolLM2-Instruct beside `certeval certify` with the same flags (and --batch_size auto,
    --device cpu, --limit 0.5): every item certeval scored has lm-eval's request (the chat-templated context, the
    generation settings), lm-eval's generated answer and lm-eval's exact_match under both filters; it scored as many
    items as lm-eval's --limit 0.5 would."""
    import pandas as pd

    from certeval.cli import main
    from certeval.inputs.smollm import ensure_converted

    yaml = write_gen_task(tmp_path / "tasks", n_docs=8)
    done = subprocess.run([sys.executable, "-c", LM_EVAL_CHAT, str(tmp_path / "tasks"), str(ensure_converted()),
                           SYSTEM, str(tmp_path / "lm-eval")], check=True, timeout=600, env={**os.environ}, capture_output=True, text=True)
    samples = json.loads(done.stdout.strip().splitlines()[-1])
    theirs = {(f, item): score for f, item, score, _, _ in samples}
    answers = {item: text for _, item, _, text, _ in samples}
    requests = {item: args for _, item, _, _, args in samples}
    assert all(context.startswith("<|im_start|>system\n" + SYSTEM) and context.count("<|im_start|>user") == 3
               for context, _ in requests.values())  # two few-shot turns and the question, after the system turn
    runs = tmp_path / "runs"
    rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", yaml, "--apply_chat_template",
               "--system_instruction", SYSTEM, "--fewshot_as_multiturn", "--gen_kwargs", "max_gen_toks=8",
               "--batch_size", "auto", "--device", "cpu", "--limit", "0.5", "--scorer", "lm-eval:exact_match,flexible-extract",
               "--goal", "halfwidth:0.0001", "--batch-size", "2", "--output", str(runs), "--run-id", "chat",
               "--ray-address", infra, "--log_samples"])
    out = capsys.readouterr()
    assert rc == 1, out.err  # the goal is out of reach in 4 items: the budget stops it
    frame = pd.concat(pd.read_parquet(p) for p in sorted((runs / "chat" / "rounds").glob("*.parquet")))
    assert len(frame) == 4  # lm-eval's --limit 0.5 of 8 docs: ceil(4.0)
    assert dict(zip(frame["item_id"], frame["output"])) == {k: answers[k] for k in frame["item_id"]}
    assert dict(zip(frame["item_id"], frame["score"])) == {k: theirs[("flexible-extract", k)] for k in frame["item_id"]}
    stored = json.loads((runs / "chat" / "results.json").read_text())
    # the flags recorded where and as lm-eval's own results file records them (what `import lm-eval` tells runs by)
    [lm_eval_file] = (tmp_path / "lm-eval").rglob("results_*.json")
    recorded = json.loads(lm_eval_file.read_text())
    [mine] = stored["lm_eval"].values()
    fields = ("chat_template", "chat_template_sha", "system_instruction", "system_instruction_sha",
              "fewshot_as_multiturn")
    assert {k: mine[k] for k in fields} == {k: recorded[k] for k in fields} and recorded["chat_template_sha"]
    assert mine["config"]["gen_kwargs"] == recorded["config"]["gen_kwargs"] == {"max_gen_toks": 8}
    from certeval.harnesses.lm_eval_runs import SETTING_FIELDS, read_settings

    [my_file] = (runs / "chat" / "samples").rglob("results_*.json")  # --log_samples: certeval's lm-eval tree
    keys = (*SETTING_FIELDS, "gen_kwargs")
    told = {k: read_settings(str(my_file)).get(k) for k in keys}
    assert told == {k: read_settings(str(lm_eval_file)).get(k) for k in keys} and all(told.values())
    strict = stored["models"][0]["metrics"]["exact_match,strict-match"]
    assert strict["mean"] == pytest.approx(sum(theirs[("strict-match", k)] for k in frame["item_id"]) / 4)
    lines = [json.loads(t) for t in next((runs / "chat" / "samples").rglob("samples_*.jsonl")).read_text().splitlines()]
    for line in lines:
        mine, (context, settings) = line["arguments"]["gen_args_0"], requests[line["item_id"]]
        assert mine["arg_0"] == context
        assert mine["arg_1"] == {"until": settings["until"], "max_gen_toks": settings["max_gen_toks"]} and \
            settings["max_gen_toks"] == 8
