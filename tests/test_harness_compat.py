"""Coming from lm-eval: its flag names work (--tasks, --limit, --output_path, --model_args, --log_samples,
--version), results.json carries one lm-eval results file per model that lm-eval's own table code prints, and
--log_samples files read back as scores and history. Real pipeline (Prefect + Ray, replay models)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from test_readers import write_samples

from certeval.cli import main
from certeval.errors import InputError
from certeval.harnesses.lm_eval_output import model_config
from certeval.inputs.banks import load_scores
from certeval.inputs.history import load_history

pytestmark = pytest.mark.slow

LM_EVAL_KEYS = {"results", "versions", "n-shot", "n-samples", "higher_is_better", "config", "configs",
                "group_subtasks"}


def check_lm_eval_schema(block: dict) -> None:
    """lm-eval's results-file layout (written from its documented format, used when lm-eval is absent)."""
    assert LM_EVAL_KEYS <= set(block)
    for task, metrics in block["results"].items():
        assert isinstance(metrics["alias"], str)
        for key, value in metrics.items():
            if key == "alias":
                continue
            metric, _, filt = key.partition(",")
            assert filt, f"{key}: lm-eval keys are <metric>,<filter>"
            assert isinstance(value, (int, float)) or (metric.endswith("_stderr") and value == "N/A"), (key, value)
        assert set(block["n-samples"][task]) == {"original", "effective"}
        assert task in block["versions"] and task in block["n-shot"] and task in block["higher_is_better"]
    assert {"model", "model_args"} <= set(block["config"])


def test_schema_check_catches_a_string_metric():
    block = {k: {} for k in LM_EVAL_KEYS} | {"config": {"model": "x", "model_args": ""}}
    block["results"] = {"t": {"alias": "t", "acc,none": 0.5, "guarantee": "anytime-valid"}}
    block["n-samples"] = {"t": {"original": 2, "effective": 1}}
    block.update({"versions": {"t": None}, "n-shot": {"t": 0}, "higher_is_better": {"t": {}}})
    with pytest.raises(AssertionError):
        check_lm_eval_schema(block)


def test_model_args_map_to_lm_eval_config():
    assert model_config("replay:s.parquet#m?latency=0") == {"model": "replay",
                                                            "model_args": "location=s.parquet,name=m,latency=0"}


