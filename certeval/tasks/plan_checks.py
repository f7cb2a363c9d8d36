"""Checks of a :class:`~certeval.tasks.plan.PlanRequest` that belong to one statement each (the rank's
leaderboard-precision goal, its epsilon-statements): named steps of :func:`~certeval.tasks.plan.make_plan`."""

from __future__ import annotations

from typing import Any

from ..estimators import parse_goal
from ..estimators._validation import InputError


def leaderboard_goal(r: Any) -> str | None:
    """``rank --goal halfwidth:E``: every model's bank mean within ±E (bank target, no margin or epsilon; with
    ``--history`` each model's interval learns from it)."""
    if r.goal is None:
        return None
    if r.kind != "rank":
        raise InputError(f"--goal applies to certify and rank (halfwidth:E), not {r.kind}")
    goal = parse_goal(r.goal)
    if goal.kind != "halfwidth" or goal.diminishing is not None:
        raise InputError(f"rank --goal takes halfwidth:E (every model's bank mean within ±E), got {r.goal!r}")
    clash = [flag for flag, used in (("--margin", r.margin), ("--epsilon", r.epsilon is not None),
                                     ("--target distribution", r.target == "distribution")) if used]
    if clash:
        raise InputError(f"rank --goal {r.goal} asks for leaderboard precision on the bank target; drop {clash[0]}")
    return str(goal)


def check_epsilon(r: Any) -> float | None:
    """``--epsilon``: a rank of the bank target without margin, E in (0, 1)."""
    if r.epsilon is None:
        return None
    if r.kind != "rank":
        raise InputError(f"--epsilon applies to rank, not {r.kind}")
    if isinstance(r.epsilon, bool) or not isinstance(r.epsilon, (int, float)) or not 0.0 < r.epsilon < 1.0:
        raise InputError(f"--epsilon must lie in (0, 1), got {r.epsilon!r}")
    if r.target not in (None, "bank"):
        raise InputError(f"--epsilon is answered on the bank target; drop --target {r.target}")
    if r.margin:
        raise InputError(f"--epsilon replaces the strict verdicts of --margin; pass one of them, got --margin "
                         f"{r.margin!r}")
    return float(r.epsilon)
