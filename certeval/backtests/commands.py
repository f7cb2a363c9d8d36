"""``certeval backtest COMMAND`` and :func:`certeval.api.backtest`: a live request (certify, compare, rank, select)
played on recorded scores.

The request is the live command's own (:mod:`certeval.requests`), validated by
:func:`~certeval.runs.plan.make_plan` exactly as the live command validates it, with the scores file's recorded
models as its models (``replay:SCORES#NAME``). Rep ``r`` is the live run of that plan with ``--seed seed + r``, so
rep 0 makes the decisions the live command makes with the same seed:

* compare, rank, select: the same bank, the same group request (:meth:`~certeval.runs.plan.RunPlan.group_request`),
  the same look size and budget, and the shared order drawn from the same generator
  (:func:`certeval.engine.paired_order_rng`); the reps fan out through the one backtest driver as ``paired`` cells
  (:class:`~certeval.backtests.comparative.ComparativeBacktest`);
* certify: each model's method started as the live run starts it (the same goal, budget, history prior and item
  features) and driven by the same round engine (:class:`certeval.engine.SingleModelRounds`) with the live run's
  generator of round ``k``, ``default_rng([seed, k])`` (:meth:`certeval.runs.run.Run.rng`).

Each rep is checked against the exact answer on the whole bank; :func:`request_backtest` adds the headline
(``answer``): the fraction of the model x item cells the command scored and the share of reps whose statement the
exact answer contradicts (certify: whose interval misses the model's exact bank mean).
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

import numpy as np

from certeval.errors import InputError
from certeval.estimators.distribution.comparison import ComparisonDesign
from certeval.estimators.groups import RANKINGS
from certeval.estimators.validation import check_positive_int
from certeval.inputs.model_spec import KINDS as SPEC_KINDS
from certeval.inputs.model_spec import parse_model_spec
from certeval.requests import IDENTITY, REQUESTS, BacktestOptions, field_default
from certeval.runs.plan import make_plan

from .comparative import ComparativeBacktest, compare_backtest, rank_backtest, select_backtest

LIVE_COMMANDS = tuple(REQUESTS)
REP_RULE = "rep r is the live command run with --seed (seed + r) on the recorded scores"
HISTORY_RULE = ("each rep splits the models at random (seeded by the scores, the models and the rep): the history "
                "share is the prior of the rest, which are run on an order of their own")


def replay_models(scores: str, models: tuple[str, ...] | list[str] | None, kind: str, *,
                  every: bool = False) -> list[str]:
    """The replay specs of the request's models: ``NAME`` is ``replay:SCORES#NAME``, a ``replay:`` spec stays; none
    given: every model of ``scores`` (compare: the first two by name, unless ``every``: its pairs are sampled). A
    model that is not recorded is refused."""
    if not models:
        from certeval.runs.inputs import _model_items

        names = sorted(_model_items(scores))
        models = names[:2] if kind == "compare" and not every else names
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
    from certeval.inputs.banks import score_matrix
    from certeval.runs.inputs import _scores

    specs = [parse_model_spec(m) for m in plan.models]
    matrix = np.empty((len(specs), bank.n_items))
    for location in dict.fromkeys(spec.location for spec in specs):  # one lookup a scores file, not a model
        rows = [k for k, spec in enumerate(specs) if spec.location == location]
        matrix[rows] = score_matrix(_scores(location), [specs[k].name for k in rows], bank)
    if np.isnan(matrix).any():
        k = int(np.argwhere(np.isnan(matrix).any(axis=1))[0, 0])
        raise InputError(f"--model {plan.models[k]!r} has no recorded score for some of the bank's items; pass a "
                         "bank it covers, or no --bank")
    return matrix


def request_backtest(request: Any, options: BacktestOptions, *, use_ray: bool = False) -> dict[str, Any]:
    """Validate the live ``request`` (an :class:`InputError` names the bad flag; its ``models``: names in
    ``options.scores`` or ``replay:`` specs, none: :func:`replay_models`) and the backtest ``options``, play
    ``options.reps`` reps of it and return the backtest's result plus ``answer`` and ``config``; prints nothing."""
    kind = request.kind
    if kind not in LIVE_COMMANDS:
        raise InputError(f"backtest COMMAND must be one of {', '.join(LIVE_COMMANDS)}; got {kind!r}")
    scores, reps = _checked_options(request, options)
    models = replay_models(scores, request.models, kind, every=options.pairs is not None)
    # compare --pairs: the plan is the live compare of the first pair (each sampled pair is a live compare of its own)
    planned = models[:2] if kind == "compare" else models
    plan, prepared = make_plan(replace(request, models=tuple(planned)), check_output=False, probe=False)
    if kind == "compare" and len(models) > 2:
        if options.pairs is None:
            raise InputError(f"compare plays two models, got {len(models)}; name two with --model, or sample pairs "
                             "of them with --pairs P")
        plan = replace(plan, models=tuple(models), labels=_labels(models))
    matrix = recorded_matrix(plan, prepared.bank)
    if kind == "certify":
        out = certify_backtest(plan, prepared, matrix, reps)
        alpha = round(1.0 - plan.confidence, 12)
        out["answer"] = {"fraction_used": out["summary"]["fraction_used"],
                         "error_rate": out["summary"]["miss_rate"], "reps": reps, "alpha": alpha,
                         "errors": "a model's interval misses its exact bank mean"}
    else:
        spec = prepared.bank.spec(mean_of_means=plan.mean_of_means)
        group = replace(plan.group_request(history=prepared.history), ranking=options.ranking)
        if group.target == "distribution":
            group = replace(group, design=ComparisonDesign(
                alpha=group.alpha, margin=group.margin, statistic=options.statistic, spending=options.spending,
                look_size=plan.batch_size))
        fraction = options.history_fraction  # None but for rank and select (_checked_options)
        bt = ComparativeBacktest(matrix, tuple(plan.labels), spec, group, reps=reps, seed=plan.seed,
                                 looks_every=plan.batch_size, max_items=plan.max_items,
                                 n_pairs=options.pairs or 1, use_ray=use_ray,
                                 history_fraction=fraction, live_order=fraction is None)
        out = {"compare": compare_backtest, "rank": rank_backtest, "select": select_backtest}[kind](bt)
        out["answer"] = answer(kind, out, group)
    # what was played: the validated plan's value of every field that makes the request what it is
    played = {f.name: getattr(options, f.name) for f in fields(options)
              if f.name not in ("scores", "reps") and options.reads(f.name, kind)}
    out["config"] = {"command": kind, "scores": str(scores), **{k: getattr(plan, k) for k in IDENTITY},
                     "models": list(plan.models), "labels": list(plan.labels), "reps": reps,
                     "rule": REP_RULE if kind == "certify" or options.history_fraction is None else HISTORY_RULE,
                     "history": list(plan.history) or None, **played}
    return out


