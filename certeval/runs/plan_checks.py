"""Checks of a request (:mod:`certeval.requests`) that belong to one statement each (the rank's
leaderboard-precision goal, its epsilon-statements): named steps of :func:`~certeval.runs.plan.make_plan`."""

from __future__ import annotations

from typing import Any

from certeval.errors import InputError
from certeval.estimators import parse_goal


def leaderboard_goal(r: Any) -> str | None:
    """``rank --goal halfwidth:E``: every model's bank mean within ±E (bank target, no margin or epsilon; with
    ``--history`` each model's interval learns from it)."""
    if r.goal is None:
        return None
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


CHOICE_SCORERS = ("mc-loglik", "mc-loglik-norm")


def check_choice_items(frame: Any, scorer: str, source: str) -> None:
    """Every item a multiple-choice scorer judges has what the model host will need: two or more choices and its
    answer among them (one choice, or a gold index past the choices, used to pass the plan and fail the run after
    Ray and Prefect had started). An lm-eval task's items carry lm-eval's own gold and are checked with the task."""
    from certeval.harnesses.lm_eval_tasks import TASK_META
    from certeval.scoring.lm_eval_generation import SCORING
    from certeval.scoring.scorers import gold_indices, mc_request

    if scorer not in CHOICE_SCORERS or frame is None or {SCORING, TASK_META} & set(frame.columns):
        return
    for item in frame.to_dict("records"):
        try:
            mc_request(item)
            gold_indices(item)
        except InputError as exc:
            raise InputError(f"{source}: {exc} (--scorer {scorer} needs two or more choices and the answer among "
                             "them)") from None


def trial_start(plan: Any, bank: Any, priors: dict[str, Any]) -> None:
    """Start the paired run's group estimator on the bank and drop it: whatever it refuses (a combination of
    numbers the flags' own checks let through) is refused here, before Ray or Prefect start, not 30 s later."""
    from certeval.engine import PairedRounds, paired_order_rng

    if not plan.paired or bank is None:
        return
    engine = PairedRounds(plan.group_request(history=priors or None), n_items=bank.n_items,
                          batch_size=plan.batch_size, max_items=plan.max_items)
    try:
        engine.start(bank.spec(mean_of_means=plan.mean_of_means), paired_order_rng(plan.seed))
    except InputError as exc:
        raise InputError(f"{plan.kind}: {exc}") from None
