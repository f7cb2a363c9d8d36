"""``certeval certify | compare | rank | select | demo``: the pipeline over Prefect flows and Ray actors.

Everything the command line can get wrong is checked first (model specs, bank,
scorer, goal, numbers, the output location, a resumed run's stored config), so
bad input exits 2 in about a second, before Ray or Prefect start and before
anything is written.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from certeval.runtime.envsetup import prepare_env, user_prefect_configured
from certeval.runtime.watchdog import start_watchdog

from ._common import add_output_flags, print_json
from ._runtime import ALL, add_runtime_options, runtime_options
from .request_flags import add_request_flags, request_from_args
from .surfaces import (
    AUTO_HISTORY,
    add_lm_eval_flags,
    check_surfaces,
    checkpoint_specs,
    with_device_and_batch,
    with_model_args,
)

PIPELINE_COMMANDS = ("certify", "compare", "rank", "select")


HELPS = {
    "certify": "certify each model's score to a goal (halfwidth:E, above:T, below:T)",
    "compare": "compare two models on the same items (bank target by default)",
    "rank": "rank models by sequential pairwise comparisons, with tie groups",
    "select": "select models: discard those below a threshold, keep the best",
}


def add_parser(subparsers) -> None:
    for name in PIPELINE_COMMANDS:
        p = subparsers.add_parser(name, help=HELPS[name], description=HELPS[name])
        add_command_flags(p, name)
        add_runtime_options(p)
        p.set_defaults(func=run, command=name)
    _add_demo(subparsers)


def add_command_flags(p, name: str, *, live: bool = True) -> None:
    """The flags that say what ``certeval NAME`` asks: the request's fields (:mod:`certeval.requests`, generated
    by :func:`~certeval.cli.request_flags.add_request_flags`), the command line's own surfaces and the output
    flags. ``live=False``: those ``certeval backtest NAME`` plays on recorded scores (--model optional: the scores'
    models; no --checkpoints, --model_args, lm-eval flags, --dry-run or a live run's output and Ray flags)."""
    helps = None if live else {"models": "a recorded model of --scores, NAME or replay:<scores>#<model> (repeatable; "
                                         "default: every model, compare: the first two by name)"}
    add_request_flags(p, name, live=live, types={"max_items": _limit}, helps=helps)
    add_output_flags(p)
    if name == "select" and live:
        p.add_argument("--checkpoints", action="append", default=None, metavar="PATH_OR_GLOB",
                       help="checkpoint folders (repeatable; a glob such as 'runs/ckpt-*' in quotes): each a "
                            "transformers model, hf:<folder>, named by its folder; with or instead of --model. "
                            "--history auto: earlier select runs on this bank under --output that scored any of "
                            "these models are the history")
    if live:
        p.add_argument("--model_args", "--model-args", dest="model_args", default=None, metavar="K=V,...",
                       help="options added to every --model spec (lm-eval style: key=value,key=value)")
        add_lm_eval_flags(p)
    if name in ("rank", "select") and live:
        p.add_argument("--dry-run", action="store_true",
                       help="cost preview: call no model and write nothing; play the request on the --history "
                            "models (recorded scores, never your own models) and print the predicted fraction "
                            "of the model x item cells it will score, with its range")


def _add_demo(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="the main job: rank recorded models and certify a real small LM",
                                 description="Rank recorded models (bundled:helm_mmlu) and certify SmolLM2-135M on "
                                             "the red-trivia bank, through Prefect and Ray.")
    add_request_flags(demo, "rank", only=("output", "ray_address", "seed"))
    demo.add_argument("--lm-items", type=int, default=60, help="item budget of the small-LM certification (default 60)")
    demo.add_argument("--skip-lm", action="store_true", help="only the ranking of recorded models")
    demo.add_argument("--json", action="store_true")
    add_runtime_options(demo, only=tuple(n for n in ALL if n != "parallel_start"))  # demo_flow has no prestart
    demo.set_defaults(func=run_demo, command="demo")


def _limit(text: str) -> int | float:
    """A whole number of items, or (with --tasks) a fraction below 1; ``2.0`` is 2, as lm-eval reads it."""
    from argparse import ArgumentTypeError

    from .ranges import INT_RANGES

    least, most = INT_RANGES["--max-items"]
    refusal = ArgumentTypeError(f"must be a whole number of items in [{least}, {most}] or a fraction in (0, 1), "
                                f"got {text!r}")
    try:
        value: int | float = int(text)
    except ValueError:
        try:
            value = float(text)
        except ValueError:
            raise refusal from None
        if value >= 1 and value.is_integer():
            value = int(value)
    if isinstance(value, int) and not least <= value <= most or isinstance(value, float) and not 0 < value < 1:
        raise refusal
    return value


def use_services(args) -> None:
    """A run with no Ray address and no Prefect settings of its own reuses what ``certeval up`` started from this
    working folder, when both still answer (:func:`certeval.services.up_down.shared_ray_address`)."""
    from certeval.services.up_down import shared_ray_address

    args.ray_address = shared_ray_address(args.ray_address)


def history_sources(args, models: list[str]) -> tuple[list[str] | None, str | None]:
    """``--history`` as given, with ``auto`` (select only) replaced by the earlier select runs it names, and the line
    that announces them (printed once the plan has read them: a refused one is the command's only line). Without
    ``--history`` there is no history: the same command twice gives the same answer."""
    from certeval.errors import InputError

    sources = list(args.history or [])
    if AUTO_HISTORY not in sources:
        return sources or None, None
    if args.command != "select" or (args.target or "bank") != "bank":
        raise InputError(f"--history {AUTO_HISTORY} (earlier select runs under --output as history) is for select on "
                         f"the bank target; got {args.command} with --target {args.target or 'bank'}")
    from ..storage import DEFAULT_OUTPUT

    earlier = earlier_select_runs(args, models)
    where = args.output or DEFAULT_OUTPUT
    note = (f"certeval: --history auto: {len(earlier)} earlier select run(s) under {where} as history"
            + (f": {', '.join(earlier)}" if earlier else " (none found: no history)"))
    sources = [s for s in sources if s != AUTO_HISTORY] + earlier
    return sources or None, note


def earlier_select_runs(args, models: list[str]) -> list[str]:
    """``select --history auto``: the finished select runs under the same local output root, on the same bank, that
    scored at least one of these models (yesterday's run of a scheduled job); each model's own earlier scores never
    count for itself, and their folders are checked when read."""
    import json

    from ..storage import DEFAULT_OUTPUT, MAX_RECORD_BYTES, read_file

    root = Path(args.output or DEFAULT_OUTPUT)
    if "://" in str(args.output or "") or not root.is_dir():
        return []
    runs = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name != args.run_id):
        try:  # read as any run folder's file: a pipe or a huge file there is skipped, never waited on
            config = json.loads(read_file(str(folder / "config.json"), "config.json", MAX_RECORD_BYTES))
        except (OSError, ValueError):  # InputError included: not a readable run, not one of the earlier runs
            continue
        if (isinstance(config, dict) and config.get("kind") == "select" and config.get("bank") == args.bank
                and (folder / "results.json").is_file() and set(config.get("models") or []) & set(models)):
            runs.append(str(folder))
    return runs


