"""The one round engine (DESIGN §1): select → infer → update → decide, for live runs, backtests and benchmarks.

A single-model run is a set of models, each with its own round-protocol method, and one goal (a rule set, see
:mod:`certeval.estimators.goals`). :class:`SingleModelRounds` holds what is decided per round — how many items
each model may still draw, what its method proposes, when its rules stop it — and nothing about where scores
come from or where looks are stored. Its users differ only in that:

* the pipeline (:class:`certeval.tasks.run.Run`) runs each step as a Prefect task, gets scores from Ray actors
  through the score cache, and records each look with its round (the look log) so a crash can resume;
* backtests and benchmarks call :func:`run_until_decided` with scores looked up in a recorded matrix.

Randomness is whatever ``rng_for(label)`` returns: a backtest rep passes one generator for the whole rep; the
pipeline passes a generator keyed by (seed, round), so a resumed run proposes what an uninterrupted one would.
Pure: numpy and the estimators only.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from .estimators import method_for_goal
from .estimators.goals import Goal
from .estimators.protocol import Proposal
from .estimators.results import Decision

RngFor = Callable[[str], np.random.Generator]
Inference = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]  # label -> positions -> scores


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
            self.decisions[label] = self.goal.decide(self.methods[label].result(), look=look,
                                                     budget_left=self.budget_left(label))
        return {label: self.decisions[label] for label in labels}


def run_until_decided(rounds: SingleModelRounds, infer: Inference, rng_for: RngFor, *,
                      on_look: Callable[[int, dict[str, Proposal]], None] | None = None) -> dict[str, Decision]:
    """select → infer → update → decide until every model is decided; ``on_look(look, proposals)`` sees each look
    after the update (before the decision), e.g. to record the interval curve."""
    look = 1
    while rounds.active:
        proposals = rounds.select(rng_for, look=look)
        if not proposals:
            break
        scores = infer({label: prop.items for label, prop in proposals.items()})
        for label, prop in proposals.items():
            rounds.update(label, prop.items, scores[label])
        if on_look is not None:
            on_look(look, proposals)
        rounds.decide(list(proposals), look=look)
        look += 1
    return dict(rounds.decisions)


def lookup(matrix: Mapping[str, np.ndarray]) -> Inference:
    """Inference by lookup in recorded scores (``label -> score per bank position``): backtests, benchmarks."""
    return lambda items: {label: np.asarray(matrix[label], dtype=float)[pos] for label, pos in items.items()}


def replay_once(method_name: str, params: dict, spec: Any, row: np.ndarray, goal: Goal, batch_size: int,
                max_items: int | None, rng: np.random.Generator, on_look: Callable[[Any], None] | None = None):
    """One live-like run of a method over a model's recorded scores (``row[i]``: bank position i), by this
    engine with inference by lookup; returns (estimate, decision). ``on_look(est)`` sees the estimate after every
    look (the interval curve). Every backtest rep is one call (:mod:`certeval.backtest.ray_fanout`)."""
    method = method_for_goal(method_name, goal, max_items, **params)
    method.start(spec)
    rounds = SingleModelRounds({"model": method}, goal, n_items=spec.n_items, batch_size=batch_size,
                               max_items=max_items)
    look = None if on_look is None else (lambda _look, _proposals: on_look(method.result()))
    decisions = run_until_decided(rounds, lookup({"model": row}), lambda _label: rng, on_look=look)
    return method.result(), decisions.get("model") or goal.decide(method.result(), budget_left=0)
