"""``certeval rescore``: judge a stored run's model outputs again with another scorer, without any model call.

Generation is kept apart from judging: every round file (and the score cache) keeps the model's output and
the item's prompt hash next to the score. A rescore reads them and replays the run round by round through a
fresh instance of the run's method, with the scores the new scorer gives those outputs:

* each round, the fresh method proposes its items with the run's own randomness (``seed``, round), exactly as
  a live run with the new scorer would; when they are the items the source run scored in that round, their
  recorded outputs are judged and absorbed, and the stopping rules look at the new scores;
* when the method asks for items the source run never scored (the source stopped earlier, or the method's
  selection depended on the old scores: ``adaptive``'s stratum allocation, ``cer-eval``'s partition,
  ``history``'s draw weights), the model stops there, with rule ``recorded`` (goal not reached).

Up to that round the rescored run *is* the run the method would have made with the new scorer, and stopping
there is a stopping time, so an anytime-valid interval (every ``certify`` method but ``static``; every paired
run's per-model and pairwise sequences) holds at it. A method that is valid only at its planned budget
(``static``) and would be cut short is refused (exit 2, nothing written). Paired runs (compare, rank, select)
sample one seeded order (∝ the estimand's weights on the bank target) that never depends on scores, so they
replay exactly as far as the source run scored every model still in play.

The whole rescored run is built in memory first and copied to the new run folder only when it is complete
(each file written atomically, ``results.json`` last), so bad input writes nothing and the source run is
never touched.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd

from certeval.engine import play
from certeval.errors import InputError
from certeval.estimators.results import Decision
from certeval.inputs.model_spec import parse_model_spec
from certeval.messages import shown
from certeval.record.results import RunResults, read_record
from certeval.runs.plan import read_run_config
from certeval.runs.round_steps import RunSteps
from certeval.scoring import scorers as sc
from certeval.storage import (
    Folder,
    RunStore,
    bounded,
    check_folder,
    check_reachable,
    filesystem,
    is_local,
    prompt_hash,
    safe_name,
)

RULE = "recorded"  # decision rule of a model whose replay reached the end of what the source run scored
GENERATION_SCORERS = ("exact", "normalized", "numeric")


class RecordedOutputs:
    """Stands in for the model pool: answers with the source run's recorded outputs, judged by ``scorer``."""

    def __init__(self, outputs: dict[tuple[str, str], str], scorer: sc.Scorer) -> None:
        self.outputs = outputs
        self.scorer = scorer
        self.stats = SimpleNamespace(batches=0, resubmitted=0, replaced_actors=0, placement=[])

    def score(self, requests: dict[str, list[tuple[str, dict[str, Any]]]], batch_size: int,
              on_result: Any = None) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for label, pairs in requests.items():
            results = []
            for _, item in pairs:
                self.scorer.check_item(item)
                output = self.outputs[(label, str(item["item_id"]))]
                results.append({"item_id": str(item["item_id"]), "score": sc.judge(self.scorer, output, item),
                                "output": output, "tokens": 0, "latency_s": 0.0})
            out[label] = results
            if on_result is not None:
                on_result(label, results)
        return out


