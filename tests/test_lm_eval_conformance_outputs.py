"""Conformance with lm-eval for every output type but plain multiple choice: one real ``lm_eval --model hf`` run
(``--log_samples``) on the converted SmolLM2 beside certeval's runs of the same local tasks, item by item —
LAMBADA-style ``loglikelihood`` (acc = is_greedy, perplexity), a ``loglikelihood_rolling`` perplexity task (rolling
windows: ``max_length=32`` on both sides, so the longer texts take several), Winogrande-style ``multiple_input`` (acc,
acc_norm) and GSM8K-style ``generate_until`` with two filters (a samples line per filter). Flags and exact_match
equal, log-likelihoods within 1e-4 nats, perplexities within 1e-4 relative. Offline: local JSONL."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap

import pytest
from lm_eval_outputs_support import write_output_tasks

from certeval.cli import main
from certeval.hosting.hf_rolling import rolling_windows

pytest.importorskip("lm_eval")

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
MAX_LENGTH = 32
TASKS = ("conf_lambada", "conf_ppl", "conf_wino", "tiny_gen")

RUNNER = textwrap.dedent("""
    import json, sys
    import lm_eval
    from lm_eval.tasks import TaskManager

    tasks, model_dir, max_length, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    names = sys.argv[5].split(",")
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32,"
                                      f"max_length={max_length}", device="cpu", batch_size=4, tasks=names,
                                      log_samples=True,
                                      task_manager=TaskManager(include_path=tasks, include_defaults=False))
    with open(out, "w") as fh:
        json.dump({"results": results["results"], "samples": results["samples"]}, fh, default=str)