def plan_from_args(args, options=None) -> tuple[Any, Any]:
    from dataclasses import replace

    from certeval.errors import InputError
    from certeval.harnesses.lm_eval_requests import fraction_budget, request_options
    from certeval.harnesses.lm_eval_tasks import is_lm_eval_task, tasks_bank
    from certeval.runs.plan import make_plan

    check_surfaces(args)  # --limit, --num_fewshot / --include_path without --tasks
    models = list(args.models or []) + checkpoint_specs(getattr(args, "checkpoints", None))
    if not models:
        raise InputError(f"{args.command} needs models: --model SPEC (repeatable)"
                         + (" or --checkpoints PATH_OR_GLOB" if args.command == "select" else ""))
    models = with_model_args(models, getattr(args, "model_args", None),
                             trust_remote_code=getattr(args, "trust_remote_code", False))
    models = with_device_and_batch(args, models)
    requests = request_options(args, models, getattr(options, "cache_dir", None))  # chat template, gen_kwargs
    if args.bank is not None:  # lm-eval task names become the bank lm-eval builds from them
        args.bank = tasks_bank(args.bank, getattr(args, "include_path", None), getattr(args, "num_fewshot", None),
                               requests)
    fraction = args.max_items if isinstance(args.max_items, float) else None
    if fraction is not None:  # lm-eval's fractional --limit: known once the bank is built
        if not is_lm_eval_task(args.bank):
            raise InputError(f"--limit {fraction!r} is a fraction of each lm-eval task's docs: --tasks {args.bank!r} "
                             "is a bank file; give a whole number of items")
        args.max_items = None
    sources, note = history_sources(args, models)
    plan, prepared = make_plan(request_from_args(args, args.command, models=tuple(models), history=tuple(sources or ()),
                                                 options=options))
    if fraction is not None:
        args.max_items = fraction
        plan = replace(plan, max_items=fraction_budget(prepared.bank.frame, fraction))
    if note:
        print(note, file=sys.stderr)
    return plan, prepared


def dry_run(args, options=None) -> int:
    """``rank|select --dry-run``: validated like the run (without its history), then previewed on the history."""
    from .surfaces import dry_run as preview

    return preview(args, options, plan_from_args)