def _source(run: str) -> tuple[RunStore, dict, RunResults, pd.DataFrame]:
    """The source run's store, config, results and rounds; InputError when it is not a finished run."""
    fs, path = filesystem(str(run))
    if bounded(fs, "isfile", path):
        raise InputError(f"rescore: {run!r} is a file, not a run folder")
    if not is_local(fs) or os.path.lexists(path):
        check_folder(str(run), "rescore: run folder")
    folder = Folder(fs, path)
    config = folder.read_json("config.json")
    if config is None:
        raise InputError(f"rescore: no run at {run!r} (it has no config.json)")
    if not isinstance(config, dict) or config.get("kind") not in ("certify", "compare", "rank", "select"):
        raise InputError(f"rescore: {run!r} is not a certify/compare/rank/select run (config.json kind "
                         f"{shown(config.get('kind') if isinstance(config, dict) else None)})")
    read_run_config(config, f"rescore: run {run!r}'s config.json")
    results = folder.read_json("results.json")
    if results is None:
        raise InputError(f"rescore: run {run!r} has no results.json (interrupted or still running): finish it "
                         "first with the same --run-id")
    # the typed record: not a newer schema, a kind, field or part this version does not know
    results = read_record(results, f"rescore: run {run!r}'s results.json")
    url = folder.url()
    root, _, run_id = url.rstrip("/").rpartition("/")
    store = RunStore(root or ".", run_id)
    store.verify_record()  # an edited output, a deleted or stray round: refused, never re-judged
    rounds = store.read_rounds()
    if not len(rounds):
        raise InputError(f"rescore: run {run!r} has no scored items")
    return store, config, results, rounds


def anchored(text: str | None, workdir: str | None) -> str | None:
    """``text`` (a bank or history source) with a relative local path made absolute against the run's working
    folder ``workdir``, so a run can be rescored from any folder; URLs, ``bundled:``/``synthetic:`` sources, absolute
    paths and runs stored before ``workdir`` was kept (None) are returned as they are."""
    if not text or not workdir or ":" in text.split("?", 1)[0].split("/", 1)[0]:
        return text
    return text if os.path.isabs(text) else os.path.join(workdir, text)


def _anchored_config(config: dict) -> dict:
    workdir = config.get("workdir") if isinstance(config.get("workdir"), str) else None
    history = config.get("history")
    return {**config, "bank": anchored(config.get("bank"), workdir),
            "history": [anchored(h, workdir) for h in history] if isinstance(history, list) else history}


def _source_scorer(config: dict) -> str | None:
    named = [parse_model_spec(m).option("scorer") for m in config.get("models") or []]
    named = [n for n in named if n]
    return named[0] if named else config.get("scorer")


def _check_outputs(run: str, config: dict, rounds: pd.DataFrame) -> None:
    specs = dict(zip(config.get("labels") or [], config.get("models") or []))
    if "output" not in rounds.columns:
        raise InputError(f"rescore: run {run!r} keeps no model outputs (stored before outputs were kept); "
                         "only runs with outputs can be re-judged")
    missing = rounds[rounds["output"].isna()]
    if len(missing):
        model = str(missing["model"].iloc[0])
        kind = parse_model_spec(specs[model]).kind if model in specs else "?"
        why = "a replay model has recorded scores, not outputs" if kind == "replay" else "none was stored"
        raise InputError(f"rescore: run {run!r} has no output for model {model!r} on item "
                         f"{str(missing['item_id'].iloc[0])!r} ({why}); only runs with outputs can be re-judged")


def _check_scorer(name: str, source_scorer: str | None, columns: list[str], bank: str | None) -> sc.Scorer:
    scorer = sc.get_scorer(name)
    if scorer.kind != sc.GENERATE:
        raise InputError(f"rescore: scorer {name!r} judges per-choice log-likelihoods, which a run does not store "
                         f"(it keeps the chosen answer); use a generation scorer ({', '.join(GENERATION_SCORERS)} "
                         "or package.module:function)")
    if source_scorer not in (None, "", "auto") and _kind(source_scorer) == sc.LOGLIK:
        raise InputError(f"rescore: the run was scored with {source_scorer!r} (multiple choice by log-likelihood): "
                         "its outputs are chosen choices, not generated answers, so there is nothing to re-judge")
    scorer.check_fields(columns, source=f"bank {bank!r}")
    return scorer


def _kind(name: str) -> str | None:
    """The kind of the source run's scorer; None for a custom one, which is never imported from a stored config
    (importing a module named by a run folder would run code from whoever wrote it)."""
    try:
        return sc.get_scorer(name, allow_import=False).kind
    except InputError:
        return None


