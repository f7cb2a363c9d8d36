"""``certeval backtest``: replay recorded scores as if the models were queried live.

``certeval backtest COMMAND --scores S [COMMAND's own flags] --reps R`` (COMMAND: certify, compare, rank, select)
plays the live command on recorded scores: its flags are the live command's, generated from its request
(:mod:`certeval.requests`), its request the one the live command builds, and each rep is checked against the exact
answer (:func:`certeval.backtests.commands.request_backtest`, what :func:`certeval.api.backtest` plays).

Without COMMAND, ``--goal halfwidth:E | above:T | below:T --method M`` backtests a single-model method
(:func:`certeval.backtests.single.run_single_backtest`) and ``--method faq`` is
:func:`certeval.backtests.faq.faq_backtest`. The library takes typed options and returns the result; this module
turns the parsed arguments into those options and prints the result (a table, or ``--json``). The older
``--goal compare:D | rank:D | select:T,E`` spellings are gone: each is refused in one line naming its COMMAND form.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from certeval.errors import InputError
from certeval.estimators.validation import check_confidence, check_positive_int
from certeval.runs.progress import BacktestProgress, progress_mode

from ..estimators.goals import parse_goal
from ..requests import REQUESTS
from ._common import add_common, print_json
from ._runtime import add_runtime_options, runtime_options

GONE_GOALS = ("compare", "rank", "select")  # the older --goal compare:D | rank:D | select:T,E: now backtest COMMAND


def _goal(text: str) -> str:
    """``--goal``'s text; a gone ``compare:D | rank:D | select:T,E`` is refused with its ``backtest COMMAND`` form."""
    head, sep, raw = text.strip().partition(":")
    kind = head.strip().lower()
    if not sep or kind not in GONE_GOALS:
        return text
    values = [v.strip() for v in raw.split(",")]
    if kind == "select":
        threshold, halfwidth = (values + ["E"])[:2]
        flags = f"--threshold {threshold or 'T'} --halfwidth {halfwidth or 'E'}"
    else:
        flags = f"--margin {values[0] or 'D'}" + (" [--pairs P]" if kind == "compare" else "")
    raise argparse.ArgumentTypeError(
        f"--goal {text} is gone; use: certeval backtest {kind} --scores S {flags} [its own flags: --looks-every is "
        "--batch-size, --items is --bank; rank:0 --epsilon E is rank --epsilon E]")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("backtest", help="replay recorded scores as if queried live",
                              description="certeval backtest COMMAND --scores S [COMMAND's flags] --reps R plays a "
                                          "live certify, compare, rank or select on recorded scores; without "
                                          "COMMAND, --goal names a single-model goal and --method its method")
    p.add_argument("--scores", default=None,
                   help="recorded scores (model, item_id, score[, subset]); bundled:<name> works (required)")
    p.add_argument("--items", default=None, help="item bank with text and/or embedding (optional)")
    p.add_argument("--metric", default=None, help="lm-eval samples / Inspect logs: the metric or scorer to read "
                                                   "(default: the file's first)")
    p.add_argument("--model", action="append", default=None, help="model to replay (repeatable; default all)")
    p.add_argument("--method", default=None,
                   help="history (default with --history/--history-fraction), adaptive (default otherwise), "
                        "static, seq, cer-eval, uniform, faq")
    p.add_argument("--goal", default="halfwidth:0.05", type=_goal,
                   help="halfwidth:E, above:T, below:T (each may add +diminishing:G); compare, rank and select are "
                        "certeval backtest COMMAND")
    p.add_argument("--reps", type=int, default=20, help="repetitions per model (default 20)")
    p.add_argument("--batch-size", type=int, default=10, help="items per round (default 10)")
    p.add_argument("--max-items", type=int, default=None, help="item budget per run")
    p.add_argument("--target", choices=("bank", "distribution"), default="bank",
                   help="estimand: the bank's mean (default) or the i.i.d. distribution's")
    p.add_argument("--features", choices=("auto", "text", "factors", "none"), default="auto",
                   help="item features for cer-eval/adaptive: auto (embeddings or embedded text if the bank has "
                        "them, default), text, factors (item factors fitted on the other fold of models), none")
    p.add_argument("--strata", choices=("auto", "subsets", "features"), default=None,
                   help="adaptive only: strata from sub-datasets, or refined by k-means on the features "
                        "(default: the method's own, auto)")
    # options of the history and FAQ modes (read by those modules)
    p.add_argument("--history", action="append", default=None, metavar="SOURCE",
                   help="other models' recorded scores (scores file, bundled:<name>, run folder; repeatable): the "
                        "history of method 'history'; each evaluated model is left out of its own history")
    p.add_argument("--history-fraction", type=float, default=None,
                   help="a random fraction F of the scores file's other models is each rep's history "
                        "(method 'history' and FAQ)")
    p.add_argument("--history-permute", action="store_true",
                   help="shuffle the history's items in every rep (useless history: validity check)")
    p.add_argument("--history-models", type=int, default=None, help="FAQ: models used as history")
    p.add_argument("--budget", type=float, default=None, help="FAQ: item budget (fraction < 1 or a count)")
    p.add_argument("--missing", type=float, default=None, help="FAQ: fraction of history entries hidden")
    p.add_argument("--ci", choices=("default", "paper", "anytime"), default=None, help="FAQ: interval type")
    add_common(p)
    add_runtime_options(p, only=("cache_dir",))  # embedded item texts; backtests start no model
    p.set_defaults(func=run)
    _add_commands(p)


