"""``certeval import lm-eval <output_path>`` over folders lm-eval itself wrote (dummy model, a local task, offline)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import pandas as pd
import pytest

from certeval.cli import main
from certeval.harnesses.lm_eval_runs import Run, name_runs
from certeval.inputs.banks import load_scores

from lm_eval_support import write_mc_task

pytest.importorskip("lm_eval")

# Writes each run as lm-eval's CLI does (run.py: simple_evaluate, then the EvaluationTracker saves the results and
# one samples file per task), with the CLI's parsed model_args (a dict) or the Python API's text. The CLI itself
# indexes all ~14,000 built-in task files per run (~30 s each here); include_defaults=False skips that.
RUNNER = textwrap.dedent("""
    import sys
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager
    from lm_eval.utils import simple_parse_args_string

    tasks, runs = sys.argv[1], sys.argv[2:]
    for output_path, form, model_args in zip(runs[::3], runs[1::3], runs[2::3]):
        tracker = EvaluationTracker(output_path=output_path)
        args = simple_parse_args_string(model_args) if form == "cli" else model_args
        results = lm_eval.simple_evaluate(model="dummy", model_args=args, tasks=["tiny_mc"], log_samples=True,
                                          task_manager=TaskManager(include_path=tasks, include_defaults=False),
                                          evaluation_tracker=tracker)
        samples = results.pop("samples")
        tracker.save_results_aggregated(results=results, samples=samples)
        for task in results["configs"]:
            tracker.save_results_samples(task_name=task, samples=samples[task])
""")


def _task(folder) -> None:
    """A 10-doc multiple-choice task over a local JSONL file."""
    write_mc_task(folder)


@pytest.fixture(scope="module")
def lm_runs(tmp_path_factory):
    """``cli/``: two runs of one model with other model_args (DummyLM ignores them; lm-eval records them).
    ``api/``: a rerun of the first with the Python API's text model_args, and a run with no model name in them."""
    root = tmp_path_factory.mktemp("lm_eval")
    _task(root / "tasks")
    cli, api = str(root / "cli"), str(root / "api")
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_CACHE": str(root / "hf"),
           "TOKENIZERS_PARALLELISM": "false"}
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", RUNNER, str(root / "tasks"),
                    cli, "cli", "pretrained=m,seed=1", cli, "cli", "pretrained=m,seed=2",
                    api, "api", "pretrained=m,seed=1", api, "api", "seed=3"],
                   check=True, env=env, cwd=root, capture_output=True, timeout=600)
    print(f"lm-eval wrote 4 runs in {time.monotonic() - started:.1f} s")
    return root


