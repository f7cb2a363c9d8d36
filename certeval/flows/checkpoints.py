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

Each flow takes the public request of its question (:mod:`certeval.requests`: :class:`~certeval.requests.Select`,
:class:`~certeval.requests.Certify`, :class:`~certeval.requests.Rank`) as its ``request`` parameter; a deployment
gives it as a mapping of the request's fields (``request: {bank: ..., output: ..., threshold: 0.3}``), turned into
the request by :func:`~certeval.requests.request_for` (an unknown field refused in one line) and validated by
:func:`~certeval.runs.plan.make_plan` as every request is. The fields a flow sets itself (the checkpoints as the
models, the run id) must be left unset. Its ``options`` are how the runs go: a mapping of the fields of
:class:`~certeval.runtime.options.RuntimeOptions` (actor start and batch timeouts, call log, start-up timeline,
cache folder), e.g. ``options: {batch_timeout_s: 3600}``; never part of a run's identity. (Parameters are not
validated by Prefect: a served flow's run unpickles the function without the names its annotations use.)
"""

from __future__ import annotations

import datetime as _dt
import re
import sys
from collections.abc import Mapping
from dataclasses import fields, replace
from typing import Any, TypeVar

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
from certeval.requests import Certify, Rank, Request, Select, field_default, request_for
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


AskedFor = TypeVar("AskedFor", bound=Request)

# the flows' own defaults, where the request leaves a field unset (None)
SELECT_DEFAULTS = {"threshold": 0.0, "halfwidth": 0.02}  # select-checkpoints: best checkpoint within 0.02
CERTIFY_DEFAULTS = {"goal": "halfwidth:0.05"}  # certify-checkpoints


def flow_request(cls: type[AskedFor], given: Any, flow_name: str, sets: tuple[str, ...],
                 defaults: Mapping[str, Any] | None = None) -> AskedFor:
    """The request a flow was given: the request itself (Python), a mapping of its fields (a deployment's
    parameters, an unknown field refused in one line), or None (every field's default); the fields the flow sets
    itself (``sets``) must keep their defaults, and the flow's own ``defaults`` fill the fields left None."""
    if isinstance(given, cls):
        request = given
    elif given is None:
        request = cls()
    elif isinstance(given, Mapping):
        request = request_for(cls.kind, **given)
    else:
        raise InputError(f"{flow_name}: request must be a {cls.__name__} or a mapping of its fields, got "
                         f"{type(given).__name__}")
    default = {f.name: field_default(f) for f in fields(cls)}
    for name in sets:
        value = getattr(request, name)
        if (tuple(value) if isinstance(value, list) else value) != default[name]:
            raise InputError(f"{flow_name} sets the request's {name} itself; leave it out (got {value!r})")
    return replace(request, **{k: v for k, v in (defaults or {}).items() if getattr(request, k) is None})


@flow(name="select-checkpoints", validate_parameters=False, persist_result=False)
def select_checkpoints_flow(checkpoints: str, request: Select | None = None) -> dict[str, Any]:
    """Select the best checkpoint of a folder; return (and store) the report. ``request``: the selection's settings
    (its models are the checkpoints, its run id the tick's, its mode ``best``; threshold 0 and half-width 0.02 when
    unset); its ``num_cpus`` caps a local Ray (models beyond it share actors, queued), its ``num_gpus`` is each
    model actor's share of a GPU."""
    asked = flow_request(Select, request, "select-checkpoints", ("models", "run_id", "mode"), SELECT_DEFAULTS)
    specs = find_checkpoints(checkpoints)
    plan, prepared = make_plan(replace(asked, models=tuple(specs), run_id=f"checkpoints-{_tick_stamp()}"))
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


@flow(name="certify-checkpoints", validate_parameters=False, persist_result=False)
def certify_checkpoints_flow(checkpoints: str, request: Certify) -> dict[str, Any]:
    """Certify every checkpoint of a folder not yet certified on its current files, learning from the checkpoints
    already certified in the request's ``output`` (required). ``request``: the certification's settings (its models
    are the checkpoints, one run each, its run id each checkpoint's; goal ``halfwidth:0.05`` when unset; its
    ``history`` sources are used beside the earlier checkpoints' runs)."""
    asked = flow_request(Certify, request, "certify-checkpoints", ("models", "run_id"), CERTIFY_DEFAULTS)
    output, goal = asked.output, asked.goal
    if output is None:
        raise InputError("certify-checkpoints needs the request's output: the folder of the checkpoints' runs, "
                         "which are the next checkpoint's history")
    specs = find_checkpoints(checkpoints)
    # the files as they are now (bounded; read once per version of a file): which earlier run still answers
    fingerprints = fingerprint_models([parse_model_spec(s) for s in specs],
                                      runtime_options(asked.options).cache_path() / MEMO_DIR)
    run_ids = {}
    for spec, fingerprint in zip(specs, fingerprints):
        run_id, why = checkpoint_run(output, spec, fingerprint)
        run_ids[spec] = run_id
        if RunStore(output, run_id).read_results() is not None:
            continue  # certified on these files on an earlier tick: never scored again
        if why is not None:
            print(f"certeval: {why}", file=sys.stderr, flush=True)
        own = f"ckpt-{safe_name(parse_model_spec(spec).label)}"
        sources = (*(asked.history or ()), *([output] if _has_history(output, own) else []))
        plan, prepared = make_plan(replace(asked, models=(spec,), run_id=run_id, history=sources))
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


@flow(name="rank-models", validate_parameters=False, persist_result=False)
def rank_models_flow(request: Rank) -> dict[str, Any]:
    """A scheduled ranking run of the request's fixed model specs (its run id the time's; ``epsilon``: an
    epsilon-correct ranking instead of strict verdicts at ``margin``)."""
    asked = flow_request(Rank, request, "rank-models", ("run_id",))
    stamp = _dt.datetime.now(_dt.UTC).strftime("%Y%m%d-%H%M%S")
    plan, prepared = make_plan(replace(asked, run_id=f"rank-{stamp}"))
    return rank_flow(plan, prepared=prepared.claimed(claim_run(plan)))
