"""Stopping rules, and the single-model goals made of them — the one stopping-rule system.

Rules are small objects speaking one tiny protocol (as Inspect AI's early stopping hooks):
``rule.check(looks) -> Decision | None``, where ``looks`` is the look log so far (:class:`Look` records,
newest last). Rules from Arviv et al. 2026, §5.3: precision, threshold crossing, futility, diminishing
returns; plus the two that always apply, an exhausted bank and a spent budget.

A CLI goal (``halfwidth:E``, ``above:T``, ``below:T``) is a named set of rules: :meth:`Goal.rules`; Arviv et al.'s
diminishing-returns rule joins it with ``+``: ``halfwidth:0.02+diminishing:0.001`` also stops a model whose
half-width shrinks by less than 0.001 a look (averaged over two looks), goal not reached. Futility needs no flag:
``above:T`` and ``below:T`` already stop on a confident answer on either side. Scoring
the whole bank is always the last resort: an exhausted bank stops the run and the decision says whether the
goal was nevertheless reached. :class:`SequentialTest` runs any method look by look under any rule set.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from certeval.errors import InputError

from .protocol import BankSpec
from .results import Decision, Estimate
from .validation import parse_finite

GOAL_KINDS = ("halfwidth", "above", "below")
DIMINISHING_WINDOW = 2  # looks the diminishing-returns gain is averaged over (one lucky batch does not stop it)


@dataclass(frozen=True)
class Look:
    """One interim analysis: its 1-based index, items scored so far, and the estimate then."""

    look: int
    n_scored: int
    estimate: Estimate


@runtime_checkable
class StoppingRule(Protocol):
    """``check(history)`` returns a :class:`Decision` to stop, or None to continue."""

    def check(self, history: Sequence[Look]) -> Decision | None: ...


@dataclass(frozen=True)
class Precision:
    """Stop once the interval's half-width is <= ``halfwidth`` (Arviv et al. 2026 §5.3, precision-based)."""

    halfwidth: float

    def check(self, history: Sequence[Look]) -> Decision | None:
        last = history[-1]
        est = last.estimate
        if est.n_scored and est.halfwidth <= self.halfwidth:
            return Decision(True, "precision", last.look, True, "precise",
                            f"half-width {est.halfwidth:.4g} <= {self.halfwidth:g}")
        return None


@dataclass(frozen=True)
class Threshold:
    """Stop once the interval lies entirely above or below ``threshold`` (threshold crossing).

    ``direction``: ``"above"``, ``"below"`` or ``"either"`` — which crossing counts as the goal.
    A crossing the other way still stops (and ``reached`` is False) unless ``stop_on_other``
    is False.
    """

    threshold: float
    direction: str = "either"
    stop_on_other: bool = True
    asked: str | None = None  # a goal's side ("above:T"): a crossing the other way is noted in the detail

    def check(self, history: Sequence[Look]) -> Decision | None:
        last = history[-1]
        est = last.estimate
        if not est.n_scored:
            return None
        verdict = "above" if est.lower > self.threshold else "below" if est.upper < self.threshold else None
        if verdict is None:
            return None
        wanted = self.direction in ("either", verdict)
        if not wanted and not self.stop_on_other:
            return None
        note = "" if self.asked in (None, verdict) else f" (asked: {self.asked})"
        return Decision(True, "threshold", last.look, wanted, verdict,
                        f"interval [{est.lower:.4g}, {est.upper:.4g}] is {verdict} {self.threshold:g}{note}")


@dataclass(frozen=True)
class Futility:
    """Stop when the goal "above ``threshold``" (or below) can no longer be confirmed.

    Fires when the interval excludes the wanted side, i.e. the upper bound is already below
    the threshold when asking "above" — Arviv et al. 2026 §5.3 futility, phrased as a confident
    statement so that it costs no type-I error.
    """

    threshold: float
    direction: str = "above"

    def check(self, history: Sequence[Look]) -> Decision | None:
        last = history[-1]
        est = last.estimate
        if not est.n_scored:
            return None
        hopeless = est.upper < self.threshold if self.direction == "above" else est.lower > self.threshold
        if hopeless:
            return Decision(True, "futility", last.look, False, "below" if self.direction == "above" else "above",
                            f"interval [{est.lower:.4g}, {est.upper:.4g}] rules out {self.direction} {self.threshold:g}")
        return None