def test_lm_evals_model_form_maps_to_a_spec(tmp_path, capsys):
    from certeval.cli.surfaces import with_model_args

    assert with_model_args(["hf"], "pretrained=/m/dir,dtype=float32") == ["hf:/m/dir?dtype=float32"]
    # a spec that names its folder has no use for pretrained=: an option its backend does not know, refused by name
    with pytest.raises(InputError, match="--model_args 'pretrained=/b': unknown hf option 'pretrained'"):
        with_model_args(["vllm", "hf:/a"], "pretrained=/b")
    # the mapped spec reaches the hf backend's own check (a folder without a model config)
    assert main(["certify", "--model", "hf", "--model_args", f"pretrained={tmp_path}", "--goal", "halfwidth:0.1",
                 "--bank", "bundled:trivia", "--output_path", str(tmp_path / "runs")]) == 2
    assert f"{str(tmp_path)!r} is not a model folder: it has no readable config.json" in capsys.readouterr().err
    assert main(["certify", "--model", "hf", "--goal", "halfwidth:0.1", "--bank", "bundled:trivia",
                 "--output_path", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip()
    assert "--model hf is lm-eval's form: it needs --model_args pretrained=DIR" in err and len(err.splitlines()) == 1
    assert not (tmp_path / "runs").exists()


def test_version_flag(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.startswith("certeval ")


def test_bad_model_args_exit_2(tmp_path, capsys):
    assert main(["certify", "--model", "replay:bundled:helm_mmlu#openai_ada", "--goal", "halfwidth:0.1",
                 "--model_args", "latency", "--output_path", str(tmp_path / "runs")]) == 2
    assert "--model_args must look like key=value" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_harness_flags_lm_eval_blocks_and_log_samples(infra, tmp_path, capsys):
    rng = np.random.default_rng(2)
    paths = [write_samples(tmp_path / "lm", name, "arc_easy", (rng.random(200) < p).astype(float))
             for name, p in (("model-a", 0.8), ("model-b", 0.4))]
    scores = tmp_path / "scores.parquet"
    assert main(["import", "lm-eval", *paths, "-o", str(scores)]) == 0
    capsys.readouterr()
    argv = ["certify", "--model", f"replay:{scores}#model-a", "--model", f"replay:{scores}#model-b",
            "--tasks", paths[0], "--limit", "60", "--output_path", str(tmp_path / "runs"), "--run-id", "flags",
            "--model_args", "latency=0", "--log_samples", "--goal", "halfwidth:0.02", "--batch-size", "30",
            "--ray-address", infra, "--json"]
    assert main(argv) == 1  # the budget (--limit 60) runs out before a half-width of 0.02
    res = json.loads(capsys.readouterr().out)
    assert res["config"]["max_items"] == 60 and all(m["n_scored"] == 60 for m in res["models"])
    assert res["run_folder"].startswith(str(tmp_path / "runs"))
    stored = json.loads((tmp_path / "runs" / "flags" / "results.json").read_text())
    assert set(stored["lm_eval"]) == {"model-a", "model-b"}  # one lm-eval results file per model
    for m in res["models"]:
        block = stored["lm_eval"][m["model"]]
        check_lm_eval_schema(block)
        metrics = block["results"][res["task"]]
        # replayed recorded scores: the metric is named "score" (the run does not know what was recorded)
        assert metrics["score,none"] == pytest.approx(m["mean"]) and metrics["score_ci_lower,none"] == pytest.approx(m["lower"])
        assert block["n-samples"][res["task"]] == {"original": 200, "effective": 60}
        assert block["config"]["model"] == "replay" and "latency=0" in block["config"]["model_args"]
        assert block["config"]["limit"] == 60
    try:  # lm-eval's own table code, when lm-eval is installed beside the pinned set (it is in requirements.lock)
        from lm_eval.utils import make_table
    except ImportError:
        make_table = None
    if make_table is not None:
        table = make_table(stored["lm_eval"]["model-a"])
        assert res["task"] in table and "score_ci_lower" in table
        assert res["task"] == "arc_easy" and f"{stored['lm_eval']['model-a']['results']['arc_easy']['score,none']:.3f}" in table
    # --log_samples: lm-eval's samples files, read back as scores (same items and scores) and as history
    files = res["samples_files"]
    assert len(files) == 2 and all("/samples/model-" in f and f.endswith(".jsonl") for f in files)
    back = load_scores(files[0])
    rounds = load_scores(str(scores))
    first = rounds[rounds["model"] == back["model"].iloc[0]].set_index("item_id")["score"]
    assert len(back) == 60 and (back.set_index("item_id")["score"] == first.loc[back["item_id"]]).all()
    line = json.loads(open(files[0]).readline())
    assert {"doc_id", "doc", "target", "resps", "filtered_resps", "score"} <= set(line)
    assert line["doc"]["question"].startswith("q")
    # the context sent, as lm-eval's samples file records requests
    assert line["arguments"]["gen_args_0"]["arg_0"] == (line["doc"].get("prompt") or line["doc"]["question"])
    assert load_history(files).models == ["model-a", "model-b"]
    # beside each samples file the model's results_<stamp>.json: the folder is an lm-eval output tree
    for path in files:
        folder = Path(path).parent
        results_files = list(folder.glob("results_*.json"))
        assert len(results_files) == 1
        assert results_files[0].name.split("_", 1)[1] == Path(path).name.rsplit("_", 1)[1].replace(".jsonl", ".json")
        block = json.loads(results_files[0].read_text())
        assert block == stored["lm_eval"][folder.name]
        if make_table is not None:
            assert "score_ci_upper" in make_table(block)
    assert main(["import", "lm-eval", str(Path(files[0]).parent.parent), "-o", str(tmp_path / "back.parquet"),
                 "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["models"]) == 2  # named from each results file's config


def test_metric_names_follow_what_was_judged():
    """The certified estimate is named after the scorer (lm-eval's acc / acc_norm / exact_match where the scorer is
    that metric), ``score`` for recorded scores replayed — never ``acc`` for something that is not accuracy."""
    from certeval.harnesses.lm_eval_output import metric_name, results_metric, task_block

    assert [metric_name(s) for s in ("mc-loglik", "mc-loglik-norm", "exact", "numeric", None)] == [
        "acc", "acc_norm", "exact_match", "numeric", "score"]
    block = task_block("t", [{"metric": "acc_norm", "filter": "none", "mean": 0.5, "stderr": 0.1, "lower": 0.3,
                              "upper": 0.7}], n_scored=5, n_total=9)
    assert block["acc_norm,none"] == 0.5 and block["acc_norm_ci_upper,none"] == 0.7
    assert results_metric({"results": {"t": block}}) == "acc_norm"