def _add_commands(p) -> None:
    """``certeval backtest COMMAND``: the live command's own flags, plus --scores and --reps."""
    from .pipeline import HELPS, add_command_flags
    from .request_flags import add_backtest_flags

    sub = p.add_subparsers(dest="backtest_command", metavar="COMMAND", required=False)
    for name in REQUESTS:
        c = sub.add_parser(name, help=f"play the live {name} on recorded scores ({HELPS[name]})",
                           description=f"certeval {name} played on recorded scores, each rep checked against the "
                                       "exact answer on the whole bank; rep r is the live run with --seed (seed + r)")
        add_backtest_flags(c, name)
        add_command_flags(c, name, live=False)
        c.set_defaults(func=run_command, command=name, goal=None)  # the parent's --goal is not this command's


def run_command(args) -> int:
    """``certeval backtest COMMAND``: the live command's request from its flags, played (:func:`certeval.api.backtest`)
    and printed."""
    from certeval.api import backtest

    from .request_flags import backtest_options_from_args, request_from_args

    if "auto" in (args.history or []):
        raise InputError(f"--history auto names earlier select runs under --output; backtest {args.command} takes "
                         "recorded scores (a scores file, bundled:<name>, run folders)")
    request = request_from_args(args, args.command, models=tuple(args.models or ()),
                                history=tuple(args.history or ()))
    options = backtest_options_from_args(args, args.command)
    out = backtest(request, scores=options.scores, options=options).to_dict()
    if args.json:
        print_json(out)
        return 0
    from .backtest_tables import print_certify, print_compare, print_rank, print_select

    {"certify": print_certify, "compare": print_compare, "rank": print_rank, "select": print_select}[args.command](out)
    a = out["answer"]
    print(f"{args.command} on recorded scores, {a['reps']} rep(s): {a['fraction_used']:.3f} of the model x item "
          f"cells used; error rate {a['error_rate']:.3f} (alpha {a['alpha']:g}; an error: {a['errors']})")
    return 0


def _delegate(module: str, function: str, args) -> int:
    try:
        importlib.import_module(f"certeval.backtests.{module}")
    except ModuleNotFoundError as exc:
        if exc.name == f"certeval.backtests.{module}":
            raise InputError(f"backtest mode {module!r} is not available in this installation") from None
        raise
    return int(globals()[function](args) or 0)


def _given(options: type, args, **values):
    """``options`` (a dataclass) from the flags ``args`` holds a value for, ``values`` over them; the rest keep the
    dataclass's defaults, written there once."""
    from dataclasses import fields

    given = {f.name: getattr(args, f.name) for f in fields(options) if getattr(args, f.name, None) is not None}
    return options(**{**given, **values})


def run_faq_backtest(args) -> int:
    """``--method faq``: the options from the parsed arguments, the result printed."""
    from certeval.backtests.faq import FaqBacktestOptions, faq_backtest

    opts = _given(FaqBacktestOptions, args, models=tuple(str(m) for m in args.model) if args.model else None,
                  scores=str(args.scores), items=args.items or None)
    report = faq_backtest(opts)
    if args.json:
        print_json(report)
    else:
        s, ci = report["summary"], report["ci"]
        fm = report["factor_model"]
        print(f"faq backtest: {report['new_models']} new models × {report['reps']} reps, budget "
              f"{report['budget']}/{report['n_items']}, history {report['history_models']} models, "
              f"K={fm['n_factors']}, λ={fm['penalty']:g}")
        print(f"  {ci} interval: coverage {s['coverage']:.3f}, mean half-width {s['mean_halfwidth']:.4f}")
        print(f"  paper interval: coverage {s['paper_coverage']:.3f}, mean half-width {s['paper_mean_halfwidth']:.4f}")
        print(f"  uniform: coverage {s['uniform_coverage']:.3f}, mean half-width {s['uniform_mean_halfwidth']:.4f}")
        print(f"  ESS ratio (uniform variance / FAQ variance): {s['ess_ratio']:.2f}")
        sys.stdout.flush()
    return 0