@dataclass(frozen=True)
class DiminishingReturns:
    """Stop when the half-width shrank by less than ``min_gain`` per extra batch (Arviv et al. 2026 §5.3).

    The gain is averaged over the last ``window`` looks so one lucky batch does not stop it.
    """

    min_gain: float
    window: int = 1

    def check(self, history: Sequence[Look]) -> Decision | None:
        if len(history) <= self.window:
            return None
        now, before = history[-1].estimate, history[-1 - self.window].estimate
        if not (now.n_scored and before.n_scored):
            return None
        gain = (before.halfwidth - now.halfwidth) / self.window
        if gain < self.min_gain:  # the interval stays valid (anytime methods); the goal itself was not met
            return Decision(True, "diminishing-returns", history[-1].look, False, "precise-enough",
                            f"half-width gain {gain:.4g} per look < {self.min_gain:g}")
        return None


def spent(look: int | None, exhausted: bool, detail: str) -> Decision:
    """The stop of a model whose items ran out before its test decided: every item scored (``exhausted``) or the
    item budget spent. :class:`Exhausted` and :class:`Budget` make it, and so does a paired run
    (:meth:`certeval.engine.PairedRounds.decide`) for the models its group estimator still samples."""
    return Decision(True, "exhausted" if exhausted else "budget", look, False, None, detail)


@dataclass(frozen=True)
class Exhausted:
    """Stop when every item of the bank is scored (always in force)."""

    def check(self, history: Sequence[Look]) -> Decision | None:
        last = history[-1]
        if last.estimate.exhausted:
            return spent(last.look, True, "every item of the bank was scored")
        return None


@dataclass(frozen=True)
class Budget:
    """Stop when ``max_items`` items are scored."""

    max_items: int
    detail: str = ""  # how the budget was set, for the message (default: its size)

    def check(self, history: Sequence[Look]) -> Decision | None:
        last = history[-1]
        if last.n_scored >= self.max_items:
            return spent(last.look, False, self.detail or f"the item budget {self.max_items} was spent")
        return None


def first_decision(rules: Sequence[StoppingRule], history: Sequence[Look]) -> Decision:
    """The first rule (in the given order) that fires, else a continue decision."""
    for rule in rules:
        decision = rule.check(history)
        if decision is not None:
            return decision
    return Decision(False, None, history[-1].look if history else None, False, None, "")


class SequentialTest:
    """Run a single-model method look by look and stop when any rule fires.

    ``method`` is any round-protocol method (``make_method("...")``); each ``update`` is one
    look.  ``rules`` are combined with OR in order; :class:`Exhausted` is always appended.
    """

    def __init__(self, method: Any, rules: Sequence[StoppingRule]) -> None:
        for rule in rules:
            if not isinstance(rule, StoppingRule):
                raise InputError(f"stopping rule {rule!r} has no check(history) method")
        self.method = method
        self.rules = tuple(rules) + (Exhausted(),)
        self.history: list[Look] = []

    def start(self, bank: BankSpec) -> SequentialTest:
        self.method.start(bank)
        self.history = []
        return self

    def propose(self, k: int, rng: np.random.Generator):
        return self.method.propose(k, rng)

    def update(self, items: np.ndarray, scores: np.ndarray) -> Decision:
        self.method.update(items, scores)
        est = self.method.result()
        self.history.append(Look(len(self.history) + 1, est.n_scored, est))
        return self.decision()

    def decision(self) -> Decision:
        if not self.history:
            return Decision(False, None, None, False, None, "no look yet")
        return first_decision(self.rules, self.history)

    def result(self) -> Estimate:
        return self.method.result()


