"""Scheduled flows for deployments (``deployments/prefect.yaml``).

``select-checkpoints``: every checkpoint found in a folder or bucket prefix becomes a
model of one ``select`` run (shared items, weak checkpoints discarded early); the best
is kept and reported (``best.json`` in the run folder and a Prefect artifact).

A checkpoint is an entry of the folder:

* a sub-folder holding ``config.json`` (a transformers checkpoint) → ``hf:<path>``;
* a sub-folder holding ``model.spec``, or a file ``<name>.spec`` → the model spec written
  in it (one line, e.g. ``vllm:/ckpt/step-2000`` or ``replay:scores.parquet#step-2000``).

``certify-checkpoints``: the history-powered schedule. Each tick certifies every checkpoint of the
folder that has no run on its current files yet (one ``certify`` run each, run id ``ckpt-<name>``), with the
stored runs of the checkpoints already evaluated under ``output`` as history (plus any ``history`` sources): a
training run's later checkpoints cost fewer items, and every interval stays exact (method ``history``; the
checkpoint itself is never its own history). A checkpoint's earlier run is reused only when the fingerprint of
its files recorded in that run's ``config.json`` is the fingerprint now: weights copied over ``latest/`` or
``checkpoint-best/`` are certified anew, as run ``ckpt-<name>-<first 12 hex of the fingerprint>`` (one line on
stderr says why). ``checkpoints.json`` lists every checkpoint as its files are now, best mean first.

``rank-models``: a ranking run over a fixed list of model specs.

Each flow's ``options`` parameter is how its runs go: a mapping of the fields of
:class:`~certeval.runtime.options.RuntimeOptions` (actor start and batch timeouts, call log, start-up timeline,
cache folder), e.g. ``options: {batch_timeout_s: 3600}`` in a deployment; it is never part of a run's identity.
(A mapping, not the dataclass: a served flow's run unpickles the function without the names its annotations use.)
"""

from __future__ import annotations

import datetime as _dt
import re
import sys
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE

from certeval.errors import InputError
from certeval.flows.pipeline import certify_flow, rank_flow, select_flow
from certeval.inputs.model_fingerprint import MEMO_DIR, ModelFingerprint, fingerprint_models

# absolute imports: a deployment's entrypoint (deployments/prefect.yaml) names this file by path, and
# Prefect loads it as a script, where relative imports fail
from certeval.inputs.model_spec import parse_model_spec, quote_location
from certeval.messages import shown
from certeval.record.results import read_record
from certeval.requests import Certify, Rank, Select
from certeval.runs.plan import claim_run, make_plan
from certeval.runtime.options import runtime_options
from certeval.storage import Folder, RunStore, filesystem, is_local, safe_name


@task(name="find-checkpoints", cache_policy=NONE, retries=0)
def find_checkpoints(folder: str) -> list[str]:
    """Model specs of the checkpoints in ``folder`` (sorted by name)."""
    fs, path = filesystem(folder)
    try:
        entries = sorted(fs.ls(path, detail=True), key=lambda e: e["name"])
    except FileNotFoundError:
        raise InputError(f"checkpoint folder {folder!r} does not exist") from None
    local = is_local(fs)
    specs = []
    for entry in entries:
        name = entry["name"].rstrip("/")
        base = name.rsplit("/", 1)[-1]
        if base.startswith("."):
            continue
        if entry["type"] == "directory":
            if fs.exists(f"{name}/model.spec"):
                specs.append(fs.cat_file(f"{name}/model.spec").decode().strip())
            elif fs.exists(f"{name}/config.json"):
                if not local:
                    raise InputError(f"checkpoint {base!r} in {folder!r}: transformers checkpoints must be on a local "
                                     "path; put a model.spec (e.g. vllm:...) beside remote ones")
                specs.append(f"hf:{quote_location(name)}")
        elif base.endswith(".spec"):
            specs.append(fs.cat_file(name).decode().strip())
    if not specs:
        raise InputError(f"no checkpoint (sub-folder with config.json or model.spec, or a .spec file) in {folder!r}")
    return specs


