"""The state of one pipeline run between rounds, and the work of each step (docs/architecture.md §1).

What is decided each round is the engine's (:class:`certeval.engine.SingleModelRounds` for certify,
:class:`certeval.engine.PairedRounds` for compare/rank/select); a Run adds where scores come from (Ray actors
through the score cache) and where looks go (the run folder). The Prefect tasks in :mod:`certeval.runs.steps`
are one-line wrappers around its methods. A certify model's ``state/<model>.json`` is its commit point, written
after the round's Parquet file; a paired run's ``state/_run.json`` commits a round and resumes by replaying the
rounds. Randomness is keyed by ``(seed, round)``: a resumed run proposes what an uninterrupted one would have,
and the score cache answers whatever was paid for before a crash.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from certeval.engine import PairedRounds, SingleModelRounds, paired_order_rng
from certeval.errors import InputError
from certeval.estimators import make_method, method_for_goal, method_from_state, parse_goal
from certeval.estimators.groups import GroupRequest
from certeval.estimators.results import Decision
from certeval.inputs.banks import Bank, bank_features
from certeval.record.looks import TEXT_FIELDS as LOOK_TEXT_FIELDS
from certeval.record.looks import LookRecord
from certeval.scoring.lm_eval_metrics import RESPS, pack_output, resps_text, unpack_output
from certeval.storage import RunStore, item_key, safe_name

from .inputs import PreparedRun, prepare_run
from .plan import RunPlan
from .progress import run_progress
from .run_requests import ItemRequests


@dataclass
class RoundScores:
    """Scores of one round: per model, bank positions and scores in proposal order."""

    items: dict[str, np.ndarray]
    probs: dict[str, np.ndarray]
    scores: dict[str, np.ndarray] = field(default_factory=dict)
    fresh: dict[str, int] = field(default_factory=dict)  # items sent to a model (not from the cache)
    outputs: dict[str, list] = field(default_factory=dict)  # the model's answer per item (None: replay, none)
    resps: dict[str, list] = field(default_factory=dict)  # lm-eval's resps of a log-likelihood item (JSON text)


def _timed(phase: str):
    """A step's wall time added to the run's ``phase_s[phase]`` (results.json ``pipeline.phases``)."""
    def wrap(method):
        @functools.wraps(method)
        def timed(self, *args, **kwargs):
            began = time.perf_counter()
            try:
                return method(self, *args, **kwargs)
            finally:
                self.phase_s[phase] += time.perf_counter() - began
        return timed
    return wrap


def proposes_ahead(plan: RunPlan, pool: Any) -> bool:
    """Whether a run queues the next round's items while it decides (``--propose-ahead``: ``auto`` when a model is
    not a replay of recorded scores, whose calls cost nothing to wait for). Only a prediction: the next round
    selects as it always does and takes from what was scored ahead only the items it selected."""
    mode = getattr(plan.options, "propose_ahead", "auto")
    if mode == "off" or not getattr(pool, "supports_ahead", False):
        return False
    return mode == "on" or any(not spec.startswith("replay:") for spec in plan.models)


class Run:
    """Everything a running flow carries from round to round. One subclass per run shape: :class:`SingleRun`
    (certify: each model's method proposes its own items) and :class:`PairedRun` (compare, rank, select: one
    shared order, a group estimator decides); :meth:`open` builds the one the plan asks for."""

    paired = False

    def __init__(self, plan: RunPlan, bank: Bank, store: RunStore) -> None:
        self.plan = plan
        self.bank = bank
        self.store = store
        self.labels = list(plan.labels)
        self.spec = bank.spec(mean_of_means=plan.mean_of_means)
        self.codes = self.spec.subset_codes() if bank.subsets is not None else None
        self.keys = self._item_keys()
        self.item_requests = ItemRequests(bank, self.keys)
        self.fingerprints = dict(zip(self.labels, plan.model_fingerprints()))
        self.cache_keys = plan.cache_keys()
        self.caches = {label: store.cache(key) for label, key in self.cache_keys.items()}
        self.cache_notes: dict[str, str] = {}  # label -> why its scores cached for earlier files are not reused
        self.cached: dict[str, dict[str, float]] = {}
        self.round = 0  # next round to run
        self.decisions: dict[str, Decision] = {}
        self.active: list[str] = list(self.labels)
        self.methods: dict[str, Any] = {}
        self.model_round: dict[str, int] = {}
        self.engine: Any = None  # certeval.engine.SingleModelRounds or PairedRounds
        self.resumed = False
        self.owns_lock = False
        self.sent: dict[str, int] = {label: 0 for label in self.labels}
        self.progress: Any = None  # certeval.runs.progress.RunBars / RunLines
        self.pool_stats: Any = None
        self.ahead: dict[str, Any] | None = None  # what proposing ahead sent, used and left (ModelPool.settle)
        self.started = time.time()
        self.first_round_at: float | None = None  # when the first round began selecting (the end of start-up)
        self.phase_s = {"rounds": 0.0, "controller": 0.0, "storage": 0.0}  # results.json pipeline.phases
        self.history: dict[str, Any] = {}  # label -> HistoryPrior (method 'history')
        self.cached_outputs: dict[str, Any] = {}  # label -> the score cache's stored outputs
        self._item_id_array = np.asarray(bank.item_ids, dtype=object)
        self._look_records: tuple[int, dict[str, LookRecord]] | None = None  # the round's, made by decide
        self.shown: dict[str, LookRecord] = {}  # each model's latest look record: what every screen shows of it

    # -- load -----------------------------------------------------------------
    @classmethod
    def open(cls, plan: RunPlan, prepared: PreparedRun | None = None) -> Run:
        """Take the bank and history priors validation prepared (or prepare them: a flow started elsewhere),
        claim the run folder unless the command around the flow did (config check on resume), read the score
        cache."""
        from .plan import claim_run

        prepared = prepared if prepared is not None else prepare_run(plan)
        store = plan.store()
        shape = cls if cls is not Run else (PairedRun if plan.paired else SingleRun)
        run = shape(plan, prepared.bank, store)
        run.history = prepared.history
        # False when a CLI around the flow already holds it; a flow retried after its worker died waits out
        # the dead worker's object-store lease (bounded) instead of failing on it
        from certeval.storage import STALE_LEASE_WAIT_S

        run.owns_lock = run.store.acquire_lock(wait_s=STALE_LEASE_WAIT_S)
        try:
            run.resumed = prepared.resumed if prepared.resumed is not None else claim_run(plan)
            specs = dict(zip(plan.labels, plan.models))

            def describe(label: str) -> None:
                run.caches[label].describe({"model": specs[label], "scorer": plan.scorer or "auto",
                                            "generation": plan.generation()})

            # one small write per new model: thousands of models (rankings) wait on storage latency, not CPU
            from concurrent.futures import ThreadPoolExecutor

            from certeval.storage import ScoreCache

            with ThreadPoolExecutor(max_workers=min(16, max(1, len(run.caches)))) as pool:
                list(pool.map(describe, list(run.caches)))
            run.note_changed_files()
            run.cached = dict(zip(run.caches, ScoreCache.load_many(list(run.caches.values()), compact=True)))
            run.cached_outputs = {label: cache.outputs for label, cache in run.caches.items()}
        except BaseException:
            if run.owns_lock:
                run.store.release_lock()
            raise
        return run

    def embed(self) -> None:
        """Item features for methods that need them (:class:`SingleRun`)."""

    def restore(self, progress: str | None = None) -> None:
        """Methods from their stored state (resume) or fresh; the run's position and decisions."""
        self._open()
        self._verify_record()
        if self.round:  # resumed: the models as their last looks left them (paired: the group re-decided)
            self.shown = {label: self.look_record(label) for label in self.labels}
        self.progress = run_progress(self, progress)  # None, live bars or one line per round (certeval.runs.progress)

    def _item_keys(self) -> list[str]:
        if self.bank.frame is None:
            return list(self.bank.item_ids)
        records = self.bank.frame.to_dict("records")
        return [item_key(r) for r in records]

    def _verify_record(self) -> None:
        """A resumed run continues only from the record that was written (manifest.json): every committed
        round file present and byte-identical, each model's state matching its recorded rows."""
        from .plan import INTEGRITY

        config = self.store.read_config() or {}
        if config.get("integrity") != INTEGRITY:  # stored before the manifest existed
            return
        committed, scored = self._committed()
        self.store.verify_rounds(committed, scored, may_leave=self.paired)

    # -- what each run shape says ---------------------------------------------------------------------------
    def _open(self) -> None:
        """The methods and the engine, fresh or from the stored record."""
        raise NotImplementedError

    def _committed(self) -> tuple[int, dict[str, tuple[int, int]]]:
        """The last committed round, and each model's items scored and rounds recorded."""
        raise NotImplementedError

    def _select(self) -> RoundScores:
        raise NotImplementedError

    def update(self, batch: RoundScores) -> None:
        raise NotImplementedError

    def _decide(self, batch: RoundScores) -> None:
        raise NotImplementedError

    def predicted_items(self, batch: RoundScores) -> dict[str, np.ndarray]:
        """The items the next round is predicted to send, per model, before this round's scores arrive."""
        raise NotImplementedError

    def _states_to_write(self, batch: RoundScores) -> list[str]:
        raise NotImplementedError

    def _commit(self) -> None:
        """After the round's rows and states: what makes the round committed (a paired run's marker)."""

    def look_record(self, label: str) -> LookRecord:
        raise NotImplementedError

    def _target(self) -> str:
        """What every interval, verdict and tie group of this result answers (docs/architecture.md §4)."""
        raise NotImplementedError

    def exit_code(self) -> int:
        """0 when every goal was reached, 1 when the bank or budget ran out first (docs/architecture.md §6)."""
        raise NotImplementedError

    @property
    def looks(self) -> list[int]:
        """A paired run's shared items scored after each look."""
        return []

    # -- select ---------------------------------------------------------------
    def rng(self, round_: int) -> np.random.Generator:
        return np.random.default_rng([self.plan.seed, round_])

    def n_scored(self, label: str) -> int:
        return int(self.methods[label].n_scored)

    @_timed("controller")
    def select(self) -> RoundScores:
        """Items to score this round, per active model (empty when nothing is left)."""
        if self.first_round_at is None:
            self.first_round_at = time.time()
        return self._select()

    # -- infer ----------------------------------------------------------------
    def proposes_ahead(self, pool: Any) -> bool:
        return proposes_ahead(self.plan, pool)

    def propose_ahead(self, batch: RoundScores) -> dict[str, list[tuple[str, dict]]]:
        """The next round's requests as predicted before this round's scores arrive (docs/architecture.md,
        "proposing ahead"; :meth:`predicted_items`). Nothing scored ahead reaches a method, a look or a decision."""
        requests, _ = self.item_requests.split(self.predicted_items(batch), self.cached)
        return {label: reqs for label, reqs in requests.items() if reqs}

    def settle_ahead(self, pool: Any) -> None:
        """After the last round: what was scored ahead and never used is kept (the score cache) and reported."""
        if pool is not None and self.proposes_ahead(pool):
            self.ahead = pool.settle()

    @_timed("rounds")
    def infer(self, pool: Any, batch: RoundScores) -> RoundScores:
        requests, hits = self.item_requests.split(batch.items, self.cached)
        chunk = self.plan.chunk_size or max(1, math.ceil(self.plan.batch_size / (self.plan.replicas * self.plan.in_flight)))

        def absorb(label: str, results: list[dict]) -> None:  # arrival order
            if self.progress is not None:
                self.progress.advance(label, len(results))

        todo = {label: reqs for label, reqs in requests.items() if reqs}
        if self.proposes_ahead(pool):
            pool.cancel_ahead(set(self.labels) - set(batch.items))  # models that left stop consuming
            got = pool.score(todo, chunk, on_result=absorb, ahead=lambda: self.propose_ahead(batch))
        else:
            got = pool.score(todo, chunk, on_result=absorb) if todo else {}
        self.pool_stats = pool.stats
        outputs_known = self.cached_outputs  # as the score cache keeps them (with a log-likelihood item's resps)
        for label, pos in batch.items.items():
            by_id = {r["item_id"]: r for r in got.get(label, [])}
            scores, outputs, resps = np.empty(len(pos)), [], []
            for i, p in enumerate(pos):
                key = self.keys[p]
                if key in hits[label]:
                    scores[i] = hits[label][key]
                    output, resp = unpack_output(outputs_known.get(label, {}).get(key))
                else:
                    result = by_id[self.bank.item_ids[p]]
                    scores[i] = float(result["score"])
                    output = None if result.get("output") is None else str(result["output"])
                    resp = resps_text(result.get("resps"))
                    self.cached.setdefault(label, {})[key] = scores[i]
                    outputs_known.setdefault(label, {})[key] = pack_output(output, result.get("resps"))
                outputs.append(output)
                resps.append(resp)
            batch.scores[label] = scores
            batch.outputs[label] = outputs
            batch.resps[label] = resps
            batch.fresh[label] = len(requests[label])
            self.sent[label] += len(requests[label])
            if self.progress is not None and hits[label]:
                self.progress.advance(label, len(hits[label]))
        return batch

    # -- decide ---------------------------------------------------------------
    @_timed("controller")
    def decide(self, batch: RoundScores) -> dict[str, Decision]:
        self._decide(batch)
        self.active = self.engine.active
        # the look log's entries are statistics of this look: computed here, written by store_round
        self._look_records = (self.round, {label: self.look_record(label) for label in batch.items})
        self.shown.update(self._look_records[1])
        if self.progress is not None:
            self.progress.refresh()
        return dict(self.decisions)

    @property
    def done(self) -> bool:
        return not self.active

    # -- store ----------------------------------------------------------------
    @_timed("storage")
    def store_round(self, batch: RoundScores) -> None:
        """Rounds Parquet first, then each model's state, then (paired) the run marker: a crash
        between two writes leaves the previous commit point valid."""
        # one frame for the round, built column by column with numpy (a DataFrame per model cost ~20 s a run at
        # M ~ 2000; Python lists per cell ~5 s a round at 10,000 models)
        labels = list(batch.items)
        rows = []
        if labels:
            counts = np.asarray([len(batch.items[label]) for label in labels], dtype=np.int64)
            pos = np.concatenate([np.asarray(batch.items[label], dtype=np.int64) for label in labels])
            ids = self._item_id_array
            outputs = list(itertools.chain.from_iterable(
                batch.outputs.get(label) or [None] * len(batch.items[label]) for label in labels))
            known = self._look_records
            records = [(known[1].get(label) if known is not None and known[0] == self.round else None)
                       or self.look_record(label) for label in labels]
            resps = list(itertools.chain.from_iterable(
                batch.resps.get(label) or [None] * len(batch.items[label]) for label in labels))
            columns = {
                "model": np.repeat(np.asarray(labels, dtype=object), counts),
                "item_id": ids[pos],
                "score": np.concatenate([np.asarray(batch.scores[label], dtype=float) for label in labels]),
                # generation kept apart from judging: `certeval rescore` re-judges these without the model
                "output": pd.Series(outputs, dtype=object),
                # a log-likelihood item's (loglik, is_greedy) per choice: every metric of the task is read off them
                **({RESPS: pd.Series(resps, dtype=object)} if any(r is not None for r in resps) else {}),
                "prompt_hash": pd.Series(self.item_requests.prompt_hashes(np.unique(pos))[pos], dtype=object),
                "round": self.round,
                "prob": np.concatenate([np.asarray(batch.probs[label], dtype=float) for label in labels]),
            }
            looks = [rec.columns() for rec in records]
            for name in looks[0]:
                values = [look[name] for look in looks]
                text = name.removeprefix("look_") in LOOK_TEXT_FIELDS
                columns[name] = np.repeat(np.asarray(values, dtype=object if text else None), counts)
            rows.append(pd.DataFrame(columns))
        if rows:
            frame = pd.concat(rows, ignore_index=True)
            existing = self.store.folder.read_parquet(f"rounds/{self.round:05d}.parquet")
            if existing is not None:  # a model that committed this round before a crash keeps its rows
                keep = existing[~existing["model"].isin(list(batch.items))]
                frame = pd.concat([keep, frame], ignore_index=True)
            self.store.write_round(self.round, frame)
        to_write = self._states_to_write(batch)
        self.store.write_states({label: {
            "round": self.round, "method_state": self.methods[label].state(),
            "decision": self.decisions[label].to_dict() if label in self.decisions else None,
        } for label in to_write})
        for label in batch.items:
            self.model_round[label] = self.round + 1
        self._commit()
        self.round += 1

    def shown_look(self, label: str) -> LookRecord:
        """What every screen shows of ``label`` now: its latest look record (the progress line, then results.json,
        the report and the summary read the same record), or its method's state before any look."""
        return self.shown.get(label) or self.look_record(label)

    def note_changed_files(self) -> None:
        """Say (stderr, results.json) which models read from files are scored anew because their files differ
        from those their path's scores were last cached for (weights copied over a checkpoint folder), and keep
        the files now scored for the next run."""
        import sys

        from certeval.storage.cache import last_model_files, record_model_files

        root = self.store.cache_root()
        paths = self.plan.model_paths()
        for label, spec in zip(self.labels, self.plan.models):
            fp = self.fingerprints[label]
            if fp.covers != "files" or spec.split(":", 1)[0] not in ("hf", "vllm"):  # model folders (replays: per
                continue  # model, thousands of small reads a start, for a message)
            earlier = last_model_files(root, paths[label])
            if earlier is not None and earlier.get("cache") != self.cache_keys[label]:
                changed = fp.changed({str(k): str(v) for k, v in earlier["files"].items()})
                shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
                self.cache_notes[label] = (f"model {label}: its files changed since its scores were last cached "
                                           f"({shown or 'their digests'}); scores cached for the earlier files "
                                           "are not reused")
                print(f"certeval: {self.cache_notes[label]}", file=sys.stderr, flush=True)
            if earlier is None or earlier.get("cache") != self.cache_keys[label]:
                record_model_files(root, paths[label], {"model": spec, "cache": self.cache_keys[label],
                                                        "fingerprint": fp.digest, "files": dict(fp.files)})

    def compact_cache(self) -> int:
        """Merge the score-cache parts this run's batches wrote (one per batch) when a folder holds more than
        ``storage.cache.MAX_PARTS``, so the next start reads a few objects; bounded, and never fails the run."""
        from certeval.storage import ScoreCache

        return ScoreCache.compact_many(list(self.caches.values()))

    def results(self) -> dict[str, Any]:
        """results.json, built from the look log (:func:`certeval.runs.results.run_results`), and stored."""
        from .results import run_results

        began = time.perf_counter()
        out = run_results(self)
        phases = out["pipeline"]["phases"]
        phases["storage_s"] = round(phases["storage_s"] + time.perf_counter() - began, 3)  # less the write itself
        self.store.write_results(out)
        return out