""")


def test_rolling_windows_are_lm_evals():
    """A second method: the windows equal lm-eval's own ``get_rolling_token_windows`` + ``make_disjoint_window``
    for texts shorter than, as long as and several times a window; a window one token short (the broken control)
    differs."""
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    for n in (1, 2, 7, 8, 9, 16, 17, 40):
        tokens = list(range(100, 100 + n))
        for max_length in (1, 2, 8):
            theirs = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, 0, max_length, 1)]
            assert rolling_windows(tokens, 0, max_length) == theirs, (n, max_length)
    tokens = list(range(100, 140))
    assert rolling_windows(tokens, 0, 7) != [make_disjoint_window(w) for w in
                                             get_rolling_token_windows(tokens, 0, 8, 1)]


def test_uncertified_aggregates_are_lm_evals():
    """lm-eval's own aggregation functions on the same per-doc values (a second method), and a swapped pair (the
    broken control: words for bytes) differs."""
    import random

    from lm_eval.api.metrics import bits_per_byte, perplexity, weighted_perplexity

    from certeval.harnesses.lm_eval_output_types import aggregate

    rng = random.Random(3)
    pairs = [[-rng.uniform(1, 200), rng.randint(1, 60)] for _ in range(9)]
    lls = [p[0] for p in pairs]
    assert math.isclose(aggregate("perplexity", lls), perplexity(lls), rel_tol=1e-12)
    assert math.isclose(aggregate("word_perplexity", pairs), weighted_perplexity(pairs), rel_tol=1e-12)
    assert math.isclose(aggregate("byte_perplexity", pairs), weighted_perplexity(pairs), rel_tol=1e-12)
    assert math.isclose(aggregate("bits_per_byte", pairs), bits_per_byte(pairs), rel_tol=1e-12)
    assert not math.isclose(aggregate("bits_per_byte", pairs), bits_per_byte([[a, b + 1] for a, b in pairs]),
                            rel_tol=1e-6)


def test_each_output_type_gets_its_judge_and_a_mixed_bank_refuses_another_scorer(tmp_path, offline, capsys):
    """The judge a run stops on by default, per output type; tasks of several types together: each item names its
    own task's judge, and a scorer that could judge only some of them is refused in one line, before anything starts
    or is written."""
    from certeval.harnesses.lm_eval_output_types import JUDGE
    from certeval.harnesses.lm_eval_tasks import load_task_items
    from certeval.runs.plan import task_scorer

    folder = tmp_path / "tasks"
    paths = write_output_tasks(folder)
    expected = {"conf_lambada": "greedy", "conf_ppl": "byte-likelihood", "conf_wino": "mc-loglik", "tiny_gen": "lm-eval"}
    for name, judge in expected.items():
        frame = load_task_items(paths[name])
        assert task_scorer(frame) == judge and JUDGE not in frame.columns, name
    frame = load_task_items(f"lm-eval:{','.join(TASKS)}?include_path={folder}")
    assert task_scorer(frame) == "lm-eval-task"
    judges = dict(zip(frame["item_id"], frame[JUDGE]))
    assert judges["conf_lambada/0"] == "greedy" and judges["conf_wino/0"] == "mc-loglik"
    assert judges["tiny_gen/0"] == "lm-eval:exact_match,strict-match"
    rc = main(["certify", "--model", "hf:bundled:smollm2", "--tasks", ",".join(TASKS), "--include_path", str(folder),
               "--scorer", "mc-loglik", "--goal", "halfwidth:0.1", "--output", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "several output types" in err and "'mc-loglik'" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def _close(a: float, b: float, rel: float = 1e-4, nats: float = 1e-4) -> bool:
    return math.isclose(float(a), float(b), rel_tol=rel, abs_tol=nats)


def _loglik(value) -> float:
    """A log-likelihood as a samples line holds it: a number, "(ll, flag)" text, or a list of either."""
    while isinstance(value, list):
        value = value[0]
    text = str(value).strip("()[] ")
    return float(text.split(",")[0])


@pytest.fixture()
def offline(tmp_path, monkeypatch):
    for key, value in {**OFFLINE, "HF_DATASETS_CACHE": str(tmp_path / "hf")}.items():
        monkeypatch.setenv(key, value)


@pytest.mark.slow
def test_every_output_type_item_by_item_as_lm_eval_in_one_mixed_run(infra, kept_actors, tmp_path, offline, capsys):
    """One lm-eval run and one certeval run over the four tasks together (``--tasks A,B,C,D --include_path``):
    each item asked and judged as its own task's, a samples file per task with a line per doc (and per filter), every
    per-item metric equal to lm-eval's and certified per task, lm-eval's perplexities reported (not certified)."""
    from certeval.inputs.smollm import ensure_converted

    folder = tmp_path / "tasks"
    write_output_tasks(folder)
    lm_out = tmp_path / "lm_eval.json"
    subprocess.run([sys.executable, "-c", RUNNER, str(folder), str(ensure_converted()), str(MAX_LENGTH),
                    str(lm_out), ",".join(TASKS)], check=True, timeout=600, env={**os.environ},
                   capture_output=True, text=True)
    lm = json.loads(lm_out.read_text())
    theirs = {name: {(s["doc_id"], s.get("filter", "none")): s for s in lm["samples"][name]} for name in TASKS}
    runs = tmp_path / "runs"
    kept_actors()
    rc = main(["certify", "--model", f"hf:bundled:smollm2?max_length={MAX_LENGTH}", "--tasks", ",".join(TASKS),
               "--include_path", str(folder), "--goal", "halfwidth:0.0001", "--batch-size", "13", "--run-id", "mixed",
               "--output", str(runs), "--ray-address", infra, "--log_samples"])
    out = capsys.readouterr()
    assert rc in (0, 1), out.err
    results = json.loads((runs / "mixed" / "results.json").read_text())
    model = results["models"][0]
    assert model["metric"] == "first_metric,none" and model["n_scored"] == 8 + 6 + 6 + 6
    per_task = model["task_metrics"]
    lines = {}
    for name in TASKS:
        path = next((runs / "mixed" / "samples").rglob(f"samples_{name}_*.jsonl"))
        lines[name] = {(line["doc_id"], line["filter"]): line for line in map(json.loads, path.read_text().splitlines())}
        assert set(lines[name]) == set(theirs[name]), name  # every doc, every filter: a line each

    def certified(task: str, key: str, expected: float) -> None:
        entry = per_task[task][key]
        assert entry["certified"] and entry["mean"] == pytest.approx(expected, abs=1e-12), (task, key)
        assert entry["lower"] <= entry["mean"] + 1e-9 and entry["mean"] - 1e-9 <= entry["upper"], (task, key)

    # LAMBADA-style: acc is is_greedy, certified; perplexity is lm-eval's aggregate, reported uncertified
    for key, line in lines["conf_lambada"].items():
        assert line["acc"] == theirs["conf_lambada"][key]["acc"]
        assert _close(line["perplexity"], theirs["conf_lambada"][key]["perplexity"])
    certified("conf_lambada", "acc,none", lm["results"]["conf_lambada"]["acc,none"])
    assert 0 < per_task["conf_lambada"]["acc,none"]["mean"] < 1  # some greedy and some not: the check can fail
    ppl = model["metrics_uncertified"]["perplexity,none"]
    assert _close(ppl["value"], lm["results"]["conf_lambada"]["perplexity,none"], nats=0) and not ppl["certified"]
    assert not per_task["conf_lambada"]["perplexity,none"]["certified"]

    # perplexity: each doc's rolling log-likelihood (several windows for the longer texts), lm-eval's three ratios
    for key, line in lines["conf_ppl"].items():
        mine, their = line["word_perplexity"], theirs["conf_ppl"][key]["word_perplexity"]
        assert _close(mine[0], _loglik(their[0]), rel=0) and mine[1] == their[1]
        assert line["bits_per_byte"][1] == theirs["conf_ppl"][key]["bits_per_byte"][1]
    for metric in ("word_perplexity", "byte_perplexity", "bits_per_byte"):
        value = model["metrics_uncertified"][f"{metric},none"]["value"]
        assert _close(value, lm["results"]["conf_ppl"][f"{metric},none"], nats=0), metric
    assert per_task["conf_ppl"]["byte_likelihood,none"]["certified"]  # certeval's own quantity, named as such

    # Winogrande-style: one continuation after each context; acc and acc_norm per doc
    for key, line in lines["conf_wino"].items():
        their = theirs["conf_wino"][key]
        assert (line["acc"], line["acc_norm"]) == (their["acc"], their["acc_norm"]), key
        for mine, other in zip(line["resps"], their["resps"]):
            assert _close(_loglik(mine), _loglik(other), rel=0)
    for metric in ("acc", "acc_norm"):
        certified("conf_wino", f"{metric},none", lm["results"]["conf_wino"][f"{metric},none"])

    # generation, two filters: a line per doc and filter, each filter's exact_match equal and certified
    for key, line in lines["tiny_gen"].items():
        their = theirs["tiny_gen"][key]
        assert line["exact_match"] == their["exact_match"], key
        assert line["filtered_resps"] == [str(their["filtered_resps"][0])], key
    for filt in ("strict-match", "flexible-extract"):
        certified("tiny_gen", f"exact_match,{filt}", lm["results"]["tiny_gen"][f"exact_match,{filt}"])
