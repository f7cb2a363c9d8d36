"""Bad input on the new surfaces (issue 48, class 1): ``--tasks`` / ``--include_path`` / ``--limit`` /
``--num_fewshot`` / ``--model_args``, ``select --checkpoints``, ``rank --epsilon``, ``--goal halfwidth:``,
``--dry-run --history``, ``import lm-eval <folder>`` and the Inspect early-stopping manager's parameters.

Every case: exit 2, exactly one line on stderr that names the flag and echoes the value, no traceback, nothing
written (a listing of the working folder, the output folder and the fixtures before and after) and no process
left (this process's children before and after). Each runs in-process from an empty working folder and fails
before Ray or Prefect start. A case that needs lm-eval's own index of its ~14,000 tasks (half a minute) is slow.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
from surface_table_support import assert_refused, children, listing, no_new_children, run_cli
from test_readers import write_samples

from lm_eval_support import write_mc_task
from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK

HUGE = 3 << 30  # declared by sparse files: 3 GiB that take no disk space


def _task_folder(root: Path, name: str, body: str, *, docs: str | None = "") -> str:
    """``root/name/name.yaml`` holding ``body`` (``{docs}`` replaced by a docs file holding ``docs``)."""
    folder = root / name
    folder.mkdir(parents=True)
    path = folder / f"{name}.yaml"
    if docs is not None:
        (folder / "docs.jsonl").write_text(docs)
    path.write_text(body.replace("{docs}", str(folder / "docs.jsonl")))
    return str(path)


def _mc(name: str, **over: str) -> str:
    fields = {"task": name, "dataset_path": "json", "dataset_kwargs": "\n  data_files:\n    test: {docs}",
              "test_split": "test", "output_type": "multiple_choice",
              "doc_to_text": '"Question: {{question}}\\nAnswer:"', "doc_to_choice": '"{{choices}}"',
              "doc_to_target": "label", "metric_list": "\n  - metric: acc"}
    fields.update(over)
    return "".join(f"{k}: {v}\n" for k, v in fields.items() if v is not None)


DOCS = "".join(json.dumps({"question": f"q{i}", "choices": ["a", "b"], "label": 0}) + "\n" for i in range(4))


@pytest.fixture(scope="module")
def fx(tmp_path_factory) -> dict[str, str]:
    pytest.importorskip("lm_eval")
    from certeval.inputs.banks import load_scores

    d = tmp_path_factory.mktemp("surfaces")
    tasks = d / "tasks"
    out = {"good_tasks": str(Path(write_mc_task(tasks / "good", n_docs=4)).parent)}
    out["yaml_malformed"] = _task_folder(tasks, "malformed", "task: malformed\ndataset_path: [json\n")
    out["yaml_list"] = _task_folder(tasks, "listed", "- task: listed\n")
    out["yaml_missing_data"] = _task_folder(tasks, "missing_data", _mc("missing_data").replace(
        "{docs}", str(d / "nowhere" / "docs.jsonl")), docs=None)
    out["yaml_empty_data"] = _task_folder(tasks, "empty_data", _mc("empty_data"), docs="")
    out["yaml_missing_path"] = _task_folder(tasks, "missing_path", _mc("missing_path", dataset_path=str(
        d / "no-such-dataset"), dataset_kwargs=None), docs=None)
    out["yaml_output_type"] = _task_folder(tasks, "bad_type", _mc("bad_type", output_type="frobnicate"), docs=DOCS)
    out["yaml_function_file"] = _task_folder(tasks, "no_hook_file", _mc("no_hook_file",
                                             doc_to_text="!function hooks.doc_to_text"), docs=DOCS)
    out["yaml_function_name"] = _task_folder(tasks, "no_hook_name", _mc("no_hook_name",
                                             doc_to_text="!function hooks.nope"), docs=DOCS)
    (tasks / "no_hook_name" / "hooks.py").write_text("def doc_to_text(doc):\n    return doc['question']\n")
    for label, value in (("negative", "-1"), ("text", "two"), ("bool", "true"), ("float", "1.5"),
                         ("huge", "100000")):
        out[f"yaml_fewshot_{label}"] = _task_folder(tasks, f"fewshot_{label}", _mc(
            f"fewshot_{label}", num_fewshot=value, fewshot_split="test"), docs=DOCS)
    out["yaml_metric_typo"] = _task_folder(tasks, "metric_typo", _mc("metric_typo", metric_list="\n  - metric: acc_nrom"),
                                           docs=DOCS)
    out["yaml_gen_metric_typo"] = _task_folder(tasks, "gen_metric_typo", _mc(
        "gen_metric_typo", output_type="generate_until", doc_to_choice=None, doc_to_target='"{{label}}"',
        metric_list="\n  - metric: exact_mtach"), docs=DOCS)
    out["yaml_group_empty"] = _task_folder(tasks, "group_empty", "group: group_empty\ntask: []\n", docs=None)
    out["yaml_group_unknown"] = _task_folder(tasks, "group_unknown", "group: group_unknown\ntask:\n  - no_such_task\n",
                                             docs=None)
    (d / "no-yaml-here").mkdir()
    (d / "a-file.txt").write_text("not a folder")

    frame = load_scores(SCORES)
    ids = list(pd.unique(frame["item_id"]))[:40]
    small = frame[frame["model"].isin([STRONG, MIDDLE, WEAK]) & frame["item_id"].isin(ids)]
    out["scores"] = str(d / "small.scores.parquet")
    small.to_parquet(out["scores"], index=False)
    empty = d / "empty.scores.parquet"
    small.head(0).to_parquet(empty, index=False)
    out["empty_scores"] = str(empty)
    elsewhere = small.assign(item_id="other/" + small["item_id"].astype(str), model=small["model"] + "-h")
    out["other_items"] = str(d / "other.scores.parquet")
    elsewhere.to_parquet(out["other_items"], index=False)
    one = small[small["model"] == WEAK].assign(model="lonely")
    out["one_model"] = str(d / "one.scores.parquet")
    one.to_parquet(out["one_model"], index=False)
    (d / "empty-history").mkdir()
    out["empty_history"] = str(d / "empty-history")

    ckpts = d / "ckpts"
    for name, config in (("good-1", {"model_type": "llama"}), ("no-config", None), ("not-json", "{'a': 1"),
                         ("a-list", "[1, 2]"), ("empty-config", ""), ("with#hash", {"model_type": "llama"}),
                         ("with?mark", {"model_type": "llama"})):
        (ckpts / name).mkdir(parents=True)
        if config is not None:
            (ckpts / name / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    (ckpts / "folder-config" / "config.json").mkdir(parents=True)
    (ckpts / "dangling").mkdir()
    os.symlink(ckpts / "nowhere.json", ckpts / "dangling" / "config.json")
    (ckpts / "ckpt-file").write_text("a file")
    out["ckpts"] = str(ckpts)

    lm = d / "lm"
    write_samples(lm / "loop", "org__model", "arc_easy", [1.0, 0.0])
    os.symlink(lm / "loop", lm / "loop" / "org__model" / "back")  # a folder linking to its ancestor
    sparse = lm / "sparse" / "org__model"
    write_samples(lm / "sparse", "org__model", "arc_easy", [1.0])
    with open(sparse / "samples_arc_hard_2026-11-23T10-11-12.123456.jsonl", "wb") as fh:
        fh.truncate(HUGE)
    write_samples(lm / "sparse-results", "org__model", "arc_easy", [1.0])
    with open(lm / "sparse-results" / "org__model" / "results_2026-11-23T10-11-12.123456.json", "wb") as fh:
        fh.truncate(HUGE)
    write_samples(lm / "truncated", "org__model", "arc_easy", [1.0])
    (lm / "truncated" / "org__model" / "results_2026-11-23T10-11-12.123456.json").write_text('{"config": {"mod')
    write_samples(lm / "listed", "org__model", "arc_easy", [1.0])
    (lm / "listed" / "org__model" / "results_2026-11-23T10-11-12.123456.json").write_text("[1, 2]")
    junk = lm / "junk" / "org__model"
    junk.mkdir(parents=True)
    (junk / "samples_arc_easy_2026-11-23T10-11-12.123456.jsonl").write_text("{not json\n")
    fifo = lm / "fifo" / "org__model"
    fifo.mkdir(parents=True)
    os.mkfifo(fifo / "samples_arc_easy_2026-11-23T10-11-12.123456.jsonl")
    empty_samples = lm / "empty-samples" / "org__model"
    empty_samples.mkdir(parents=True)
    (empty_samples / "samples_arc_easy_2026-11-23T10-11-12.123456.jsonl").write_text("")
    dangling = lm / "dangling" / "org__model"
    dangling.mkdir(parents=True)
    os.symlink(lm / "gone.jsonl", dangling / "samples_arc_easy_2026-11-23T10-11-12.123456.jsonl")
    out["lm"] = str(lm)
    out["root"] = str(d)
    return out


def _rank(fx, *extra: str) -> list[str]:
    return ["rank", "--model", f"replay:{fx['scores']}#{STRONG}", "--model", f"replay:{fx['scores']}#{WEAK}", *extra]


def _certify(fx, *extra: str, model: str | None = None) -> list[str]:
    return ["certify", "--model", model or f"replay:{fx['scores']}#{MIDDLE}", "--goal", "halfwidth:0.1", *extra]


def _tasks(fx, key: str, *extra: str) -> list[str]:
    return ["certify", "--model", "hf:bundled:smollm2", "--goal", "halfwidth:0.1", "--tasks", fx[key], *extra]


def _mc_yaml(fx) -> str:
    return str(Path(fx["good_tasks"]) / "tiny_mc.yaml")


def _hf(fx, name: str = "good-1") -> str:
    return f"hf:{fx['ckpts']}/{name}"


def _ckpt(fx, name: str) -> list[str]:
    return ["select", "--checkpoints", f"{fx['ckpts']}/{name}"]


def _import(fx, name: str) -> list[str]:
    return ["import", "lm-eval", f"{fx['lm']}/{name}", "-o", "scores.parquet"]


slow = pytest.mark.slow

# (case id, argv builder, the flag the line names, the value it echoes: a builder of fx too)
CASES = [
    # --tasks: a task YAML that is malformed, names a missing or empty dataset, an unknown output type, a missing
    # !function; few-shot counts out of range; an empty group or one naming an unknown task
    ("tasks-yaml-malformed", lambda fx: _tasks(fx, "yaml_malformed"), "--tasks", lambda fx: fx["yaml_malformed"]),
    ("tasks-yaml-a-list", lambda fx: _tasks(fx, "yaml_list"), "--tasks", lambda fx: fx["yaml_list"]),
    ("tasks-dataset-file-missing", lambda fx: _tasks(fx, "yaml_missing_data"), "--tasks",
     lambda fx: "nowhere/docs.jsonl"),
    ("tasks-dataset-file-empty", lambda fx: _tasks(fx, "yaml_empty_data"), "--tasks", lambda fx: "docs.jsonl"),
    ("tasks-dataset-path-missing", lambda fx: _tasks(fx, "yaml_missing_path"), "--tasks",
     lambda fx: "no-such-dataset"),
    ("tasks-output-type-unknown", lambda fx: _tasks(fx, "yaml_output_type"), "--tasks", lambda fx: "frobnicate"),
    ("tasks-function-file-missing", lambda fx: _tasks(fx, "yaml_function_file"), "--tasks",
     lambda fx: "hooks.doc_to_text"),
    ("tasks-function-name-missing", lambda fx: _tasks(fx, "yaml_function_name"), "--tasks",
     lambda fx: "hooks.nope"),
    ("tasks-fewshot-negative", lambda fx: _tasks(fx, "yaml_fewshot_negative"), "num_fewshot", lambda fx: "-1"),
    ("tasks-fewshot-text", lambda fx: _tasks(fx, "yaml_fewshot_text"), "num_fewshot", lambda fx: "two"),
    ("tasks-fewshot-bool", lambda fx: _tasks(fx, "yaml_fewshot_bool"), "num_fewshot", lambda fx: "True"),
    ("tasks-fewshot-float", lambda fx: _tasks(fx, "yaml_fewshot_float"), "num_fewshot", lambda fx: "1.5"),
    ("tasks-fewshot-more-than-docs", lambda fx: _tasks(fx, "yaml_fewshot_huge"), "num_fewshot",
     lambda fx: "100000"),
    ("tasks-group-empty", lambda fx: _tasks(fx, "yaml_group_empty"), "--tasks", lambda fx: "group_empty"),
    ("tasks-group-unknown-member", lambda fx: _tasks(fx, "yaml_group_unknown"), "--tasks",
     lambda fx: "no_such_task"),
    ("tasks-yaml-missing", lambda fx: _tasks(fx, "root", )[:-1] + [fx["root"] + "/none.yaml"], "--tasks",
     lambda fx: "none.yaml"),
    pytest.param("tasks-name-unknown", lambda fx: _tasks(fx, "good_tasks")[:-1] + ["no_such_task", "--include_path",
                                                                                 fx["good_tasks"]],
                 "--tasks", lambda fx: "no_such_task", marks=slow, id="tasks-name-unknown"),
    ("tasks-name-garbage", lambda fx: _tasks(fx, "good_tasks")[:-1] + ["no such;task", "--include_path",
                                                                      fx["good_tasks"]],
     "--tasks", lambda fx: "no such;task"),
    # --include_path: missing, a file, a folder without task YAMLs
    ("include-path-missing", lambda fx: _tasks(fx, "good_tasks")[:-1] + ["tiny_mc", "--include_path",
                                                                        fx["root"] + "/nowhere"],
     "--include_path", lambda fx: "nowhere"),
    ("include-path-a-file", lambda fx: _tasks(fx, "good_tasks")[:-1] + ["tiny_mc", "--include_path",
                                                                       fx["root"] + "/a-file.txt"],
     "--include_path", lambda fx: "a-file.txt"),
    ("include-path-no-yaml", lambda fx: _tasks(fx, "good_tasks")[:-1] + ["tiny_mc", "--include_path",
                                                                        fx["root"] + "/no-yaml-here"],
     "--include_path", lambda fx: "no-yaml-here"),
    ("include-path-without-tasks", lambda fx: _certify(fx, "--include_path", fx["good_tasks"]), "--include_path",
     lambda fx: fx["good_tasks"]),
    # --limit (lm-eval's name for --max-items) and --num_fewshot
    ("limit-zero", lambda fx: _certify(fx, "--limit", "0"), "--limit", lambda fx: "0"),
    ("limit-negative", lambda fx: _certify(fx, "--limit", "-3"), "--limit", lambda fx: "-3"),
    ("limit-fraction", lambda fx: _certify(fx, "--limit", "0.5"), "--limit", lambda fx: "0.5"),
    ("limit-text", lambda fx: _certify(fx, "--limit", "all"), "--limit", lambda fx: "all"),
    ("num-fewshot-negative", lambda fx: _certify(fx, "--num_fewshot", "-1"), "--num_fewshot", lambda fx: "-1"),
    ("num-fewshot-text", lambda fx: _certify(fx, "--num_fewshot", "five"), "--num_fewshot", lambda fx: "five"),
    # a metric name lm-eval does not compute for the task's output type (it would certify another metric)
    ("tasks-metric-unknown", lambda fx: _tasks(fx, "yaml_metric_typo"), "--tasks", lambda fx: "acc_nrom"),
    ("tasks-generation-metric-unknown", lambda fx: _tasks(fx, "yaml_gen_metric_typo"), "--tasks",
     lambda fx: "exact_mtach"),
    # lm-eval's request flags: without --tasks, without a chat template, on a model with no tokenizer, sampling
    ("chat-template-without-tasks", lambda fx: _certify(fx, "--apply_chat_template"), "--apply_chat_template", None),
    ("chat-template-replay-model", lambda fx: _certify(fx, "--apply_chat_template", "--tasks", _mc_yaml(fx)),
     "--apply_chat_template", lambda fx: "replay"),
    ("chat-template-no-tokenizer", lambda fx: _certify(fx, "--apply_chat_template", "--tasks", _mc_yaml(fx),
                                                       model=_hf(fx)), "--apply_chat_template",
     lambda fx: "good-1"),
    ("chat-multiturn-without-template", lambda fx: _tasks(fx, "good_tasks")[:-1] + [
        _mc_yaml(fx), "--fewshot_as_multiturn"], "--fewshot_as_multiturn", lambda fx: "true"),
    ("chat-system-instruction-bank-file", lambda fx: _certify(fx, "--system_instruction", "Be brief.", "--tasks",
                                                              fx["scores"]), "--system_instruction",
     lambda fx: "Be brief."),
    ("gen-kwargs-sampling", lambda fx: _tasks(fx, "good_tasks")[:-1] + [_mc_yaml(fx), "--gen_kwargs",
                                                                       "temperature=0.7"], "--gen_kwargs",
     lambda fx: "temperature=0.7"),
    ("gen-kwargs-beams", lambda fx: _tasks(fx, "good_tasks")[:-1] + [_mc_yaml(fx), "--gen_kwargs", "num_beams=4"],
     "--gen_kwargs", lambda fx: "num_beams"),
    ("gen-kwargs-without-tasks", lambda fx: _certify(fx, "--gen_kwargs", "max_gen_toks=8"), "--gen_kwargs",
     lambda fx: "max_gen_toks"),
    ("gen-kwargs-bad-json", lambda fx: _tasks(fx, "good_tasks")[:-1] + [_mc_yaml(fx), "--gen_kwargs", "{until: 1}"],
     "--gen_kwargs", lambda fx: "{until: 1}"),
    # --device / --batch_size (lm-eval's): no CUDA here, a device the hf host has not, a batch that is no number
    ("device-cuda-without-gpu", lambda fx: _certify(fx, "--device", "cuda", "--bank", fx["scores"], model=_hf(fx)),
     "--device", lambda fx: "cuda"),
    ("device-cuda-index-without-gpu", lambda fx: _certify(fx, "--device", "cuda:1", "--bank", fx["scores"],
                                                          model=_hf(fx)), "--device", lambda fx: "cuda:1"),
    ("device-in-spec-without-gpu", lambda fx: _certify(fx, "--bank", fx["scores"], model=_hf(fx) + "?device=cuda"),
     "device", lambda fx: "cuda"),
    ("device-unknown", lambda fx: _certify(fx, "--device", "mps", "--bank", fx["scores"], model=_hf(fx)), "--device",
     lambda fx: "mps"),
    ("device-replay-model", lambda fx: _certify(fx, "--device", "cpu"), "--device", lambda fx: "replay"),
    ("batch-size-text", lambda fx: _certify(fx, "--batch_size", "big", model=_hf(fx)), "--batch_size",
     lambda fx: "big"),
    ("batch-size-auto-zero", lambda fx: _certify(fx, "--batch_size", "auto:0", model=_hf(fx)), "--batch_size",
     lambda fx: "auto:0"),
    ("limit-fraction-bank-file", lambda fx: _certify(fx, "--limit", "0.5", "--tasks", fx["scores"]), "--limit",
     lambda fx: "0.5"),
    # lm-eval's run flags certeval cannot honour: refused, saying why
    ("lm-eval-flag-use-cache", lambda fx: _certify(fx, "--use_cache", "lm_cache"), "--use_cache",
     lambda fx: "score cache"),
    ("lm-eval-flag-predict-only", lambda fx: _certify(fx, "--predict_only"), "--predict_only", lambda fx: "certif"),
    ("lm-eval-flag-samples", lambda fx: _certify(fx, "--samples", '{"tiny_mc": [0, 1]}'), "--samples",
     lambda fx: "tiny_mc"),
    ("model-args-unknown-key", lambda fx: _certify(fx, "--model_args", "frobnicate=1", model=_hf(fx)),
     "--model_args", lambda fx: "frobnicate"),
    # --model_args that do not parse, or give a key twice
    ("model-args-no-equals", lambda fx: _certify(fx, "--model_args", "pretrained", model=_hf(fx)), "--model_args",
     lambda fx: "pretrained"),
    ("model-args-no-key", lambda fx: _certify(fx, "--model_args", "=float16", model=_hf(fx)), "--model_args",
     lambda fx: "=float16"),
    ("model-args-key-twice", lambda fx: _certify(fx, "--model_args", "dtype=float16,dtype=float32", model=_hf(fx)),
     "--model_args", lambda fx: "dtype"),
    ("model-args-key-in-spec-too", lambda fx: _certify(fx, "--model_args", "dtype=float16",
                                                       model=_hf(fx) + "?dtype=float32"), "--model_args",
     lambda fx: "dtype"),
    ("model-args-pretrained-twice", lambda fx: ["certify", "--model", "hf", "--goal", "halfwidth:0.1", "--model_args",
                                                f"pretrained={fx['ckpts']}/good-1,pretrained=/x"], "--model_args",
     lambda fx: "pretrained"),
    ("model-args-smuggled-option", lambda fx: _certify(fx, "--model_args", "dtype=float16&device=cuda",
                                                       model=_hf(fx)), "--model_args", lambda fx: "&"),
    ("model-args-smuggled-name", lambda fx: _certify(fx, "--model_args", "dtype=float16#m", model=_hf(fx)),
     "--model_args", lambda fx: "#"),
    ("model-spec-option-twice", lambda fx: _certify(fx, model=_hf(fx) + "?dtype=float16&dtype=float32"), "--model",
     lambda fx: "dtype"),
    # select --checkpoints: globs matching nothing, files, folders without a readable config or whose config is
    # not a JSON object (names holding '#' or '?' are ordinary folders: tests/test_user_surroundings.py)
    ("checkpoints-match-nothing", lambda fx: _ckpt(fx, "ckpt-*"), "--checkpoints", lambda fx: "ckpt-*"),
    ("checkpoints-a-file", lambda fx: _ckpt(fx, "ckpt-file"), "--checkpoints", lambda fx: "ckpt-file"),
    ("checkpoints-no-config", lambda fx: _ckpt(fx, "no-config"), "--checkpoints", lambda fx: "no-config"),
    ("checkpoints-config-a-folder", lambda fx: _ckpt(fx, "folder-config"), "--checkpoints",
     lambda fx: "folder-config"),
    ("checkpoints-config-dangling-link", lambda fx: _ckpt(fx, "dangling"), "--checkpoints", lambda fx: "dangling"),
    ("checkpoints-config-not-json", lambda fx: _ckpt(fx, "not-json"), "--checkpoints", lambda fx: "not-json"),
    ("checkpoints-config-a-list", lambda fx: _ckpt(fx, "a-list"), "--checkpoints", lambda fx: "a-list"),
    ("checkpoints-config-empty", lambda fx: _ckpt(fx, "empty-config"), "--checkpoints", lambda fx: "empty-config"),
    ("checkpoints-glob-mixed", lambda fx: _ckpt(fx, "*"), "--checkpoints", lambda fx: "*"),
    ("model-hf-config-a-list", lambda fx: _certify(fx, "--bank", fx["scores"], model=_hf(fx, "a-list")), "--model",
     lambda fx: "a-list"),
    # rank --epsilon: out of range, non-finite, text, booleans
    *[(f"epsilon-{label}", (lambda v: lambda fx: _rank(fx, f"--epsilon={v}"))(value), "--epsilon",
       (lambda v: lambda fx: v)(value))
      for label, value in (("nan", "nan"), ("inf", "inf"), ("minus-inf", "-inf"), ("zero", "0"), ("one", "1"),
                           ("negative", "-0.05"), ("text", "small"), ("bool", "true"), ("empty", ""))],
    # --goal halfwidth:E (rank's leaderboard precision, certify's goal)
    *[(f"rank-goal-{label}", (lambda v: lambda fx: _rank(fx, "--goal", v))(value), "goal",
       (lambda v: lambda fx: v)(value))
      for label, value in (("zero", "halfwidth:0"), ("one", "halfwidth:1"), ("nan", "halfwidth:nan"),
                           ("inf", "halfwidth:inf"), ("negative", "halfwidth:-0.1"), ("text", "halfwidth:tight"),
                           ("empty", "halfwidth:"), ("underflow", "halfwidth:1e-400"),
                           ("diminishing", "halfwidth:0.1+diminishing:0.01"))],
    ("certify-goal-halfwidth-nan", lambda fx: ["certify", "--model", f"replay:{fx['scores']}#{MIDDLE}", "--goal",
                                               "halfwidth:nan"], "goal", lambda fx: "nan"),
    ("certify-goal-diminishing-inf", lambda fx: ["certify", "--model", f"replay:{fx['scores']}#{MIDDLE}", "--goal",
                                                 "halfwidth:0.1+diminishing:inf"], "goal", lambda fx: "inf"),
    # --dry-run --history: missing, empty, non-overlapping history
    ("dry-run-history-missing", lambda fx: _rank(fx, "--epsilon", "0.1", "--dry-run", "--history",
                                                 fx["root"] + "/none.parquet"), "--history",
     lambda fx: "none.parquet"),
    ("dry-run-history-none", lambda fx: _rank(fx, "--epsilon", "0.1", "--dry-run"), "--history", lambda fx: "--dry-run"),
    ("dry-run-history-empty-file", lambda fx: _rank(fx, "--epsilon", "0.1", "--dry-run", "--history",
                                                    fx["empty_scores"]), "--history", lambda fx: "empty.scores"),
    ("dry-run-history-empty-folder", lambda fx: _rank(fx, "--epsilon", "0.1", "--dry-run", "--history",
                                                      fx["empty_history"]), "--history", lambda fx: "empty-history"),
    ("dry-run-history-other-items", lambda fx: _rank(fx, "--epsilon", "0.1", "--dry-run", "--history",
                                                     fx["other_items"]), "--history", lambda fx: "other.scores"),
    ("dry-run-history-one-model", lambda fx: _rank(fx, "--epsilon", "0.1", "--dry-run", "--history",
                                                   fx["one_model"]), "--history", lambda fx: "one.scores"),
    ("dry-run-history-not-scores", lambda fx: _rank(fx, "--epsilon", "0.1", "--dry-run", "--history",
                                                    fx["root"] + "/a-file.txt"), "--history",
     lambda fx: "a-file.txt"),
    # import lm-eval <folder>: damaged, looping, holding huge sparse files or what is not a file
    ("import-symlink-loop", lambda fx: _import(fx, "loop"), "lm-eval", lambda fx: "back"),
    ("import-huge-sparse-samples", lambda fx: _import(fx, "sparse"), "lm-eval", lambda fx: "samples_arc_hard"),
    ("import-huge-sparse-results", lambda fx: _import(fx, "sparse-results"), "lm-eval", lambda fx: "results_"),
    ("import-results-truncated", lambda fx: _import(fx, "truncated"), "lm-eval", lambda fx: "truncated"),
    ("import-results-a-list", lambda fx: _import(fx, "listed"), "lm-eval", lambda fx: "listed"),
    ("import-samples-junk", lambda fx: _import(fx, "junk"), "lm-eval", lambda fx: "junk"),
    ("import-samples-a-fifo", lambda fx: _import(fx, "fifo"), "lm-eval", lambda fx: "fifo"),
    ("import-samples-empty", lambda fx: _import(fx, "empty-samples"), "lm-eval", lambda fx: "empty-samples"),
    ("import-samples-dangling-link", lambda fx: _import(fx, "dangling"), "lm-eval", lambda fx: "dangling"),
    ("import-folder-missing", lambda fx: _import(fx, "nowhere"), "lm-eval", lambda fx: "nowhere"),
]


def _case(case) -> tuple:
    return tuple(case.values) if hasattr(case, "values") else case


@pytest.mark.parametrize("case_id,build,flag,echo", CASES, ids=[_case(c)[0] for c in CASES])
def test_bad_input_on_a_new_surface_exits_2_in_one_line_naming_the_flag_and_value(case_id, build, flag, echo, fx,
                                                                                   tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = build(fx)
    if argv[0] in ("certify", "rank", "select"):
        argv = [*argv, "--output", str(tmp_path / "out")]
    watched = (tmp_path, Path(fx["root"]))
    before, procs = listing(*watched), children()
    code, lines, _ = run_cli(argv, capsys)
    assert_refused(case_id, code, lines, flag=flag, echo=None if echo is None else echo(fx))
    assert listing(*watched) == before, f"{case_id}: something was written"
    assert not no_new_children(procs), f"{case_id}: a process was left"


# the Inspect manager: (case id, keyword arguments, the parameter the line names, the value it echoes)
INSPECT_CASES = [
    ("goal-halfwidth-zero", {"goal": "halfwidth:0"}, "goal", "halfwidth:0"),
    ("goal-halfwidth-one", {"goal": "halfwidth:1"}, "goal", "halfwidth:1"),
    ("goal-halfwidth-nan", {"goal": "halfwidth:nan"}, "goal", "halfwidth:nan"),
    ("goal-halfwidth-inf", {"goal": "halfwidth:inf"}, "goal", "halfwidth:inf"),
    ("goal-empty", {"goal": ""}, "goal", "''"),
    ("goal-not-text", {"goal": 0.05}, "goal", "0.05"),
    ("goal-above-nan", {"goal": "above:nan"}, "goal", "above:nan"),
    ("confidence-text", {"confidence": "0.95"}, "confidence", "'0.95'"),
    ("confidence-bool", {"confidence": True}, "confidence", "True"),
    ("confidence-nan", {"confidence": float("nan")}, "confidence", "nan"),
    ("confidence-zero", {"confidence": 0}, "confidence", "0"),
    ("confidence-one", {"confidence": 1.0}, "confidence", "1.0"),
    ("confidence-inf", {"confidence": float("inf")}, "confidence", "inf"),
    ("min-samples-bool", {"min_samples": True}, "min_samples", "True"),
    ("min-samples-negative", {"min_samples": -1}, "min_samples", "-1"),
    ("min-samples-float", {"min_samples": 2.5}, "min_samples", "2.5"),
    ("min-samples-text", {"min_samples": "10"}, "min_samples", "'10'"),
    ("method-adaptive", {"method": "adaptive"}, "method", "adaptive"),
    ("scorer-not-text", {"scorer": 3}, "scorer", "3"),
]


@pytest.mark.parametrize("case_id,kwargs,param,echo", INSPECT_CASES, ids=[c[0] for c in INSPECT_CASES])
def test_the_inspect_manager_refuses_bad_parameters_when_built(case_id, kwargs, param, echo, tmp_path,
                                                               monkeypatch):
    """Refused when the manager is made (before any Inspect eval starts), in one line naming the parameter."""
    from certeval.errors import InputError
    from certeval.harnesses.inspect_early_stopping import CertevalStopping

    monkeypatch.chdir(tmp_path)
    procs = children()
    with pytest.raises(InputError) as caught:
        CertevalStopping(**kwargs)
    message = str(caught.value)
    assert len(message.splitlines()) == 1 and param in message and echo in message, (case_id, message)
    assert list(tmp_path.iterdir()) == [] and not no_new_children(procs)


def test_the_table_covers_every_new_surface():
    ids = [_case(c)[0] for c in CASES]
    for prefix in ("tasks-", "include-path-", "limit-", "num-fewshot-", "model-args-", "checkpoints-", "epsilon-",
                   "rank-goal-", "dry-run-", "import-", "chat-", "gen-kwargs-", "device-", "batch-size-",
                   "lm-eval-flag-"):
        assert sum(i.startswith(prefix) for i in ids) >= 2, prefix
    assert len(ids) + len(INSPECT_CASES) >= 90


def test_num_fewshot_sets_every_tasks_count_and_is_part_of_the_bank(fx, tmp_path, monkeypatch):
    """The accepted side of --num_fewshot: the bank's prompts hold that many examples, and the bank's name records
    the count (a resumed run with another count is another bank)."""
    from certeval.harnesses.lm_eval_tasks import tasks_bank
    from certeval.inputs.banks import load_bank

    monkeypatch.chdir(tmp_path)
    yaml = str(Path(fx["good_tasks"]) / "tiny_mc.yaml")
    for shots in (0, 2):
        location = tasks_bank(yaml, None, shots)
        assert location == f"{yaml}?num_fewshot={shots}"
        prompts = load_bank(location).frame["prompt"]
        assert prompts.str.count("Question:").eq(shots + 1).all(), (shots, prompts.iloc[0])
    named = tasks_bank("tiny_mc", fx["good_tasks"], 1)
    assert named.startswith("lm-eval:tiny_mc?include_path=") and named.endswith("&num_fewshot=1")
    assert load_bank(named).frame["prompt"].str.count("Question:").eq(2).all()