def run(args) -> int:
    from .surfaces import LIST_WORDS, list_tasks

    if args.bank in LIST_WORDS:  # --tasks list: lm-eval's table of the tasks it knows; nothing started
        print(list_tasks(args.bank, getattr(args, "include_path", None)))
        return 0
    from certeval.runtime.startup import configure, mark

    options = runtime_options(args)  # a bad flag stops here: exit 2, nothing written
    if getattr(args, "dry_run", False):
        return dry_run(args, options)
    configure(options.startup_log)
    mark("cli_parsed")
    use_services(args)
    user_prefect = user_prefect_configured()  # before prepare_env sets the project-local PREFECT_HOME
    prepare_env()
    plan, prepared = plan_from_args(args, options)  # every InputError happens here, before Ray/Prefect
    mark("plan_ready")
    from certeval.runs.progress import progress_mode

    from ..api import run_plan_live
    from ._failure import set_run_folder

    results = run_plan_live(plan, prepared, user_prefect=user_prefect, progress=progress_mode(args.json, args.quiet),
                            log_samples=args.log_samples, on_claimed=set_run_folder)
    if args.json:
        print_json(results)
    else:
        print(summary(results))
    return 0 if results.get("reached") else 1


def typed(results: dict[str, Any]) -> Any:
    """The run's results as the typed record (:class:`certeval.record.results.RunResults`), less what the CLI adds
    to its ``--json`` output (``report``, ``samples_files``)."""
    from dataclasses import fields

    from certeval.record.results import RunResults

    return RunResults.from_json({f.name: results[f.name] for f in fields(RunResults) if f.name in results})


def summary(results: dict[str, Any]) -> str:
    """A short human summary of a run's results (results.json, plus the CLI's ``report`` path), read through the
    typed record."""
    from certeval.reports.answer import model_verdicts
    from certeval.reports.plots import spell_verdict

    record = typed(results)
    target = f", {record.target} target"
    lines = [f"{record.kind} on {record.task} (confidence {record.confidence:g}{target}), "
             f"{record.rounds} round(s); estimand: {record.aggregate.text}"]
    verdicts = model_verdicts(record)  # the report's words: rank (ties share one), status, the pair's verdict
    for m in record.models:
        mean = "nan" if m.mean is None else f"{m.mean:.4f}"
        lines.append(f"  {m.model:<40} {mean} [{m.lower:.4f}, {m.upper:.4f}]  "
                     f"{m.n_scored}/{m.n_total} items  {verdicts.get(m.model, '')}")
    if record.ranking:
        groups = [" = ".join(g) for g in record.ranking.tie_groups]
        epsilon = record.ranking.epsilon
        how = "" if epsilon is None else f" (each listed above the next groups up to ε = {epsilon:g})"
        lines.append(f"  ranking{how}: " + "  >  ".join(groups))
    if record.kind == "compare" and record.pairs:
        p = record.pairs[0]
        lines.append(f"  {p.model_a} - {p.model_b}: {p.diff:.4f} [{p.lower:.4f}, {p.upper:.4f}] -> {spell_verdict(p)}")
    if record.selection:
        lines.append("  selected: " + ", ".join(record.selection.selected))
    lines.append(f"  run folder: {record.run_folder}  ({record.pipeline.wall_s:.0f} s)")
    if results.get("report"):
        lines.append(f"  report: {results['report']}")
    return "\n".join(lines)


def run_demo(args) -> int:
    from certeval.errors import InputError

    if isinstance(args.lm_items, bool) or args.lm_items < 1:
        raise InputError(f"--lm-items must be a positive integer, got {args.lm_items!r}")
    options = runtime_options(args)
    from certeval.runtime.startup import configure

    configure(options.startup_log)
    prepare_env()
    from ..flows.demo import demo_flow, demo_plans

    prepared = demo_plans(output=args.output, lm_items=args.lm_items, skip_lm=args.skip_lm,
                          ray_address=args.ray_address, seed=args.seed, options=options)
    plans = [plan for plan, _ in prepared]
    from certeval.runs.plan import claim_run

    from ._failure import set_run_folder

    start_watchdog(options)
    try:
        claimed = []
        for plan, inputs in prepared:
            plan.store().acquire_lock()
            claimed.append(inputs.claimed(claim_run(plan)))
            set_run_folder(plan.store())
        out = demo_flow(plans, claimed)
    finally:
        for plan in plans:
            plan.store().release_lock()
    if args.json:
        print_json(out)
    else:
        from ..flows.demo import describe_full_run

        for results in out:
            print(summary(results))
            print(describe_full_run(results))
            print()
    return 0
