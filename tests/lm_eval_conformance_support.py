"""The differential conformance suite's shared parts: task shapes written as local lm-eval tasks (JSONL docs and a
YAML each, offline), ONE real lm-eval run (what ``lm_eval run --model hf --log_samples`` runs) over all of a file's
shapes, its samples read back per task and doc, and the per-item comparison of a multiple-choice doc's
log-likelihoods and flags.

A file of the suite writes its shapes (:class:`Shape`), runs lm-eval once (:func:`run_lm_eval`), runs certeval once
on the same tasks and compares item by item (:func:`mc_differences`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
LOGLIK_TOLERANCE = 1e-4  # nats: a choice's log-likelihood, certeval's against lm-eval's


@dataclass(frozen=True)
class Shape:
    """One local lm-eval task: its docs and the YAML keys beyond the dataset's (``doc_to_text``, ``doc_to_choice``,
    ``doc_to_target``, ``target_delimiter``, ``num_fewshot``, ``metric_list``, ...). ``output_type`` defaults to
    multiple_choice; the docs are its test split and its few-shot split."""

    name: str
    docs: list[dict[str, Any]]
    config: dict[str, Any] = field(default_factory=dict)

    def write(self, folder: Path) -> Path:
        folder.mkdir(parents=True, exist_ok=True)
        docs = folder / f"{self.name}.jsonl"
        docs.write_text("".join(json.dumps(doc) + "\n" for doc in self.docs))
        config = {"task": self.name, "dataset_path": "json", "dataset_kwargs": {"data_files": {"test": str(docs)}},
                  "test_split": "test", "fewshot_split": "test", "output_type": "multiple_choice",
                  "num_fewshot": 0, **self.config}
        path = folder / f"{self.name}.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))
        return path


def write_shapes(folder: Path, shapes: list[Shape]) -> list[str]:
    """Every shape's YAML and docs in ``folder`` (an ``--include_path``); the task names."""
    for shape in shapes:
        shape.write(folder)
    return [shape.name for shape in shapes]


def offline_vars(cache: Path) -> dict[str, str]:
    """What makes lm-eval and datasets offline, datasets' cache in ``cache`` (a test sets them with monkeypatch)."""
    return {**OFFLINE, "HF_DATASETS_CACHE": str(cache)}


# What ``lm_eval run --model hf --tasks ... --include_path DIR --output_path OUT --log_samples`` runs (lm-eval
# 0.4.13's _cli/run.py: simple_evaluate, then its EvaluationTracker writes the results and samples files), with one
# difference: lm-eval's task index holds the include_path folder alone. The command line also indexes lm-eval's
# ~14,000 built-in task YAMLs, which took the fixture half a minute to a minute of CPU and is not what is compared.
RUNNER = textwrap.dedent("""
    import sys
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    folder, names, model_dir, out, batch_size = sys.argv[1], sys.argv[2].split(","), sys.argv[3], sys.argv[4], sys.argv[5]
    tracker = EvaluationTracker(output_path=out)
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir},dtype=float32", device="cpu",
                                      batch_size=int(batch_size), tasks=names, log_samples=True,
                                      evaluation_tracker=tracker,
                                      task_manager=TaskManager(include_path=folder, include_defaults=False))
    samples = results.pop("samples")
    tracker.save_results_aggregated(results=results, samples=samples)
    for name in names:
        tracker.save_results_samples(task_name=name, samples=samples[name])
""")


def run_lm_eval(folder: Path, names: list[str], model_dir: str, out: Path, batch_size: int = 8,
                cache: Path | None = None, timeout: int = 600) -> dict[str, dict[int, dict]]:
    """One real lm-eval run (:data:`RUNNER`: the ``hf`` model on ``model_dir`` in float32 on the CPU) over the tasks
    ``names`` of ``folder``, samples logged: ``task -> doc_id -> sample line``. ``cache``: datasets' cache folder
    (certeval's build of the same tasks in the test's process then reuses the prepared datasets)."""
    command = [sys.executable, "-c", RUNNER, str(folder), ",".join(names), model_dir, str(out), str(batch_size)]
    done = subprocess.run(command, env={**os.environ, **offline_vars(cache or out / "hf_datasets")},
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return {name: read_samples(out, name) for name in names}


def read_samples(out: Path, task: str) -> dict[int, dict]:
    """``doc_id -> sample line`` of the one samples file lm-eval wrote for ``task`` under ``out``."""
    files = sorted(out.rglob(f"samples_{task}_*.jsonl"))
    assert len(files) == 1, (task, files)
    return {line["doc_id"]: line for line in map(json.loads, files[0].read_text().splitlines())}


def logliks(sample: dict) -> list[float]:
    """A multiple-choice sample's log-likelihood per choice (its ``filtered_resps``: ``[loglik, is_greedy]``)."""
    return [float(pair[0]) for pair in sample["filtered_resps"]]


def mc_differences(theirs: dict[int, dict], ours: dict[int, dict[str, Any]], metrics: tuple[str, ...] = ("acc",
                   "acc_norm")) -> list[str]:
    """Every way one task's items differ from lm-eval's samples ``theirs``: ``ours`` maps doc_id to
    ``{"logliks": [...], <metric>: flag, ...}`` (a metric left out is not compared). A doc missing on either side,
    a flag not equal, a log-likelihood more than :data:`LOGLIK_TOLERANCE` nats away."""
    out = []
    if set(theirs) != set(ours):
        out.append(f"docs {sorted(theirs)} vs {sorted(ours)}")
    for doc_id in sorted(set(theirs) & set(ours)):
        lm, mine = logliks(theirs[doc_id]), ours[doc_id]["logliks"]
        if len(lm) != len(mine) or max(abs(a - b) for a, b in zip(lm, mine)) > LOGLIK_TOLERANCE:
            out.append(f"doc {doc_id}: logliks {mine} vs lm-eval {lm}")
        for metric in metrics:
            if metric in ours[doc_id] and float(ours[doc_id][metric]) != float(theirs[doc_id][metric]):
                out.append(f"doc {doc_id}: {metric} {ours[doc_id][metric]} vs lm-eval {theirs[doc_id][metric]}")
    return out