class SingleRun(Run):
    """certify: each model's method proposes its own items and its goal's rules stop it."""

    def embed(self) -> None:
        """Item features for methods that need them (Cer-Eval's partition): the bank's embeddings or its text
        embedded with the packaged all-MiniLM-L6-v2. Skipped when a stored state already holds them."""
        method = make_method(self.plan.method, confidence=self.plan.confidence)
        needs = getattr(method, "needs_features", False)
        if needs and all(self.store.read_state(label) is not None for label in self.labels):
            return
        feats = bank_features(self.bank, needs, self.plan.method)
        if feats is not None:
            self.spec = self.bank.spec(features=feats, mean_of_means=self.plan.mean_of_means)

    def _open(self) -> None:
        method_name = self.plan.method
        for label in self.labels:
            stored = self.store.read_state(label)
            if stored is not None:
                try:
                    self.methods[label] = method_from_state(stored["method_state"])
                    self.model_round[label] = int(stored["round"]) + 1
                    if stored.get("decision"):
                        self.decisions[label] = Decision(**stored["decision"])
                except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:  # InputError too
                    raise InputError(f"{self.store.folder.url(f'state/{safe_name(label)}.json')} is damaged "
                                     f"({type(exc).__name__}: {_first_line(exc)}); nothing was changed — start a "
                                     "new --run-id or restore the file") from None
            else:
                spec = replace(self.spec, history=self.history[label]) if label in self.history else self.spec
                self.methods[label] = method_for_goal(method_name, parse_goal(self.plan.goal), self.plan.max_items,
                                                      confidence=self.plan.confidence).start(spec)
                self.model_round[label] = 0
        self.engine = SingleModelRounds(self.methods, parse_goal(self.plan.goal), n_items=self.bank.n_items,
                                        batch_size=self.plan.batch_size, max_items=self.plan.max_items,
                                        decisions=self.decisions)
        self.active = self.engine.active
        self.round = min(self.model_round.values()) if self.active else max(self.model_round.values())

    def _committed(self) -> tuple[int, dict[str, tuple[int, int]]]:
        closed = [self.model_round[m] for m in self.active] or list(self.model_round.values())
        committed = min(closed) if closed else 0
        return committed, {label: (self.n_scored(label), self.model_round[label]) for label in self.labels}

    def _select(self) -> RoundScores:
        items, probs = {}, {}
        todo = [m for m in self.active if self.model_round[m] <= self.round]  # others committed it before a crash
        proposals = self.engine.select(lambda _label: self.rng(self.round), labels=todo, look=self.round + 1)
        for label, prop in proposals.items():
            items[label] = np.asarray(prop.items, dtype=np.int64)
            probs[label] = np.asarray(prop.probs if prop.probs is not None else np.full(len(prop.items), np.nan), float)
        self.active = self.engine.active  # a model with nothing left to draw was decided by select
        return RoundScores(items, probs)

    def predicted_items(self, batch: RoundScores) -> dict[str, np.ndarray]:
        """What a copy of each model's method proposes now, with the generator the next round will use."""
        import copy

        items: dict[str, np.ndarray] = {}
        for label, pos in batch.items.items():
            k = min(self.plan.batch_size, self.engine.budget_left(label) - len(pos))
            if k <= 0:
                continue
            try:
                peek = copy.deepcopy(self.methods[label]).propose(k, self.rng(self.round + 1))
            except Exception:  # a method that cannot be copied or asked twice: its next round is not predicted
                continue
            if peek is not None and len(peek):
                items[label] = np.asarray(peek.items, dtype=np.int64)
        return items

    @_timed("controller")
    def update(self, batch: RoundScores) -> None:
        for label, pos in batch.items.items():
            self.engine.update(label, pos, batch.scores[label])

    def _decide(self, batch: RoundScores) -> None:
        self.engine.decide(list(batch.items), look=self.round + 1)

    def _states_to_write(self, batch: RoundScores) -> list[str]:
        return list(batch.items)

    def look_record(self, label: str) -> LookRecord:
        """The look log entry of ``label`` at this look (docs/architecture.md §5, :mod:`certeval.record.looks`), recorded
        once with the round's rows: the model's interval and decision."""
        est = self.methods[label].result()
        decision = self.decisions.get(label)
        return LookRecord(int(est.n_scored), float(est.mean), float(est.lower), float(est.upper),
                          None if decision is None else decision.rule)

    def _target(self) -> str:
        targets = {self.methods[label].result().target for label in self.labels}
        return targets.pop() if len(targets) == 1 else "mixed"

    def exit_code(self) -> int:
        return 0 if all(self.decisions.get(m, Decision(False)).reached for m in self.labels) else 1