def _checked_options(request: Any, options: BacktestOptions) -> tuple[str, int]:
    """The backtest options' one validation step: an option ``request``'s kind does not read keeps its default,
    the distribution target's options need that target, ``--ranking`` needs ``--epsilon``, a history share lies in
    (0, 1) and replaces ``--history``. Returns the scores and the reps."""
    kind = request.kind
    if not options.scores:
        raise InputError("backtest needs --scores (recorded scores: a scores file or bundled:<name>)")
    for f in fields(options):
        value = getattr(options, f.name)
        if not options.reads(f.name, kind) and value != field_default(f):
            raise InputError(f"{f.metadata['flags'][0]} {value!r} does not apply to backtest {kind}")
    reps = check_positive_int(options.reps, "--reps")
    if options.pairs is not None:
        check_positive_int(options.pairs, "--pairs")
    if kind == "certify":  # reads none of the paired options (their defaults were checked above)
        return str(options.scores), reps
    target, defaults = request.target or "bank", BacktestOptions()
    if target != "distribution":
        for name in ("statistic", "spending"):
            value = getattr(options, name)
            if value != getattr(defaults, name):
                raise InputError(f"--{name} {value!r} applies to --target distribution (the group-sequential "
                                 f"tests), not to the {target} target")
    if options.ranking not in RANKINGS:
        raise InputError(f"--ranking must be one of {', '.join(RANKINGS)}, got {options.ranking!r}")
    if kind == "rank" and options.ranking != defaults.ranking and request.epsilon is None:
        raise InputError(f"--ranking {options.ranking!r} chooses the epsilon-ranking's construction; it needs --epsilon")
    fraction = options.history_fraction
    if fraction is not None:
        if target != "bank":
            raise InputError(f"--history-fraction {fraction!r} applies to the bank target, not --target {target}")
        if not 0.0 < fraction < 1.0:
            raise InputError(f"--history-fraction must lie in (0, 1) for a ranking or selection (the rest of the "
                             f"models are run), got {fraction!r}")
        if request.history:
            raise InputError("give --history SOURCE or --history-fraction F, not both")
        models = replay_models(options.scores, request.models, kind)
        if len(models) < 3:
            raise InputError(f"--history-fraction needs at least three models (one as history, two run), got "
                             f"{len(models)}: {', '.join(models)}")
    return str(options.scores), reps