def _import(capsys, *argv) -> dict:
    assert main(["import", "lm-eval", *map(str, argv), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_an_output_path_with_two_real_runs_gives_two_named_models(lm_runs, tmp_path, capsys):
    """The Done-when test: one folder, two runs (different model_args), two models, no renaming by hand."""
    out = tmp_path / "s.parquet"
    summary = _import(capsys, lm_runs / "cli", "-o", out)
    assert summary["models"] == ["m (seed=1)", "m (seed=2)"] and summary["rows"] == 20
    assert {s["named_from"] for s in summary["sources"]} == {"results file config"}
    assert all(s["results"].endswith(".json") and s["settings"]["--model"] == "dummy" for s in summary["sources"])
    scores = load_scores(str(out))
    assert scores.groupby("model").size().to_dict() == {"m (seed=1)": 10, "m (seed=2)": 10}


def test_a_folder_on_an_fsspec_url_reads_alike(lm_runs, tmp_path, capsys):
    """The tree copied to an fsspec memory:// URL: the same names, scores and items as on disk."""
    import fsspec

    fs, root = fsspec.filesystem("memory"), f"/lm-eval-{tmp_path.name}"
    for path in (lm_runs / "cli").rglob("*.json*"):
        fs.pipe_file(f"{root}/{path.relative_to(lm_runs / 'cli')}", path.read_bytes())
    try:
        here = _import(capsys, lm_runs / "cli", "-o", tmp_path / "a.parquet", "--items", tmp_path / "ia.parquet")
        there = _import(capsys, f"memory://{root}", "-o", tmp_path / "b.parquet", "--items", tmp_path / "ib.parquet")
    finally:
        fs.rm(root, recursive=True)
    assert here["models"] == there["models"] and there["sources"][0]["results"].startswith("memory://")
    assert load_scores(str(tmp_path / "a.parquet")).equals(load_scores(str(tmp_path / "b.parquet")))
    items = [pd.read_parquet(tmp_path / f"i{x}.parquet") for x in "ab"]
    assert len(items[0]) == 10 and items[0].equals(items[1])


def test_the_folder_gives_the_scores_of_its_samples_files(lm_runs, tmp_path, capsys):
    summary = _import(capsys, lm_runs / "cli", "-o", tmp_path / "tree.parquet")
    tree = load_scores(str(tmp_path / "tree.parquet"))
    for source in summary["sources"]:
        (samples,) = source["samples"]
        direct = _import(capsys, samples, "-o", tmp_path / "one.parquet")
        assert direct["sources"][0]["named_from"].startswith("folder name") and direct["models"] == ["m"]
        one = load_scores(str(tmp_path / "one.parquet")).drop(columns="model").reset_index(drop=True)
        mine = tree[tree["model"] == source["model"]].drop(columns="model").reset_index(drop=True)
        assert one.equals(mine)


def test_reruns_and_samples_without_results_are_named_apart(lm_runs, tmp_path, capsys):
    """A rerun (same settings, same task; text model_args from the Python API read as the CLI's dict) gets its
    timestamp; a run without model name in its model_args is named after --model and them; a samples file without
    its results file is named after its folder, and the summary says so."""
    lonely = tmp_path / "lonely" / "x"
    lonely.mkdir(parents=True)
    shutil.copy(next((lm_runs / "api").glob("*/samples_*.jsonl")), lonely)
    summary = _import(capsys, lm_runs / "cli", lm_runs / "api", tmp_path / "lonely", "-o", tmp_path / "s.parquet")
    stamps = {s["model"]: s["results"] for s in summary["sources"]}
    reruns = sorted(m for m in summary["models"] if m.startswith("m (seed=1) @"))
    assert len(reruns) == 2 and all(stamps[m].endswith(f"results_{m.split('@')[1]}.json") for m in reruns)
    assert {"m (seed=2)", "dummy (seed=3)", "x"} <= set(summary["models"]) and len(summary["models"]) == 5
    (x,) = [s for s in summary["sources"] if s["model"] == "x"]
    assert x["named_from"] == "folder name (no results file)" and x["results"] is None
    assert main(["import", "lm-eval", str(tmp_path / "lonely"), "-o", str(tmp_path / "t.csv")]) == 0
    assert "'x' <- folder name (no results file)" in capsys.readouterr().out


def test_name_overrides_the_model_of_one_run(lm_runs, tmp_path, capsys):
    one = tmp_path / "one"
    shutil.copytree(lm_runs / "cli", one)
    last = max(p.stem.rsplit("_", 1)[1] for p in one.glob("*/results_*.json"))
    for path in one.glob(f"*/*_{last}.json*"):  # keep the first run only
        path.unlink()
    summary = _import(capsys, one, "-o", tmp_path / "s.parquet", "--name", "mine")
    assert summary["models"] == ["mine"] and summary["sources"][0]["named_from"] == "--name"
    assert main(["import", "lm-eval", str(lm_runs / "cli"), "-o", str(tmp_path / "t.parquet"), "--name", "mine"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--name 'mine'" in err and "2 lm-eval runs" in err
    assert not (tmp_path / "t.parquet").exists()


def _bad_results(folder):
    next(folder.glob("*/results_*.json")).write_text("{ not json")


def _no_samples(folder):
    for path in folder.glob("*/samples_*"):
        path.unlink()


def _no_config(folder):
    next(folder.glob("*/results_*.json")).write_text(json.dumps({"results": {}}))


def _empty(folder):
    shutil.rmtree(folder)
    folder.mkdir()


@pytest.mark.parametrize("damage, message", [
    (_empty, "is a folder with no files in it"),
    (_no_samples, "holds no samples file"),
    (_bad_results, "could not be read"),
    (_no_config, "has no config.model"),
])
def test_bad_folders_exit_2_in_one_line_before_writing(lm_runs, tmp_path, capsys, damage, message):
    folder = tmp_path / "bad"
    shutil.copytree(lm_runs / "cli", folder)
    damage(folder)
    out = tmp_path / "s.parquet"
    assert main(["import", "lm-eval", str(folder), "-o", str(out), "--items", str(tmp_path / "i.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err and str(folder) in err
    assert not out.exists() and not (tmp_path / "i.parquet").exists()


def test_an_output_may_not_overwrite_a_file_of_the_folder(lm_runs, tmp_path, capsys):
    shutil.copytree(lm_runs / "cli", tmp_path / "cli")
    samples = next((tmp_path / "cli").glob("*/samples_*.jsonl"))
    before = samples.read_bytes()
    assert main(["import", "lm-eval", str(tmp_path / "cli"), "-o", str(samples)]) == 2
    assert "is one of the files being read" in capsys.readouterr().err and samples.read_bytes() == before


def _run(stamp, task="t", **settings):
    return Run(folder="out/m", stamp=stamp, samples=[f"out/m/samples_{task}_{stamp}.jsonl"],
               settings={"--model": "hf", "pretrained": "org/m", **settings}, source="results file config")


def test_names_differ_in_what_differs_and_are_deterministic():
    runs = [_run("2026-01-01T00-00-00.1", dtype="float16"), _run("2026-01-02T00-00-00.1", dtype="bfloat16"),
            _run("2026-01-03T00-00-00.1"), _run("2026-01-04T00-00-00.1", task="u", dtype="float16")]
    name_runs(runs)
    assert [r.name for r in runs] == ["org/m (dtype=float16)", "org/m (dtype=bfloat16)", "org/m (no dtype)",
                                      "org/m (dtype=float16)"]  # same settings, other task: one model
    again = [_run("2026-01-01T00-00-00.1", dtype="float16"), _run("2026-01-02T00-00-00.1", dtype="float16")]
    name_runs(again)
    assert [r.name for r in again] == ["org/m @2026-01-01T00-00-00.1", "org/m @2026-01-02T00-00-00.1"]


def test_a_file_read_twice_is_refused(lm_runs, tmp_path, capsys):
    """A folder and a samples file inside it would import the file twice under two names: refused in one line."""
    samples = next((lm_runs / "cli").glob("*/samples_*.jsonl"))
    assert main(["import", "lm-eval", str(lm_runs / "cli"), str(samples), "-o", str(tmp_path / "s.parquet")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "is given twice" in err and str(samples) in err