def run(args) -> int:
    if args.scores is None:
        raise InputError("backtest needs --scores (recorded scores: a scores file or bundled:<name>)")
    args.cache_dir = runtime_options(args).cache_dir  # checked first: a bad --cache-dir exits 2
    if args.method is None:
        with_history = bool(args.history) or args.history_fraction is not None
        args.method = "history" if with_history else "adaptive"
    if args.method == "faq":
        if args.metric:
            raise InputError(f"--metric {args.metric!r} does not apply to --method faq; convert with "
                             "certeval import lm-eval|inspect --metric NAME first")
        return _delegate("faq", "run_faq_backtest", args)
    return run_single(args)


def run_single(args) -> int:
    from certeval.backtests.single import SingleBacktestOptions, run_single_backtest
    from certeval.inputs.banks import bank_from_scores, load_items, load_scores

    from ..estimators import method_names

    # validate everything cheap before reading data
    confidence = check_confidence(args.confidence)
    goal = parse_goal(args.goal)
    reps = check_positive_int(args.reps, "reps")
    batch = check_positive_int(args.batch_size, "batch-size")
    max_items = None if args.max_items is None else check_positive_int(args.max_items, "max-items")
    if args.method not in method_names():
        raise InputError(f"unknown method {args.method!r}; choose one of {', '.join(method_names())}")
    if args.history_models is not None:
        raise InputError("--history-models applies to --method faq; use --history-fraction F")
    scores = load_scores(args.scores, args.metric)
    history = None
    if args.history:
        from certeval.inputs.history import load_history

        history = load_history(args.history, metric=args.metric)
    items = None if args.items is None else load_items(args.items)
    if items is not None and len(items) == 0:
        raise InputError(f"items file {args.items!r} is empty (no items)")
    bank = bank_from_scores(scores, items)
    all_models = sorted(scores["model"].unique())
    models = args.model or all_models
    with BacktestProgress(progress_mode(args.json, args.quiet),
                          what=f"{args.method} {goal} on {len(models)} model(s) x {reps} reps") as progress:
        options = SingleBacktestOptions(
            args.method, goal, confidence=confidence, reps=reps, seed=args.seed, batch_size=batch,
            max_items=max_items, target=args.target, features=args.features, method_params=_method_params(args),
            history=history, history_fraction=args.history_fraction, history_permute=args.history_permute,
            baseline="uniform" if args.method == "history" else None, cache_dir=args.cache_dir)
        out = run_single_backtest(scores, bank, list(models), options, all_models=all_models,
                                  progress=progress.update, on_rows=progress.rows)
    if args.json:
        print_json(out)
    else:
        _print_table(out)
    return 0


def _method_params(args) -> dict:
    strata = args.strata
    if strata is None:
        return {}
    if args.method != "adaptive":
        raise InputError(f"--strata applies to --method adaptive only, got --method {args.method}")
    return {"strata": strata}


def _print_table(out: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    threshold = out["goal"].startswith(("above", "below"))
    table = Table(title=f"backtest: {out['method']}  goal {out['goal']}  confidence {out['confidence']:g}  "
                        f"{out['reps']} reps  seed {out['seed']}  ({out['n_items']} items; truth = {out['truth']})")
    ratio = out["summary"].get("ratio_to_uniform") is not None
    cols = ["model", "truth", "items scored", "fraction", "coverage", "half-width", "goal met"]
    if ratio:
        cols += ["÷ uniform"]
    if threshold:
        cols += ["decided", "correct"]
    for c in cols:
        table.add_column(c, justify="left" if c == "model" else "right")
    for m in out["models"]:
        row = [m["model"], f"{m['truth']:.4f}", f"{m['mean_scored']:.1f}", f"{m['fraction_scored']:.3f}",
               f"{m['coverage']:.3f}", f"{m['mean_halfwidth']:.4f}", f"{m['reached']:.2f}"]
        if ratio:
            row += [f"{m['ratio_to_uniform']:.3f}"]
        if threshold:
            row += [f"{m['decided']:.2f}", f"{m['decision_correct']:.2f}"]
        table.add_row(*row)
    s = out["summary"]
    Console().print(table)
    print(f"summary: mean fraction scored {s['mean_fraction_scored']:.3f}, coverage {s['coverage']:.3f}, "
          f"goal met {s['reached']:.3f}"
          + (f", items ÷ uniform's on the same reps {s['ratio_to_uniform']:.3f}" if ratio else ""))
    if out.get("history"):
        h = out["history"]
        what = (f"a random {h['fraction']:g} of the other models per rep" if h["fraction"] is not None
                else ", ".join(h["sources"]))
        print(f"history: {what}; {h['mean_models']:.1f} models on average"
              + ("; items permuted (useless history)" if h["permuted"] else "") + f"; {h['rule']}")