def _labels(models: list[str]) -> tuple[str, ...]:
    return tuple(parse_model_spec(m).name or m for m in models)


def certify_backtest(plan: Any, prepared: Any, matrix: np.ndarray, reps: int) -> dict[str, Any]:
    """``reps`` reps of a certify plan on its models' recorded scores (``matrix``: rows in the plan's label
    order); rep ``r`` is the live run with seed ``plan.seed + r``. Per rep and model: its interval, items scored
    and stopping rule, and whether the interval holds the model's exact bank mean."""
    from certeval.engine import SingleModelRounds
    from certeval.estimators import make_method, method_for_goal, parse_goal
    from certeval.inputs.banks import bank_features

    bank, goal = prepared.bank, parse_goal(plan.goal)
    spec = bank.spec(mean_of_means=plan.mean_of_means)
    needs = getattr(make_method(plan.method, confidence=plan.confidence), "needs_features", False)
    features = bank_features(bank, needs, plan.method)  # as the live run's embed step
    if features is not None:
        spec = bank.spec(features=features, mean_of_means=plan.mean_of_means)
    exact = matrix @ spec.weights()
    rows = {label: k for k, label in enumerate(plan.labels)}
    runs = []
    for rep in range(reps):
        seed = plan.seed + rep
        methods = {label: method_for_goal(plan.method, goal, plan.max_items, confidence=plan.confidence).start(
            replace(spec, history=prepared.history[label]) if label in prepared.history else spec)
            for label in plan.labels}
        rounds = SingleModelRounds(methods, goal, n_items=bank.n_items, batch_size=plan.batch_size,
                                   max_items=plan.max_items)
        look = 0
        while rounds.active:  # the live run's rounds: one generator per round, keyed by (seed, round)
            proposals = rounds.select(lambda _label: np.random.default_rng([seed, look]), look=look + 1)
            for label, proposal in proposals.items():
                items = np.asarray(proposal.items, dtype=np.int64)
                rounds.update(label, items, matrix[rows[label]][items])
            rounds.decide(list(proposals), look=look + 1)
            look += 1
        runs.append({"rep": rep, "seed": seed, "models": [_certified(label, methods[label].result(),
                                                                     rounds.decisions[label], exact[rows[label]])
                                                          for label in plan.labels]})
    cells = [m for run in runs for m in run["models"]]
    summary = {"reps": reps, "fraction_used": float(np.mean([m["n_scored"] for m in cells]) / bank.n_items),
               "miss_rate": float(np.mean([not m["covered"] for m in cells])),
               "reached": float(np.mean([m["reached"] for m in cells]))}
    return {"runs": runs, "summary": summary}


def _certified(label: str, estimate: Any, decision: Any, exact: float) -> dict[str, Any]:
    return {"model": label, "mean": float(estimate.mean), "lower": float(estimate.lower),
            "upper": float(estimate.upper), "n_scored": int(estimate.n_scored), "rule": decision.rule,
            "reached": bool(decision.reached), "exact": float(exact),
            "covered": bool(estimate.lower <= exact + 1e-12 and exact <= estimate.upper + 1e-12)}


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


__all__ = ["LIVE_COMMANDS", "answer", "certify_backtest", "recorded_matrix", "replay_models", "request_backtest"]
