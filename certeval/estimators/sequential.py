"""Per-model sequential testing on the round protocol, with combinable stopping rules.

Stopping rules are small objects speaking one tiny protocol (as Inspect AI's early
stopping hooks): ``rule.check(history) -> Decision | None``.  ``history`` is the tuple of
:class:`Look` records so far (the newest last).  A :class:`SequentialTest` wraps any
single-model method of the registry (its ``Estimate`` drives the rules) and reports the
first rule that fires, with the look at which it fired.  Rules from seed 004 §5.3
(Arviv et al.): precision, threshold crossing, futility, diminishing returns.

:class:`GroupSequentialMean` is the method's own statistic: the (mean-of-means) bank
mean with a repeated confidence interval (Jennison & Turnbull 2000, ch. 9) whose
multiplier at look k comes from a spending function evaluated at the information
fraction ``n_k / N`` — valid at unplanned looks, not anytime-valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, Sequence, runtime_checkable

import numpy as np

from ._validation import InputError, check_choice, check_in_range, check_positive
from .boundaries import CLASSICAL, group_sequential_boundary, parse_spending
from .protocol import BankMethod, BankSpec, register
from .results import Decision, Estimate


# --------------------------------------------------------------------------- mean of means
def mean_of_means(values: np.ndarray, subsets: np.ndarray | None = None, n_subsets: int | None = None,
                  *, var_floor: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Mean-of-means over sub-datasets and the variance of that estimate (seed 004, eq. 1).

    ``values``: ``(..., n)`` per-item values (scores, or paired differences).  With ``subsets``
    (one integer code per column, ``n_subsets`` codes in the bank) the statistic is
    ``sum_s mean_s / S`` with variance ``sum_s var_s / (n_s S^2)`` (per-subset sample
    variances, ddof = 1); without, the plain mean and ``var / n``.  A subset with fewer than
    two scored items leaves the variance undefined (NaN): the estimand is not yet estimable.
    ``var_floor`` keeps each variance >= 1/n (one disagreement's worth for 0/1 data) so an
    all-equal early sample never yields a zero-width interval.
    """
    x = np.asarray(values, dtype=float)
    if subsets is None:
        n = x.shape[-1]
        if n < 2:
            return x.mean(axis=-1) if n else np.full(x.shape[:-1], np.nan), np.full(x.shape[:-1], np.nan)
        var = x.var(axis=-1, ddof=1)
        if var_floor:
            var = np.maximum(var, 1.0 / n)
        return x.mean(axis=-1), var / n
    codes = np.asarray(subsets, dtype=np.int64)
    count = int(n_subsets if n_subsets is not None else codes.max() + 1)
    means, variances = [], []
    for s in range(count):
        cols = codes == s
        n_s = int(cols.sum())
        if n_s < 2:
            nan = np.full(x.shape[:-1], np.nan)
            return nan, nan
        part = x[..., cols]
        var = part.var(axis=-1, ddof=1)
        if var_floor:
            var = np.maximum(var, 1.0 / n_s)
        means.append(part.mean(axis=-1))
        variances.append(var / n_s)
    return np.mean(means, axis=0), np.sum(variances, axis=0) / count**2


# --------------------------------------------------------------------------- looks and rules
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
    """Stop once the interval's half-width is <= ``halfwidth`` (seed 004 §5.3, precision-based)."""

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
        return Decision(True, "threshold", last.look, wanted, verdict,
                        f"interval [{est.lower:.4g}, {est.upper:.4g}] is {verdict} {self.threshold:g}")


@dataclass(frozen=True)
class Futility:
    """Stop when the goal "above ``threshold``" (or below) can no longer be confirmed.

    Fires when the interval excludes the wanted side, i.e. the upper bound is already below
    the threshold when asking "above" — seed 004 §5.3 futility, phrased as a confident
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
    """Stop when the half-width shrank by less than ``min_gain`` per extra batch (seed 004 §5.3).

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
        if gain < self.min_gain:
            return Decision(True, "diminishing-returns", history[-1].look, True, "precise-enough",
                            f"half-width gain {gain:.4g} per batch < {self.min_gain:g}")
        return None


@dataclass(frozen=True)
class Exhausted:
    """Stop when every item of the bank is scored (always in force)."""

    def check(self, history: Sequence[Look]) -> Decision | None:
        last = history[-1]
        if last.estimate.exhausted:
            return Decision(True, "exhausted", last.look, False, None, "every item of the bank was scored")
        return None


@dataclass(frozen=True)
class Budget:
    """Stop when ``max_items`` items are scored."""

    max_items: int

    def check(self, history: Sequence[Look]) -> Decision | None:
        last = history[-1]
        if last.n_scored >= self.max_items:
            return Decision(True, "budget", last.look, False, None, f"the item budget {self.max_items} was spent")
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

    def start(self, bank: BankSpec) -> "SequentialTest":
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


