"""The one round engine (docs/architecture.md §1): select → infer → update → decide, for live runs, backtests and benchmarks.

Two shapes of round, one loop (:func:`run_until_decided`): :class:`SingleModelRounds` (certify: each model's
method proposes its own items) and :class:`PairedRounds` (compare, rank, select: every model still in play scores
the same items, the next slice of one shared order, and a group estimator decides).

A single-model run is a set of models, each with its own round-protocol method, and one goal (a rule set, see
:mod:`certeval.estimators.goals`). :class:`SingleModelRounds` holds what is decided per round — how many items
each model may still draw, what its method proposes, when its rules stop it — and nothing about where scores
come from or where looks are stored. Its users differ only in that:

* the pipeline (:class:`certeval.runs.run.Run`) runs each step as a Prefect task, gets scores from Ray actors
  through the score cache, and records each look with its round (the look log) so a crash can resume;
* backtests and benchmarks call :func:`run_until_decided` with scores looked up in a recorded matrix.

Randomness is whatever ``rng_for(label)`` returns: a backtest rep passes one generator for the whole rep; the
pipeline passes a generator keyed by (seed, round), so a resumed run proposes what an uninterrupted one would.
Pure: numpy and the estimators only.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from .estimators import method_for_goal
from .estimators.goals import DIMINISHING_WINDOW, Goal, Look, spent
from .estimators.groups import GroupRequest, make_group, shared_order
from .estimators.protocol import Proposal
from .estimators.results import Decision

KEEP_LOOKS = DIMINISHING_WINDOW + 1  # the looks a goal's rules compare with
RngFor = Callable[[str], np.random.Generator]
Inference = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]  # label -> positions -> scores


PAIRED_ORDER_KEY = 0xC0FFEE  # a paired run's shared order: drawn once from (seed, this key)


def paired_order_rng(seed: int) -> np.random.Generator:
    """The generator a paired run with ``--seed seed`` draws its shared order from: the live run
    (:class:`certeval.runs.run.Run`) and a backtest of the live command (``certeval backtest COMMAND``, rep ``r``
    plays seed + r) both take it from here, so the same request and seed make the same decisions."""
    return np.random.default_rng([int(seed), PAIRED_ORDER_KEY])


def draw_budget(method: Any, n_items: int, max_items: int | None) -> int:
    """Most draws a model may make: the bank size, or ``max_items`` (beyond N only for methods drawing with
    replacement, whose repeated draws reuse a score already paid for)."""
    if max_items is None:
        return int(n_items)
    return int(max_items) if getattr(method, "with_replacement", False) else min(int(max_items), int(n_items))


class SingleModelRounds:
    """Rounds of single-model methods under one goal; ``decisions`` is shared with the caller (it may hold the
    decisions of a resumed run)."""

    def __init__(self, methods: dict[str, Any], goal: Goal, *, n_items: int, batch_size: int,
                 max_items: int | None = None, decisions: dict[str, Decision] | None = None) -> None:
        self.methods = methods
        self.goal = goal
        self.n_items = int(n_items)
        self.batch_size = int(batch_size)
        self.max_items = max_items
        self.decisions = decisions if decisions is not None else {}
        self.looks: dict[str, list[Look]] = {}  # each model's looks in this process (rules that compare looks)

    @property
    def active(self) -> list[str]:
        return [m for m in self.methods if not (m in self.decisions and self.decisions[m].done)]

    def budget_left(self, label: str) -> int:
        method = self.methods[label]
        return draw_budget(method, self.n_items, self.max_items) - int(method.n_scored)

    def select(self, rng_for: RngFor, labels: list[str] | None = None, look: int | None = None) -> dict[str, Proposal]:
        """Each model's next items (at most ``batch_size``, within its budget). A model with nothing left to draw
        gets its final decision here (the goal's rules with the budget spent) and no proposal."""
        out = {}
        for label in self.active if labels is None else labels:
            k = min(self.batch_size, self.budget_left(label))
            prop = self.methods[label].propose(k, rng_for(label)) if k > 0 else None
            if prop is None or len(prop) == 0:
                self.decisions[label] = self.goal.decide(self.methods[label].result(), look=look, budget_left=0)
                continue
            out[label] = prop
        return out

    def update(self, label: str, items: np.ndarray, scores: np.ndarray) -> None:
        self.methods[label].update(items, scores)

    def decide(self, labels: list[str], look: int | None = None) -> dict[str, Decision]:
        """The goal's rules for ``labels`` at this look (its estimate, its remaining budget)."""
        for label in labels:
            est = self.methods[label].result()
            history = self.looks.setdefault(label, [])
            self.decisions[label] = self.goal.decide(est, look=look, budget_left=self.budget_left(label),
                                                     history=history)
            history.append(Look(look or len(history) + 1, int(est.n_scored), est))
            del history[:-KEEP_LOOKS]
        return {label: self.decisions[label] for label in labels}


class PairedRounds:
    """Rounds of a paired run: compare, rank or select, either target, with or without history.

    ``start(spec, rng)`` draws the shared order (∝ the estimand's weights on the bank target, uniform on the
    distribution target) from ``rng``. Each round :meth:`select` gives the next ``batch_size`` items of that order
    (fewer where ``max_items`` ends first) to every model in :attr:`active`; :meth:`update` takes their scores;
    :meth:`decide` asks the group estimator (:mod:`certeval.estimators.groups`) who is still sampled and records a
    :class:`Decision` per model. ``methods`` (optional) are per-model round-protocol methods fed the shared order's
    draws, for a per-model interval beside the group's; backtests leave them out.
    """

    def __init__(self, request: GroupRequest, *, n_items: int, batch_size: int, max_items: int | None = None,
                 methods: dict[str, Any] | None = None) -> None:
        self.request = request
        self.n_items = int(n_items)
        self.batch_size = int(batch_size)
        self.max_items = max_items
        self.methods = methods if methods is not None else {}

    def start(self, spec: Any, rng: np.random.Generator) -> PairedRounds:
        labels = self.request.labels
        weights = spec.weights() if self.request.target == "bank" else None
        self.order, self.order_prob = shared_order(weights, self.n_items, rng)
        self.order_rank = np.argsort(self.order)  # bank position -> place in the shared order
        self.row = {label: i for i, label in enumerate(labels)}
        self.matrix = np.full((len(labels), self.n_items), np.nan)  # columns in the shared order
        self.looks: list[int] = []  # shared items scored by every model in play, after each look
        self.group = make_group(self.request).start(spec, self.order)
        self.outcome: Any = None  # the group's result at the last decided look
        self.intervals: dict[str, tuple[float, float, float, int]] = {}  # the group's, per model
        self.decisions: dict[str, Decision] = {}
        self.active: list[str] = list(labels)
        return self

    @property
    def n_shared(self) -> int:
        return self.looks[-1] if self.looks else 0

    def select(self) -> tuple[np.ndarray, np.ndarray]:
        """The next items of the shared order (bank positions) and each draw's probability; empty when the bank
        or the budget is spent."""
        start, k = self.n_shared, self.batch_size
        if self.max_items is not None:
            k = min(k, max(0, self.max_items - start))
        chunk = self.order[start:start + k].astype(np.int64)
        return chunk, self.order_prob[start:start + len(chunk)]

    def update(self, items: np.ndarray, scores: Mapping[str, np.ndarray]) -> None:
        """One look: ``scores[label]`` are the model's scores on ``items`` (bank positions, in order)."""
        items = np.asarray(items, dtype=np.int64)
        for label, x in scores.items():
            self._absorb_model(label, items, np.asarray(x, dtype=float))
        start = self.n_shared
        # the scored columns are a prefix of the shared order: count only past it (M x N is 10^8 at 10k x 10k)
        span = self.matrix[:, start:start + len(items)]
        self.looks.append(start + int(np.sum(~np.isnan(span).all(axis=0))))
        if self.looks[-1] > start:
            self.group.update(start, self.looks[-1], self.matrix[:, start:self.looks[-1]])

    def restore(self, record: list[Mapping[str, tuple[np.ndarray, np.ndarray]]]) -> bool:
        """Replay a stored run: ``record[r][label]`` = (bank positions, scores) of round r. Returns False, having
        fed the group nothing, when the scored items are not a prefix of the shared order (a damaged record)."""
        for round_scores in record:
            for label, (items, x) in round_scores.items():
                self._absorb_model(label, np.asarray(items, dtype=np.int64), np.asarray(x, dtype=float))
            self.looks.append(int(np.sum(~np.isnan(self.matrix).all(axis=0))))
        filled = ~np.isnan(self.matrix).all(axis=0)
        if not filled[:int(filled.sum())].all():
            return False
        for start, stop in zip([0] + self.looks[:-1], self.looks):
            if stop > start:
                self.group.update(start, stop, self.matrix[:, start:stop])
        return True

    def _absorb_model(self, label: str, items: np.ndarray, x: np.ndarray) -> None:
        self.matrix[self.row[label], self.order_rank[items]] = x
        method = self.methods.get(label)
        if method is not None:  # its draws are the shared order's (drawn before any score): logged as such, in order
            fresh = items[~method.scored_[items]]
            method.propose_shared_order(fresh[np.argsort(self.order_rank[fresh], kind="stable")])
            method.update(items, x)

    def decide(self) -> dict[str, Decision]:
        """The group's verdicts at this look; models it still samples stay active unless the bank or the budget
        is spent."""
        if not self.looks:
            return self.decisions
        kind, looks = self.request.kind, len(self.looks)
        exhausted = self.n_shared >= self.n_items
        budget_spent = self.max_items is not None and self.n_shared >= self.max_items
        self.outcome = self.group.result()
        self.intervals = self.group.intervals(self.outcome)
        still = self.group.active
        self.active = [] if (exhausted or budget_spent) else list(still)
        active, still = set(self.active), set(still)
        for label in self.request.labels:
            prev = self.decisions.get(label)
            if label in active:
                self.decisions[label] = Decision(False, None, looks, False, None, "")
            elif prev is not None and prev.done:
                if kind == "rank" and prev.rule == "rank":  # its rank as of this look: the final table's, at the end
                    self.decisions[label] = replace(prev, verdict=self.verdict(label))
                continue
            elif label in still:  # stopped by the bank or the budget, not by the test (the goals' words)
                self.decisions[label] = spent(looks, exhausted, "every shared item was scored" if exhausted
                                              else "the item budget (--max-items) was spent")
            else:
                self.decisions[label] = Decision(True, kind, looks, True, self.verdict(label), "")
        return self.decisions

    def verdict(self, label: str) -> str | None:
        """The group's statement about ``label``: its selection status, the pair's verdict, or its rank."""
        if self.request.kind == "select":
            return next(s.status for s in self.outcome.models if s.model == label)
        if self.request.kind == "compare":
            return self.outcome.verdict
        return f"rank {self.outcome.rank_of(label)}"

    @property
    def done(self) -> bool:
        return not self.active


class RoundSteps(Protocol):
    """One kind of run as the round loop (:func:`play`) sees it: a round is select → infer → update → decide →
    record. Live runs (:class:`certeval.runs.steps.FlowSteps`: each step a Prefect task; ``RunSteps`` without
    Prefect; rescore's recorded outputs) and replays by lookup (:func:`run_until_decided`,
    :func:`run_paired`) differ only here."""

    @property
    def done(self) -> bool: ...

    def select(self) -> Any: ...  # the round's proposals, or None when nothing is left to draw

    def infer(self, batch: Any) -> Any: ...

    def update(self, batch: Any) -> None: ...

    def decide(self, batch: Any) -> None: ...

    def record(self, batch: Any) -> None: ...


def play(steps: RoundSteps) -> None:
    """The round loop (docs/architecture.md §1), the one every run, rescore, backtest and benchmark goes through."""
    while not steps.done:
        batch = steps.select()
        if batch is None:
            break
        batch = steps.infer(batch)
        steps.update(batch)
        steps.decide(batch)
        steps.record(batch)


class _SingleLookupSteps:
    """Single-model rounds with inference by a function (backtests, benchmarks)."""

    def __init__(self, rounds: SingleModelRounds, infer: Inference, rng_for: RngFor,
                 on_look: Callable[[int, dict[str, Proposal]], None] | None) -> None:
        self.rounds, self.infer_fn, self.rng_for, self.on_look, self.look = rounds, infer, rng_for, on_look, 1

    @property
    def done(self) -> bool:
        return not self.rounds.active

    def select(self) -> dict[str, Proposal] | None:
        return self.rounds.select(self.rng_for, look=self.look) or None

    def infer(self, proposals: dict[str, Proposal]) -> tuple[dict[str, Proposal], Mapping[str, np.ndarray]]:
        return proposals, self.infer_fn({label: prop.items for label, prop in proposals.items()})

    def update(self, batch) -> None:
        proposals, scores = batch
        for label, prop in proposals.items():
            self.rounds.update(label, prop.items, scores[label])
        if self.on_look is not None:  # after the update, before the decision
            self.on_look(self.look, proposals)

    def decide(self, batch) -> None:
        self.rounds.decide(list(batch[0]), look=self.look)

    def record(self, batch) -> None:
        self.look += 1


def run_until_decided(rounds: SingleModelRounds, infer: Inference, rng_for: RngFor, *,
                      on_look: Callable[[int, dict[str, Proposal]], None] | None = None) -> dict[str, Decision]:
    """select → infer → update → decide until every model is decided; ``on_look(look, proposals)`` sees each look
    after the update (before the decision), e.g. to record the interval curve."""
    play(_SingleLookupSteps(rounds, infer, rng_for, on_look))
    return dict(rounds.decisions)


class _PairedLookupSteps:
    """Paired rounds with scores looked up in a matrix (``scores[i]``: model i's score per bank position)."""

    def __init__(self, rounds: PairedRounds, scores: np.ndarray, on_look: Callable[[PairedRounds], None] | None):
        self.rounds, self.scores, self.on_look = rounds, np.asarray(scores, dtype=float), on_look

    @property
    def done(self) -> bool:
        return self.rounds.done

    def select(self) -> np.ndarray | None:
        items, _ = self.rounds.select()
        return items if len(items) else None

    def infer(self, items: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        return items, {label: self.scores[self.rounds.row[label], items] for label in self.rounds.active}

    def update(self, batch) -> None:
        self.rounds.update(*batch)

    def decide(self, batch) -> None:
        self.rounds.decide()

    def record(self, batch) -> None:
        if self.on_look is not None:
            self.on_look(self.rounds)


def run_paired(rounds: PairedRounds, scores: np.ndarray, *,
               on_look: Callable[[PairedRounds], None] | None = None) -> PairedRounds:
    """A started :class:`PairedRounds` played to its decision with scores by lookup (backtests, benchmarks);
    ``on_look(rounds)`` sees every decided look."""
    play(_PairedLookupSteps(rounds, scores, on_look))
    return rounds


def lookup(matrix: Mapping[str, np.ndarray]) -> Inference:
    """Inference by lookup in recorded scores (``label -> score per bank position``): backtests, benchmarks."""
    return lambda items: {label: np.asarray(matrix[label], dtype=float)[pos] for label, pos in items.items()}


@dataclass(frozen=True)
class Replay:
    """What a replay of one model runs: a method (registered name and parameters) until its goal decides, in
    looks of ``batch_size`` items, within ``max_items`` items (None: the bank)."""

    method: str
    params: dict
    goal: Goal
    batch_size: int
    max_items: int | None = None


def replay_once(replay: Replay, spec: Any, row: np.ndarray, rng: np.random.Generator,
                on_look: Callable[[Any], None] | None = None):
    """One live-like run of a method over a model's recorded scores (``row[i]``: bank position i), by this
    engine with inference by lookup; returns (estimate, decision). ``on_look(est)`` sees the estimate after every
    look (the interval curve). Every backtest rep is one call (:mod:`certeval.backtests.ray_fanout`)."""
    goal, max_items = replay.goal, replay.max_items
    method = method_for_goal(replay.method, goal, max_items, **replay.params)
    method.start(spec)
    rounds = SingleModelRounds({"model": method}, goal, n_items=spec.n_items, batch_size=replay.batch_size,
                               max_items=max_items)
    look = None if on_look is None else (lambda _look, _proposals: on_look(method.result()))
    decisions = run_until_decided(rounds, lookup({"model": row}), lambda _label: rng, on_look=look)
    return method.result(), decisions.get("model") or goal.decide(method.result(), budget_left=0)