def _plan(config: dict, *, scorer: str, output: str, run_id: str):
    from certeval.runs.plan import RunPlan

    fields = {f.name for f in dataclasses.fields(RunPlan)}
    # the rescore is a new command (invocation) and starts no model (options, fingerprints: as recorded)
    kw = {k: v for k, v in config.items() if k in fields and k not in ("invocation", "options", "fingerprints")}
    kw.update(models=tuple(config["models"]), labels=tuple(config["labels"]), history=tuple(config.get("history") or ()),
              output=output, run_id=run_id, scorer=scorer, ray_address=None, replicas=1, num_gpus=0.0,
              num_cpus=None, in_flight=1, chunk_size=None, fingerprints=_fingerprints(config))
    try:
        return RunPlan(**kw)
    except TypeError as exc:
        raise InputError(f"rescore: config.json of the run is damaged ({exc})") from None


def _fingerprints(config: dict) -> tuple:
    """The source run's model fingerprints as recorded (no model file is read: a rescore asks no model, and its
    models' folders may be gone); each model named by its spec where the run recorded none."""
    from certeval.inputs.model_fingerprint import ModelFingerprint, address_fingerprint

    recorded = config.get("fingerprints")
    models = list(config["models"])
    if (isinstance(recorded, list) and len(recorded) == len(models)
            and all(isinstance(r, dict) and isinstance(r.get("covers"), str) and isinstance(r.get("digest"), str)
                    for r in recorded)):
        return tuple(ModelFingerprint(r["covers"], r["digest"]) for r in recorded)
    return tuple(address_fingerprint(str(m)) for m in models)


def rescore_run(run: str, scorer: str, *, output: str | None = None, run_id: str | None = None) -> tuple[dict, int]:
    """Re-judge run folder ``run`` with ``scorer`` into a new run folder; return (results, exit code)."""
    from certeval.runs.inputs import load_run_bank

    src_store, config, _, rounds = _source(run)
    config = _anchored_config(config)
    bank_text = config.get("bank")
    if bank_text and anchored(bank_text, "/") != bank_text and not os.path.exists(bank_text.split("?", 1)[0]):
        raise InputError(f"rescore: run {run!r} names its bank by the relative path {bank_text!r} and does not "
                         "record the folder it was started in (stored by an older certeval): rescore it from that "
                         "folder")
    from certeval.harnesses.lm_eval_tasks import is_lm_eval_task

    if is_lm_eval_task(bank_text):  # what a run folder names is never run: an lm-eval YAML's hooks are code
        raise InputError(f"rescore: run {run!r} was built from the lm-eval task {bank_text!r}; building that bank "
                         "runs the task's own code, which certeval does not do for a name read from a run folder — "
                         "run the task again with --tasks and the scorer you want")
    source_url = src_store.url
    source_scorer = _source_scorer(config)
    _check_outputs(run, config, rounds)
    bank = load_run_bank(config.get("bank"), tuple(config["models"]))
    columns = [c for c in bank.frame.columns if bank.frame[c].notna().any()] if bank.frame is not None else ["item_id"]
    scorer_obj = _check_scorer(scorer, source_scorer, columns, config.get("bank"))
    from certeval.scoring.lm_eval_generation import check_scoring_column, is_lm_eval_scorer

    if is_lm_eval_scorer(scorer_obj.name):  # the bank's metric and filter names: lm-eval's registered ones only
        check_scoring_column(bank.frame, f"rescore --scorer {scorer}: bank {config.get('bank')!r}")
    # the bank must still ask what the run asked: the recorded prompt hash of every item
    hashes = {str(r["item_id"]): prompt_hash(r) for r in bank.frame.to_dict("records")} if bank.frame is not None else {}
    # (accepted answers are not part of it: a corrected answer key is what a rescore may be for)
    for iid, recorded in zip(rounds["item_id"].astype(str), rounds.get("prompt_hash", pd.Series([None] * len(rounds)))):
        if iid not in hashes:
            raise InputError(f"rescore: item {iid!r} of run {run!r} is not in its bank {config.get('bank')!r} any more")
        if recorded is not None and not (isinstance(recorded, float) and np.isnan(recorded)) and recorded != hashes[iid]:
            raise InputError(f"rescore: item {iid!r} was asked with prompt hash {recorded!r}, the bank "
                             f"{config.get('bank')!r} now gives {hashes[iid]!r}: its recorded output answers another prompt")
    dest_root = output or src_store.root.url()
    dest_id = run_id or f"{src_store.run_id}-rescore-{safe_name(scorer)}"[:128]
    dest = RunStore(dest_root, dest_id)
    check_reachable(dest_root)
    if _taken(dest):  # a stray round or a link there would be adopted as part of the new run
        raise InputError(f"rescore: run folder {dest.url} already exists; pass another --run-id or --output")
    outputs = {(str(m), str(i)): str(o) for m, i, o in zip(rounds["model"], rounds["item_id"], rounds["output"])}
    recorded = {(int(r), str(m)): list(g["item_id"].astype(str))
                for (r, m), g in rounds.groupby(["round", "model"], sort=False)}

    memory_root = f"memory://certeval-rescore-{uuid.uuid4().hex}"
    plan = _plan(config, scorer=scorer_obj.name, output=memory_root, run_id=dest_id)
    try:
        result, code, stops = _replay(plan, recorded, RecordedOutputs(outputs, scorer_obj))
        record = read_record(result, "the rescored run's results.json")
        result = record.replace(
            scorer=scorer_obj.name,
            rescore={
                "source_run": source_url, "source_scorer": source_scorer, "scorer": scorer_obj.name,
                "model_calls": 0, "stopped_at_record_end": stops,
                "rule": "the run's method re-run round by round with the run's seed on the recorded items, scored by "
                        "judging the recorded outputs with the new scorer; a model stops (rule 'recorded') at the "
                        "first round whose items the source run did not score"},
            run_folder=dest.url,
            pipeline=dataclasses.replace(record.pipeline, ray_address=None, batches=0),  # no Ray, no model host
        ).to_json()
        _copy(plan.store(), dest, result, output=dest_root, source=source_url)
        return result, code
    finally:
        fs, path = filesystem(memory_root)
        try:
            fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass


def _replay(plan, recorded: dict[tuple[int, str], list[str]], pool: RecordedOutputs) -> tuple[dict, int, dict]:
    """The round loop of a live run, with recorded outputs for a model pool; returns (results, exit code,
    {model: round at which its record ended})."""
    from certeval.runs.run import Run

    run = Run.open(plan)
    stops: dict[str, int] = {}
    try:
        run.embed()
        run.restore()
        play(_RecordedSteps(run, pool, recorded, stops))
        if stops and plan.paired and run.round > 0:  # the final decisions, as a finished paired run stores them
            for label in run.labels:
                run.store.write_state(label, {"round": run.round - 1, "method_state": run.methods[label].state(),
                                              "decision": run.decisions[label].to_dict() if label in run.decisions else None})
            run.store.commit_round({"round": run.round - 1, "active": [], "looks": run.looks,
                                    "decisions": {k: v.to_dict() for k, v in run.decisions.items()}})
        for label in stops:  # its final decision, next to the method state it closes with
            if not plan.paired and run.model_round.get(label, 0) > 0:
                run.store.write_state(label, {"round": run.model_round[label] - 1,
                                              "method_state": run.methods[label].state(),
                                              "decision": run.decisions[label].to_dict()})
            est = run.methods[label].result()
            if not est.anytime_valid:
                raise InputError(f"rescore: method {plan.method!r} is valid only at its planned budget, and the "
                                 f"replay of model {label!r} would stop at round {stops[label]} (its selection needs "
                                 "items the run never scored); nothing was written")
        run.sent = {label: 0 for label in run.labels}  # no model was asked anything
        result = run.results()
        return result, run.exit_code(), stops
    finally:
        if run.owns_lock:
            run.store.release_lock()


