"""``certeval backtest COMMAND``: a live command (compare, rank, select) played on recorded scores.

The request is the live command's own :class:`~certeval.tasks.plan.PlanRequest`, validated by
:func:`~certeval.tasks.plan.make_plan` exactly as the live command validates it, with the scores file's recorded
models as its models (``replay:SCORES#NAME``). Rep ``r`` is the live run of that plan with ``--seed seed + r``: the
same bank, the same group request (:meth:`~certeval.tasks.plan.RunPlan.group_request`), the same look size and
budget, and the shared order drawn from the same generator (:func:`certeval.engine.paired_order_rng`) — so rep 0
makes the decisions the live command makes with the same seed. The reps fan out through the one backtest driver as
``paired`` cells (:class:`~certeval.backtest.comparative.ComparativeBacktest`) and are checked against the exact
answer on the whole bank; :func:`command_backtest` adds the headline (``answer``): the fraction of the model x item
cells the command scored and the share of reps whose statement the exact answer contradicts.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..backends.base import KINDS as SPEC_KINDS
from ..backends.base import parse_model_spec
from ..estimators._validation import InputError, check_positive_int
from ..tasks.plan import PlanRequest, make_plan
from .comparative import ComparativeBacktest, compare_backtest, rank_backtest, select_backtest

LIVE_COMMANDS = ("compare", "rank", "select")
REP_RULE = "rep r is the live command run with --seed (seed + r) on the recorded scores"


@dataclass(frozen=True)
class CommandBacktestOptions:
    """A live command's request (its ``models``: names in ``scores`` or ``replay:`` specs; none: the default
    models, :func:`replay_models`) and how many reps to play it."""

    request: PlanRequest
    scores: str
    reps: int = 20
    use_ray: bool = False


def replay_models(scores: str, models: tuple[str, ...] | list[str] | None, kind: str) -> list[str]:
    """The replay specs of the request's models: ``NAME`` is ``replay:SCORES#NAME``, a ``replay:`` spec stays; none
    given: every model of ``scores`` (compare: the first two by name). A model that is not recorded is refused."""
    if not models:
        from ..tasks.inputs import _model_items

        names = sorted(_model_items(scores))
        models = names[:2] if kind == "compare" else names
    out = []
    for text in models:
        head = str(text).partition(":")[0].strip().lower()
        if head in SPEC_KINDS and head != "replay":
            raise InputError(f"--model {text!r}: a backtest plays recorded scores; name a model of --scores {scores!r} "
                             f"(NAME or replay:SCORES#NAME)")
        out.append(str(text) if head == "replay" else f"replay:{scores}#{text}")
    return out


def recorded_matrix(plan: Any, bank: Any) -> np.ndarray:
    """The plan's models' recorded scores on the bank's items (rows in the plan's order)."""
    from ..banks import score_matrix
    from ..tasks.inputs import _scores

    rows = []
    for spec in map(parse_model_spec, plan.models):
        rows.append(score_matrix(_scores(spec.location), [spec.name], bank)[0])
    matrix = np.vstack(rows)
    if np.isnan(matrix).any():
        k = int(np.argwhere(np.isnan(matrix).any(axis=1))[0, 0])
        raise InputError(f"--model {plan.models[k]!r} has no recorded score for some of the bank's items; pass a "
                         "bank it covers, or no --bank")
    return matrix


def command_backtest(opts: CommandBacktestOptions) -> dict[str, Any]:
    """Validate the live request (an :class:`InputError` names the bad flag), play ``reps`` reps of it and return
    the comparative backtest's result plus ``answer`` and ``config``; prints nothing."""
    kind = opts.request.kind
    if kind not in LIVE_COMMANDS:
        raise InputError(f"backtest COMMAND must be one of {', '.join(LIVE_COMMANDS)}; got {kind!r}")
    reps = check_positive_int(opts.reps, "--reps")
    models = replay_models(opts.scores, opts.request.models, kind)
    plan, prepared = make_plan(replace(opts.request, models=models, check_output=False, probe=False))
    matrix = recorded_matrix(plan, prepared.bank)
    spec = prepared.bank.spec(mean_of_means=plan.mean_of_means)
    request = plan.group_request(history=prepared.history)
    bt = ComparativeBacktest(matrix, tuple(plan.labels), spec, request, reps=reps, seed=plan.seed,
                             looks_every=plan.batch_size, max_items=plan.max_items, name=plan.task_name,
                             use_ray=opts.use_ray, live_order=True)
    out = {"compare": compare_backtest, "rank": rank_backtest, "select": select_backtest}[kind](bt)
    out["answer"] = answer(kind, out, request)
    out["config"] = {"command": kind, "scores": str(opts.scores), "models": list(plan.models),
                     "labels": list(plan.labels), "reps": reps, "seed": plan.seed, "rule": REP_RULE,
                     **{k: getattr(plan, k) for k in ("target", "confidence", "batch_size", "max_items", "goal",
                                                      "margin", "threshold", "halfwidth", "top", "mode", "epsilon",
                                                      "aggregate")},
                     "history": list(plan.history) or None}
    return out


def answer(kind: str, out: dict[str, Any], request: Any) -> dict[str, Any]:
    """The headline: the fraction of the model x item cells scored (mean over reps) and the share of reps whose
    statement the exact bank answer contradicts (``error_rate``), with what counts as an error."""
    s = out["summary"]
    if kind == "compare":
        rate = s["directional_error_rate"] + s["equivalence_error_rate"]
        what = "the pair's verdict contradicts the exact bank difference (at the margin)"
    elif kind == "rank":
        precision = request.precision is not None
        wrong = [r["errors"] > 0 or (precision and r.get("all_intervals_cover") is False) for r in out["rankings"]]
        rate = float(np.mean(wrong))
        what = ("a model's interval misses its exact bank mean or an ordering statement is wrong" if precision
                else "an ordering statement contradicts the exact bank means")
    else:
        rate = s["error_rate"]
        what = ("a model above the threshold discarded, or a selected model not within epsilon of the exact top-K"
                if request.target == "bank" else "a model above the threshold discarded")
    return {"fraction_used": s["fraction_used"], "error_rate": float(rate), "errors": what, "reps": s["reps"],
            "alpha": round(1.0 - request.confidence, 12)}


__all__ = ["LIVE_COMMANDS", "CommandBacktestOptions", "answer", "command_backtest", "recorded_matrix",
           "replay_models"]
