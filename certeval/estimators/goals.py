"""Single-model goals: precision (``halfwidth:E``) and threshold crossing (``above:T`` / ``below:T``).

A goal looks at an :class:`Estimate` and returns a :class:`Decision`. Scoring the
whole bank is always the last resort: an exhausted bank stops the run and the
decision says whether the goal was nevertheless reached.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._validation import InputError, check_in_range, check_positive
from .results import Decision, Estimate

GOAL_KINDS = ("halfwidth", "above", "below")


@dataclass(frozen=True)
class Goal:
    """``kind`` is one of ``halfwidth``, ``above``, ``below``; ``value`` is E or T."""

    kind: str
    value: float

    def __str__(self) -> str:
        return f"{self.kind}:{self.value:g}"

    def decide(self, est: Estimate, *, look: int | None = None, budget_left: int | None = None) -> Decision:
        """Stop when the goal is met, the bank is exhausted, or the budget is spent."""
        if est.n_scored > 0:
            if self.kind == "halfwidth" and est.halfwidth <= self.value:
                return Decision(True, "precision", look, True, "precise",
                                f"half-width {est.halfwidth:.4g} <= {self.value:g}")
            if self.kind in ("above", "below"):
                if est.lower > self.value:
                    verdict = "above"
                elif est.upper < self.value:
                    verdict = "below"
                else:
                    verdict = None
                if verdict is not None:
                    return Decision(True, "threshold", look, True, verdict,
                                    f"interval [{est.lower:.4g}, {est.upper:.4g}] is {verdict} {self.value:g}"
                                    + ("" if verdict == self.kind else f" (asked: {self.kind})"))
        if est.exhausted:
            return Decision(True, "exhausted", look, False, None, "every item of the bank was scored")
        if budget_left is not None and budget_left <= 0:
            return Decision(True, "budget", look, False, None, "the item budget (--max-items) was spent")
        return Decision(False, None, look, False, None, "")


def parse_goal(text: str) -> Goal:
    """Parse ``halfwidth:E``, ``above:T`` or ``below:T`` into a :class:`Goal`."""
    if not isinstance(text, str) or ":" not in text:
        raise InputError(f"goal must look like halfwidth:E, above:T or below:T; got {text!r}")
    kind, _, raw = text.partition(":")
    kind = kind.strip().lower()
    if kind not in GOAL_KINDS:
        raise InputError(f"goal kind must be one of {', '.join(GOAL_KINDS)}; got {kind!r} in {text!r}")
    try:
        value = float(raw)
    except ValueError:
        raise InputError(f"goal value must be a number; got {raw!r} in {text!r}") from None
    if kind == "halfwidth":
        value = check_positive(value, "goal half-width (epsilon)")
        if value >= 1:
            raise InputError(f"goal half-width (epsilon) must be below 1 for scores in [0, 1], got {value!r}")
    else:
        value = check_in_range(value, f"goal threshold in {text!r}", 0.0, 1.0, closed=False)
    return Goal(kind, value)