@flow(name="select-checkpoints", validate_parameters=True, persist_result=False)
def select_checkpoints_flow(checkpoints: str, threshold: float = 0.0, halfwidth: float = 0.02,
                            bank: str | None = None, output: str | None = None, confidence: float = 0.95,
                            batch_size: int = 50, max_items: int | None = None, seed: int = 0,
                            scorer: str | None = None, ray_address: str | None = None, num_cpus: int | None = None,
                            num_gpus: float = 0.0, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Select the best checkpoint of a folder; return (and store) the report. ``num_cpus`` caps a local Ray (models
    beyond it share actors, queued); ``num_gpus`` is each model actor's share of a GPU."""
    specs = find_checkpoints(checkpoints)
    plan, prepared = make_plan(Select(models=specs, bank=bank, output=output, run_id=f"checkpoints-{_tick_stamp()}", confidence=confidence,
        batch_size=batch_size, max_items=max_items, seed=seed, scorer=scorer, threshold=threshold, halfwidth=halfwidth,
        mode="best", ray_address=ray_address, num_cpus=num_cpus, num_gpus=num_gpus, options=options))
    results = read_record(select_flow(plan, prepared=prepared.claimed(claim_run(plan))), f"run {plan.run_id!r}")
    selected = list(results.selection.selected)
    by_label = dict(zip(plan.labels, plan.models))
    best = selected[0] if selected else None
    entry = results.model(best) if best is not None else None
    report = {
        "checkpoints": specs, "best": best, "best_spec": by_label.get(best), "selected": selected,
        "discarded": list(results.selection.discarded),
        "best_estimate": None if entry is None else {"mean": entry.mean, "lower": entry.lower, "upper": entry.upper,
                                                     "n_scored": entry.n_scored},
        "run_folder": results.run_folder, "run_id": plan.run_id,
    }
    from certeval.reports.run_report import write_report

    report["report"] = write_report(results.run_folder).files.get("report.md")
    plan.store().folder.write_json("best.json", report)
    _report_artifact(report)
    return report


def _tick_stamp() -> str:
    """The scheduled time of this flow run (UTC, to the second): a retry or a re-run of the same tick after
    a crashed worker resumes the same run folder, and its score cache answers what was already paid for.
    Outside a deployment run it is the current time."""
    from prefect.runtime import flow_run

    when = flow_run.scheduled_start_time or _dt.datetime.now(_dt.UTC)
    return when.astimezone(_dt.UTC).strftime("%Y%m%d-%H%M%S")


def _report_artifact(report: dict[str, Any]) -> None:
    from prefect.artifacts import create_markdown_artifact

    est = report["best_estimate"] or {}
    lines = [f"# Best checkpoint: `{report['best']}`", "",
             f"spec `{report['best_spec']}`; mean {est.get('mean')} in [{est.get('lower')}, {est.get('upper')}] "
             f"over {est.get('n_scored')} items", "",
             f"still selected: {', '.join(report['selected'])}; discarded: {', '.join(report['discarded']) or 'none'}",
             "", f"run folder: {report['run_folder']}"]
    create_markdown_artifact("\n".join(lines), key="best-checkpoint", description="certeval checkpoint selection")


def _has_history(output: str, checkpoint: str) -> bool:
    """Whether ``output`` already holds a certeval run with stored rounds (history for the next checkpoint) other
    than the runs of ``checkpoint`` itself (``ckpt-<name>`` and its ``ckpt-<name>-<fingerprint>`` runs): a
    checkpoint is never its own history, so its earlier runs alone are none."""
    own = re.compile(rf"{re.escape(checkpoint)}(-[0-9a-f]{{12}})?")
    fs, path = filesystem(output)
    try:
        return any(fs.isdir(f"{p}/rounds") for p in fs.ls(path, detail=False)
                   if not own.fullmatch(p.rstrip("/").rsplit("/", 1)[-1]))
    except FileNotFoundError:
        return False


def checkpoint_run(output: str, spec: str, fingerprint: ModelFingerprint) -> tuple[str, str | None]:
    """The run id that certifies checkpoint ``spec`` on its files as they are now, and why its run ``ckpt-<name>``
    is not that run (None when it is). ``ckpt-<name>`` is the checkpoint's first run; once its ``config.json``
    records another fingerprint (weights copied over the folder since), or none (a run stored before fingerprints
    were recorded: what it certified cannot be told), the checkpoint's run is ``ckpt-<name>-<12 hex of the
    fingerprint>``: one per version of the files, so a version seen before is reused, never scored again."""
    label = parse_model_spec(spec).label
    first = f"ckpt-{safe_name(label)}"
    config = RunStore(output, first).read_config()
    if config is None:
        return first, None
    recorded = config.get("fingerprints")
    then = recorded[0] if isinstance(recorded, list) and recorded and isinstance(recorded[0], dict) else None
    if then is not None and then.get("digest") == fingerprint.digest:
        return first, None
    run_id = f"{first}-{fingerprint.digest[:12]}"
    if then is None:
        why = f"run {first!r} records no fingerprint of its files, so what it certified cannot be told"
    else:
        why = (f"its files changed since run {first!r} certified it (fingerprint {then.get('digest')} then, "
               f"{fingerprint.digest} now)")
    return run_id, f"checkpoint {label}: {why}; certifying it anew as run {run_id!r}"


@flow(name="certify-checkpoints", validate_parameters=True, persist_result=False)
def certify_checkpoints_flow(checkpoints: str, output: str, goal: str = "halfwidth:0.05", bank: str | None = None,
                             history: list[str] | None = None, confidence: float = 0.95, batch_size: int = 50,
                             max_items: int | None = None, seed: int = 0, scorer: str | None = None,
                             ray_address: str | None = None, num_cpus: int | None = None,
                             num_gpus: float = 0.0, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Certify every checkpoint of a folder not yet certified on its current files, learning from the checkpoints
    already certified in ``output``."""
    specs = find_checkpoints(checkpoints)
    # the files as they are now (bounded; read once per version of a file): which earlier run still answers
    fingerprints = fingerprint_models([parse_model_spec(s) for s in specs],
                                      runtime_options(options).cache_path() / MEMO_DIR)
    run_ids = {}
    for spec, fingerprint in zip(specs, fingerprints):
        run_id, why = checkpoint_run(output, spec, fingerprint)
        run_ids[spec] = run_id
        if RunStore(output, run_id).read_results() is not None:
            continue  # certified on these files on an earlier tick: never scored again
        if why is not None:
            print(f"certeval: {why}", file=sys.stderr, flush=True)
        own = f"ckpt-{safe_name(parse_model_spec(spec).label)}"
        sources = list(history or []) + ([output] if _has_history(output, own) else [])
        plan, prepared = make_plan(Certify(models=[spec], bank=bank, output=output, run_id=run_id, goal=goal,
                                        confidence=confidence, batch_size=batch_size, max_items=max_items, seed=seed,
                                        scorer=scorer, ray_address=ray_address, history=sources or None,
                                        num_cpus=num_cpus, num_gpus=num_gpus, options=options))
        certify_flow(plan, prepared=prepared.claimed(claim_run(plan)))
    rows = []
    for spec in specs:
        store = RunStore(output, run_ids[spec])
        res = read_record(store.read_results(), f"run folder {shown(store.url)}: results.json")
        for m in res.models:
            rows.append({"checkpoint": m.model, "spec": spec, "mean": m.mean, "lower": m.lower, "upper": m.upper,
                         "n_scored": m.n_scored, "method": m.method,
                         "history_models": list((m.history or {}).get("models", [])), "run_id": res.run_id})
    rows.sort(key=lambda r: -r["mean"])
    report = {"goal": goal, "checkpoints": rows, "best": rows[0]["checkpoint"] if rows else None,
              "note": "each interval is valid on its own at the stated confidence (not simultaneously)"}
    Folder(*filesystem(output)).write_json("checkpoints.json", report)
    return report


@flow(name="rank-models", validate_parameters=True, persist_result=False)
def rank_models_flow(models: list[str], bank: str | None = None, output: str | None = None, margin: float = 0.0,
                     confidence: float = 0.95, batch_size: int = 50, seed: int = 0,
                     ray_address: str | None = None, num_cpus: int | None = None, num_gpus: float = 0.0,
                     epsilon: float | None = None, options: dict[str, Any] | None = None) -> dict[str, Any]:
    """A scheduled ranking run over fixed model specs (``epsilon``: an epsilon-correct ranking instead of strict
    verdicts at ``margin``)."""
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    plan, prepared = make_plan(Rank(models=list(models), bank=bank, output=output, run_id=f"rank-{stamp}", margin=margin,
        confidence=confidence, batch_size=batch_size, seed=seed, ray_address=ray_address, num_cpus=num_cpus,
        num_gpus=num_gpus, epsilon=epsilon, options=options))
    return rank_flow(plan, prepared=prepared.claimed(claim_run(plan)))