# --------------------------------------------------------------------------- GST statistic
@register
class GroupSequentialMean(BankMethod):
    """Uniform sampling without replacement; repeated CI from a group-sequential boundary.

    At look k with ``n_k`` items scored the interval is ``mean +- c_k se`` where ``c_k`` is the
    two-sided boundary of ``spending`` at fractions ``n_1/N, ..., n_k/N`` (Jennison & Turnbull
    2000, §9.1, repeated confidence intervals); the mean is the mean-of-means over subsets
    when the bank has them (seed 004, eq. 1).  Simultaneous coverage over the looks taken,
    not anytime-valid.  Classical boundaries (``pocock``, ``obrien-fleming``) need the plan:
    looks of ``look_size`` items up to the bank size.
    """

    name = "gst"
    anytime_valid = False

    def __init__(self, confidence: float = 0.95, target: str = "bank", spending: str = "ld-pocock",
                 look_size: int = 100) -> None:
        super().__init__(confidence=confidence, target=target)
        self.spending = spending
        self.look_size = look_size

    def _validate_params(self) -> None:
        super()._validate_params()
        parse_spending(self.spending)
        check_positive(self.look_size, "look_size")

    def _start_extra(self) -> None:
        self.look_n_: list[int] = []

    def _absorb(self, items: np.ndarray, scores: np.ndarray) -> None:
        self.look_n_.append(self.n_scored)

    def _state_extra(self) -> dict[str, Any]:
        return {"look_n": list(self.look_n_)}

    def _load_extra(self, extra: dict[str, Any]) -> None:
        if "look_n" in extra:
            self.look_n_ = [int(v) for v in extra["look_n"]]

    def multiplier(self) -> float:
        return boundary_multiplier(self.spending, 1.0 - float(self.confidence), self.look_n_,
                                   self.bank_.n_items, self.look_size, sides=2)

    def result(self) -> Estimate:
        self._check_started()
        guarantee = ("group-sequential repeated CI (Jennison & Turnbull ch. 9): simultaneous coverage over the "
                     f"looks at {self.confidence:g}, spending {self.spending} on n/N")
        if self.n_scored == 0:
            return self._empty_estimate(guarantee)
        order = self.order_
        codes = self.bank_.subset_codes()[order] if self.bank_.subsets is not None and self.bank_.mean_of_means else None
        mean, var = mean_of_means(self.scores_[order], codes, self.bank_.n_subsets if codes is not None else None)
        mean, var = float(mean), float(var)
        exhausted = self.exhausted
        if exhausted and self.target == "bank":
            lower = upper = mean  # the bank mean is known exactly
        elif not math.isfinite(var):
            lower, upper = 0.0, 1.0
        else:
            half = self.multiplier() * math.sqrt(var)
            lower, upper = max(0.0, mean - half), min(1.0, mean + half)
        return Estimate(self.name, mean, lower, upper, self.n_scored, float(self.confidence), False, self.target,
                        self.bank_.n_items, guarantee, exhausted)


def boundary_multiplier(spending: str, alpha: float, look_n: Sequence[int], n_max: int, look_size: int,
                        sides: int = 2) -> float:
    """Critical value for the latest look, given the item counts of all looks so far.

    Spending functions use the observed fractions ``n_k / n_max`` (unplanned looks are fine);
    classical boundaries use the planned looks of ``look_size`` items and are evaluated at
    the look's index (a constant for Pocock).
    """
    if not look_n:
        return float("inf")
    name, _ = parse_spending(spending)
    counts = [min(int(n), n_max) for n in look_n]
    if name in CLASSICAL:
        planned = list(range(look_size, n_max, look_size)) + [n_max]
        fractions = tuple(n / n_max for n in planned)
        boundary = group_sequential_boundary(None, alpha, spending, fractions=fractions, sides=sides)
        k = min(len(counts), len(planned)) - 1
        return boundary.boundaries[k]
    # drop repeated counts (a look that added nothing): fractions must increase
    fractions: list[float] = []
    for n in counts:
        f = n / n_max
        if not fractions or f > fractions[-1] + 1e-12:
            fractions.append(f)
    boundary = group_sequential_boundary(None, alpha, spending, fractions=tuple(fractions), sides=sides, interim=True)
    return boundary.boundaries[-1]


def check_spending(spending: str) -> str:
    parse_spending(spending)
    return spending


def check_sides(sides: int) -> int:
    return int(check_choice(str(sides), "sides", ("1", "2")))


def check_unit(value: float, name: str) -> float:
    return check_in_range(value, name, 0.0, 1.0)