class _RecordedSteps(RunSteps):
    """A live run's rounds with recorded outputs for a model pool: a model whose round asks for items the source
    run did not score stops there (in a paired run, every model: one shared order)."""

    def __init__(self, run: Any, pool: RecordedOutputs, recorded: dict[tuple[int, str], list[str]],
                 stops: dict[str, int]) -> None:
        super().__init__(run, pool)
        self.recorded, self.stops = recorded, stops

    def select(self):
        run = self.run
        while not run.done:
            batch = super().select()
            if batch is None:
                return None
            short = [label for label, pos in batch.items.items()
                     if self.recorded.get((run.round, label)) != [run.bank.item_ids[p] for p in pos]]
            if short and run.plan.paired:  # one shared order: the record ends for every model still in play
                for label in run.active:
                    self.stops[label] = run.round
                    run.decisions[label] = Decision(True, RULE, len(run.looks), False, None, _why(run.round))
                run.active = []
                return None
            for label in short:
                self.stops[label] = run.round
                del batch.items[label], batch.probs[label]
                run.decisions[label] = Decision(True, RULE, run.round, False, None, _why(run.round))
                run.active.remove(label)
            if batch.items:
                return batch
        return None


def _taken(dest: RunStore) -> bool:
    """Whether anything stands where the new run folder would go: a folder (even without config.json), a file,
    or a link (followed, it would write elsewhere)."""
    folder = dest.folder
    if folder.local:
        return os.path.lexists(folder.path)
    return bool(folder.list("") or folder.list("rounds") or folder.list("state"))


def _why(round_: int) -> str:
    return (f"the source run has no outputs for the items selected at round {round_} (it stopped earlier, or "
            "its selection depended on its own scores)")


def _copy(memory: RunStore, dest: RunStore, result: dict, *, output: str, source: str) -> None:
    """Copy the rescored run from memory into its folder: data first, config.json, results.json last."""
    config = memory.read_config() or {}
    config.update(output=output, rescore={"source_run": source, "scorer": result["scorer"]})
    took = dest.acquire_lock()
    started = False
    try:
        if dest.read_config() is not None:
            raise InputError(f"rescore: run folder {dest.url} already exists; pass another --run-id or --output")
        started = True  # from here on the folder is this command's own (it was not there: _taken)
        _write_all(memory, dest, result, config)
    except BaseException:
        if took and started:  # a folder this command made and could not finish: none is left
            _remove(dest)
            took = False
        raise
    finally:
        if took:
            dest.release_lock()


def _remove(dest: RunStore) -> None:
    """Remove a run folder :func:`_copy` created and could not finish (a full disk, a read-only store, an
    interrupt): no half-written run is left to be taken for a whole one."""
    folder = dest.folder
    try:
        dest.release_lock()
    except Exception:  # the lock's own storage may be what failed
        pass
    try:
        if folder.local:
            import shutil

            shutil.rmtree(folder.path, ignore_errors=True)
        else:
            bounded(folder.fs, "rm", folder.path, recursive=True)
    except Exception:  # best effort: the first failure is the one reported
        pass


def _write_all(memory: RunStore, dest: RunStore, result: dict, config: dict) -> None:
    """Data first, config.json, results.json last."""
    for sub in ("rounds", "state"):
        for name in memory.folder.list(sub):
            dest.folder.write_bytes(f"{sub}/{name}", memory.folder.read_bytes(f"{sub}/{name}"))
    for name in memory.folder.list(""):
        if name.endswith(".parquet") or name == "manifest.json":
            dest.folder.write_bytes(name, memory.folder.read_bytes(name))
    if result.get("pairs_file"):
        result["pairs_file"] = dest.folder.url("pairs.parquet")
    dest.folder.write_json("config.json", config)
    dest.write_results(result)