class PairedRun(Run):
    """compare, rank, select: every model in play scores the next slice of one shared order; a group estimator
    decides. Resumes from the rounds and the run marker (``state/_run.json``), never from per-model states."""

    paired = True

    def group_request(self) -> GroupRequest:
        """What the paired run's group estimator is asked (:meth:`RunPlan.group_request`, with its priors)."""
        return self.plan.group_request(tuple(self.labels), self.history)

    def _open(self) -> None:
        try:
            self._open_record()
        except InputError:
            raise
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            raise InputError(f"{self.store.folder.url('state/_run.json')} or the rounds it commits are damaged "
                             f"({type(exc).__name__}: {_first_line(exc)}); nothing was changed — start a new "
                             "--run-id or restore the folder") from None

    def _open_record(self) -> None:
        target = self.plan.target or "bank"  # every per-model interval answers the run's target too
        for label in self.labels:
            self.methods[label] = make_method(self.plan.method, confidence=self.plan.confidence,
                                              target=target).start(self.spec)
        self.engine = PairedRounds(self.group_request(), n_items=self.bank.n_items, batch_size=self.plan.batch_size,
                                   max_items=self.plan.max_items, methods=self.methods)
        self.engine.start(self.spec, paired_order_rng(self.plan.seed))
        self.decisions = self.engine.decisions
        marker = self.store.read_marker()
        if marker is None:
            return
        last = int(marker["round"])
        rounds = self.store.read_rounds(upto=last)
        record = []
        for r in range(last + 1):
            part = rounds[rounds["round"] == r]
            record.append({label: (self.bank.positions(mine["item_id"]), mine["score"].to_numpy(float))
                           for label, mine in ((label, part[part["model"] == label]) for label in self.labels)
                           if not mine.empty})
        complete = self.engine.restore(record)
        self._check_paired_record(rounds, last, complete)
        self.round = last + 1
        self.active = list(marker.get("active", self.labels))
        self.decisions.update({k: Decision(**v) for k, v in (marker.get("decisions") or {}).items()})
        if self.engine.looks:
            self.engine.decide()
            self.active = self.engine.active

    def _check_paired_record(self, rounds: pd.DataFrame, last: int, prefix: bool) -> None:
        """A paired run resumes only from a complete record: every round file up to the committed one, and
        the scored items a prefix of the shared order. Otherwise the next round would re-select items already
        scored and never advance (a missing round file once made a resumed run loop without end)."""
        have = set(int(r) for r in rounds["round"].unique()) if len(rounds) else set()
        missing = [r for r in range(last + 1) if r not in have]
        if missing or not prefix:
            what = (f"rounds/{missing[0]:05d}.parquet is missing" if missing
                    else "the stored rounds leave a gap in the shared item order")
            raise InputError(f"run folder {self.store.url} is damaged: {what} (the marker says round {last} was "
                             "committed); nothing was changed — start a new --run-id")

    def _committed(self) -> tuple[int, dict[str, tuple[int, int]]]:
        return self.round, {label: (self.n_scored(label), self.round) for label in self.labels}

    def _select(self) -> RoundScores:
        chunk, prob = self.engine.select()
        return RoundScores({label: chunk for label in self.active}, {label: prob for label in self.active})

    def predicted_items(self, batch: RoundScores) -> dict[str, np.ndarray]:
        """The next slice of the shared order (fixed before any score) for every model in play now."""
        engine = self.engine
        now = len(next(iter(batch.items.values()), ()))
        start, k = engine.n_shared + now, self.plan.batch_size
        if engine.max_items is not None:
            k = min(k, max(0, engine.max_items - start))
        chunk = engine.order[start:start + k].astype(np.int64)
        return {label: chunk for label in batch.items} if len(chunk) else {}

    @_timed("controller")
    def update(self, batch: RoundScores) -> None:
        if batch.items:  # one shared slice for every model in play
            self.engine.update(next(iter(batch.items.values())), {label: batch.scores[label] for label in batch.items})

    def _decide(self, batch: RoundScores) -> None:
        self.engine.decide()

    @property
    def looks(self) -> list[int]:
        return self.engine.looks

    def _states_to_write(self, batch: RoundScores) -> list[str]:
        # written once, when the run ends (a ranking of 2,000 models wrote 2,000 JSON files a round for nothing)
        return list(self.labels) if self.done else []

    def _commit(self) -> None:
        self.store.commit_round({
            "round": self.round, "active": self.active, "looks": self.looks,
            "decisions": {k: v.to_dict() for k, v in self.decisions.items()},
        })

    def look_record(self, label: str) -> LookRecord:
        """The look log entry of ``label`` at this look (docs/architecture.md §5): the model's interval and
        decision and the group's statistics. A ranking's or selection's model is shown with the group's
        simultaneous interval (the one its verdicts use), everywhere; a comparison records the pair's difference
        beside each model's own interval."""
        est = self.methods[label].result()
        decision = self.decisions.get(label)
        rule = None if decision is None else decision.rule
        nan = float("nan")
        group = self.engine.intervals.get(label)
        outcome = self.engine.outcome
        pair: tuple[float, float, float, Any] = (nan, nan, nan, None)
        if self.plan.kind == "compare" and outcome is not None:
            pair = (outcome.diff, outcome.lower, outcome.upper, outcome.verdict)
        shown = (est.n_scored, est.mean, est.lower, est.upper) if group is None else (group[3], *group[:3])
        return LookRecord(int(shown[0]), float(shown[1]), float(shown[2]), float(shown[3]), rule, paired=True,
                          interval="model" if group is None else self.plan.kind,
                          group_mean=nan if group is None else float(group[0]),
                          group_lower=nan if group is None else float(group[1]),
                          group_upper=nan if group is None else float(group[2]),
                          pair_diff=float(pair[0]), pair_lower=float(pair[1]), pair_upper=float(pair[2]),
                          pair_verdict=pair[3])

    def _target(self) -> str:
        return self.engine.request.target

    def exit_code(self) -> int:
        return 0 if all(d.reached for d in self.decisions.values()) else 1


def _first_line(exc: BaseException) -> str:
    return next((line for line in str(exc).splitlines() if line.strip()), "")[:200]