@dataclass(frozen=True)
class Goal:
    """A single-model goal: ``kind`` is ``halfwidth``, ``above`` or ``below``; ``value`` is E or T.

    It is a named rule set (:meth:`rules`): precision for ``halfwidth:E``; a threshold crossing for ``above:T`` /
    ``below:T`` (either side decides: a confident "below" answers "is it above T?" too, so it counts as reached and
    the detail notes the side asked); then an exhausted bank; then the item budget when one is given.
    """

    kind: str
    value: float
    diminishing: float | None = None  # the diminishing-returns rule's least half-width gain per look

    def __str__(self) -> str:
        return f"{self.kind}:{self.value:g}" + ("" if self.diminishing is None else f"+diminishing:{self.diminishing:g}")

    def rules(self, *, max_items: int | None = None) -> tuple[StoppingRule, ...]:
        first: StoppingRule = (Precision(self.value) if self.kind == "halfwidth"
                               else Threshold(self.value, "either", asked=self.kind))
        extra = () if self.diminishing is None else (DiminishingReturns(self.diminishing, window=DIMINISHING_WINDOW),)
        budget = () if max_items is None else (Budget(int(max_items), "the item budget (--max-items) was spent"),)
        return (first, *extra, Exhausted(), *budget)

    def decide(self, est: Estimate, *, look: int | None = None, budget_left: int | None = None,
               history: Sequence[Look] = ()) -> Decision:
        """The goal's rules at one look: stop when the goal is met, the bank is exhausted, or the budget
        (``budget_left`` items still allowed) is spent. ``history``: the model's earlier looks, oldest first
        (the diminishing-returns rule compares with them)."""
        max_items = None if budget_left is None else int(est.n_scored) + int(budget_left)
        looks = (*history, Look(look, int(est.n_scored), est))  # type: ignore[arg-type]
        return first_decision(self.rules(max_items=max_items), looks)


def parse_goal(text: str) -> Goal:
    """Parse ``halfwidth:E``, ``above:T`` or ``below:T`` (optionally ``+diminishing:G``) into a :class:`Goal`;
    every refusal names the goal and echoes it (``goal 'halfwidth:nan': ...``)."""
    if not isinstance(text, str) or ":" not in text:
        raise InputError(f"goal must look like halfwidth:E, above:T or below:T; got {text!r}")
    if "+" in text:
        main, *more = text.split("+")
        goal = parse_goal(main)
        gains = []
        for part in more:
            name, _, raw = part.partition(":")
            if name.strip().lower() != "diminishing":
                raise InputError(f"a goal's added rule must look like +diminishing:G, got {part!r} in goal {text!r}")
            gain = _finite(raw, text, "diminishing-returns gain")
            if not gain > 0:
                raise InputError(f"goal {text!r}: the diminishing-returns gain must be a positive number, got {raw!r}")
            gains.append(gain)
        if len(gains) != 1:
            raise InputError(f"at most one +diminishing:G per goal, got {text!r}")
        return Goal(goal.kind, goal.value, gains[0])
    kind, _, raw = text.partition(":")
    kind = kind.strip().lower()
    if kind not in GOAL_KINDS:
        raise InputError(f"goal kind must be one of {', '.join(GOAL_KINDS)}; got {kind!r} in goal {text!r}")
    if kind == "halfwidth":
        value = _finite(raw, text, "half-width (epsilon)")
        if not 0.0 < value < 1.0:
            raise InputError(f"goal {text!r}: the half-width (epsilon) must be a positive number below 1 for scores "
                             f"in [0, 1], got {value!r}")
    else:
        value = _finite(raw, text, "threshold")
        if not 0.0 < value < 1.0:
            raise InputError(f"goal {text!r}: the threshold must lie strictly between 0 and 1, got {value!r}")
    return Goal(kind, value)


def _finite(raw: str, text: str, what: str) -> float:
    """A goal's number: finite (nan and inf are refused, and text that is not a number)."""
    return parse_finite(raw, f"goal {text!r}: the {what} must be a number, got {raw!r}",
                        f"goal {text!r}: the {what} must be a finite number, got {raw!r}")
