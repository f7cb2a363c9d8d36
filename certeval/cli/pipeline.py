"""``certeval certify | compare | rank | select | demo``: the pipeline over Prefect flows and Ray actors.

Everything the command line can get wrong is checked first (model specs, bank,
scorer, goal, numbers, the output location, a resumed run's stored config), so
bad input exits 2 in about a second, before Ray or Prefect start and before
anything is written.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from ._common import add_common, print_json
from ._runtime import ALL, add_runtime_options, runtime_options
from .surfaces import (  # noqa: F401
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
        _add_run_options(p)
        p.set_defaults(func=run, command=name)
    _add_demo(subparsers)


def add_command_flags(p, name: str, *, live: bool = True) -> None:
    """The flags that say what ``certeval NAME`` asks (models, bank, goal, statement and its numbers).
    ``live=False``: those ``certeval backtest NAME`` plays on recorded scores (--model optional: the scores' models;
    no --checkpoints, --model_args, lm-eval flags or --dry-run)."""
    p.add_argument("--model", action="append", default=None, metavar="SPEC",
                   help="model spec (repeatable): replay:<scores>#<model>, hf:<dir|bundled:smollm2>, "
                        "vllm:<dir>, openai:<base_url>#<model>" if live else
                   "a recorded model of --scores, NAME or replay:<scores>#<model> (repeatable; default: every model, "
                   "compare: the first two by name)")
    if name == "select" and live:
        p.add_argument("--checkpoints", action="append", default=None, metavar="PATH_OR_GLOB",
                       help="checkpoint folders (repeatable; a glob such as 'runs/ckpt-*' in quotes): each a "
                            "transformers model, hf:<folder>, named by its folder; with or instead of --model. "
                            "--history auto: earlier select runs on this bank under --output that scored any of "
                            "these models are the history")
    if live:
        p.add_argument("--model_args", "--model-args", dest="model_args", default=None, metavar="K=V,...",
                       help="options added to every --model spec (lm-eval style: key=value,key=value)")
    p.add_argument("--bank", "--tasks", dest="bank", default=None,
                   help="item bank (Parquet/JSONL/CSV, an lm-eval samples file or Inspect log, any fsspec URL, "
                        "bundled:<name>, bundled:trivia); optional with replay models only. --tasks: lm-eval's "
                        "name for it, which also takes an lm-eval task or group: a YAML file, or NAME[,NAME...] "
                        "from lm-eval's index (or --include_path)")
    if live:
        add_lm_eval_flags(p)
    p.add_argument("--aggregate", choices=("subset-mean", "mean"), default=None,
                   help="a bank with sub-datasets (a 'subset' column): subset-mean (default) makes each "
                        "sub-dataset count once (the mean of their means), mean each item once (the plain "
                        "accuracy); named in every output")
    if name == "certify":
        p.add_argument("--goal", default=None,
                       help="halfwidth:E, above:T or below:T (required); add +diminishing:G to also stop a model whose "
                            "half-width shrinks by less than G a look (goal then not reached)")
        p.add_argument("--method", default=None,
                       help="history (default with --history), adaptive (default otherwise), uniform, seq, "
                            "cer-eval, static")
        p.add_argument("--history", action="append", default=None, metavar="SOURCE",
                       help="other models' recorded scores on the bank's items (scores file, bundled:<name>, "
                            "a run folder or a folder of runs; repeatable): the run learns from them and its "
                            "interval stays exact")
    else:
        p.add_argument("--method", default=None, help=argparse.SUPPRESS)
    if name in ("compare", "rank", "select"):
        p.add_argument("--history", action="append", default=None, metavar="SOURCE",
                       help="other models' recorded scores (repeatable), bank target: compare/rank get an exact, "
                            "anytime-valid interval for each difference with the predicted paired difference as "
                            "control variate; select gets each model's exact interval with its predicted score "
                            "as control variate; select --history auto: earlier select runs on this bank "
                            "under --output")
    if name != "certify":
        p.add_argument("--target", choices=("bank", "distribution"), default=None,
                       help="bank (default): the bank's own means and differences, exact once every item is "
                            "scored (without-replacement confidence sequences); distribution: items as a "
                            "sample of a population (group-sequential tests)")
    if name in ("compare", "rank"):
        p.add_argument("--margin", type=float, default=0.0,
                       help="margin D (default 0): a>b needs the difference above D, equivalent inside (-D, D)")
    if name == "rank":
        p.add_argument("--goal", default=None,
                       help="halfwidth:E: leaderboard precision — every model's bank mean within ±E "
                            "simultaneously (bank target), ordered where the intervals do not overlap; with "
                            "--history each model's interval learns from the recorded models")
        p.add_argument("--epsilon", type=float, default=None,
                       help="epsilon-correct ranking (bank target): instead of strict verdicts, list the models so "
                            "that every model above another has a bank mean at least the other's minus E, "
                            "jointly with probability >= confidence; models within E of each other need not be "
                            "separated, so dense leaderboards stop early (docs/ranking.md)")
    if name == "select":
        p.add_argument("--threshold", type=float, default=None,
                       help="discard models whose score is surely below T (required with --target distribution "
                            "and --mode best; --mode precision: default 0, none discarded)")
        p.add_argument("--halfwidth", type=float, default=None,
                       help="bank target: epsilon of the best-model identification (default 0); distribution "
                            "target (required): stop when intervals are this precise")
        p.add_argument("--top", type=int, default=None,
                       help="bank target: identify the K best models (default 1)")
        p.add_argument("--mode", choices=("best", "precision"), default="best",
                       help="best: keep the best model(s) (default); precision: every model to --halfwidth "
                            "(the distribution target, implied)")
    if name in ("rank", "select") and live:
        p.add_argument("--dry-run", action="store_true",
                       help="cost preview: call no model and write nothing; play the request on the --history "
                            "models (recorded scores, never your own models) and print the predicted fraction "
                            "of the model x item cells it will score, with its range")


def _add_demo(subparsers) -> None:
    demo = subparsers.add_parser("demo", help="the main job: rank recorded models and certify a real small LM",
                                 description="Rank recorded models (bundled:helm_mmlu) and certify SmolLM2-135M on "
                                             "the red-trivia bank, through Prefect and Ray.")
    demo.add_argument("--output", default=None, help="run folder root (default ./certeval-runs)")
    demo.add_argument("--lm-items", type=int, default=60, help="item budget of the small-LM certification (default 60)")
    demo.add_argument("--skip-lm", action="store_true", help="only the ranking of recorded models")
    demo.add_argument("--ray-address", default=None, help="connect to a running Ray cluster instead of starting one")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--json", action="store_true")
    add_runtime_options(demo, only=tuple(n for n in ALL if n != "parallel_start"))  # demo_flow has no prestart
    demo.set_defaults(func=run_demo, command="demo")


def add_plan_numbers(p) -> None:
    """--confidence, --seed, --json, --quiet, --batch-size, --max-items: a run's numbers (backtests' too)."""
    add_common(p)
    p.add_argument("--batch-size", type=int, default=50, help="items per round and model (default 50)")
    p.add_argument("--max-items", "--limit", dest="max_items", type=_limit, default=None,
                   help="item budget per model (--limit: lm-eval's name for it; with --tasks a fraction below 1 is "
                        "that fraction of each task's docs, as in lm-eval)")


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


def _add_run_options(p) -> None:
    add_plan_numbers(p)
    p.add_argument("--scorer", default=None, help="mc-loglik, mc-loglik-norm, exact, normalized, numeric or pkg.mod:func")
    p.add_argument("--output", "--output_path", "--output-path", dest="output", default=None,
                   help="root of run folders: a folder or any fsspec URL (s3://...); default ./certeval-runs")
    p.add_argument("--log_samples", "--log-samples", dest="log_samples", action="store_true",
                   help="also write samples/<model>/samples_<task>_<time>.jsonl (lm-eval's format) in the run folder")
    p.add_argument("--run-id", default=None, help="name of the run folder; the same id resumes a stopped run")
    p.add_argument("--ray-address", default=None,
                   help="connect to a running Ray cluster (default: $RAY_ADDRESS if set, else start a local one)")
    p.add_argument("--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: this machine's)")
    p.add_argument("--replicas", type=int, default=1, help="actors per model (default 1)")
    p.add_argument("--num-gpus", type=float, default=0.0, help="GPUs per actor (vLLM / CUDA hosts)")
    p.add_argument("--in-flight", type=int, default=2, help="batches queued per actor (default 2)")
    add_runtime_options(p)


def prepare_env() -> None:
    """Offline, loopback-only defaults and a project-local PREFECT_HOME, before Prefect is imported."""
    from ..envsetup import configure_offline_env

    if not user_prefect_configured():
        # zero-config default: Prefect's embedded server with its state in ./.prefect
        os.environ.setdefault("PREFECT_HOME", str(Path.cwd() / ".prefect"))
    # a failed task would print its traceback through Prefect's console handler; the command prints one line
    # and keeps the traceback in the run folder (exit 3). Prefect's API / UI still receive every run log.
    os.environ.setdefault("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "CRITICAL")
    configure_offline_env()


def use_services(args) -> None:
    """A run with no Ray address and no Prefect settings of its own reuses what ``certeval up`` started from this
    working folder, when both still answer (certeval.services); otherwise it starts its own, as always."""
    if args.ray_address or os.environ.get("RAY_ADDRESS") or user_prefect_configured():
        return
    from ..services import read_services, register_user

    services = read_services()
    if services is not None and services.alive():
        services.apply()
        register_user(services)  # certeval down leaves them running while this run uses them
        args.ray_address = services.ray_address


def start_watchdog(options) -> None:
    """Ray and Prefect processes this command starts end with it, even after a SIGKILL (certeval.watchdog),
    unless ``--no-watchdog``."""
    if not options.watchdog:
        return
    from ..watchdog import watch_parent

    watch_parent()


def user_prefect_configured() -> bool:
    """Whether the user set Prefect up: an API URL or profile in the environment, or a profiles file in
    their Prefect home (``$PREFECT_HOME``, default ``~/.prefect``). Then their server and profile are used
    as they are; certeval only picks a project-local home (embedded server) when nothing is configured."""
    if any(os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_PROFILE", "PREFECT_HOME",
                                       "PREFECT_PROFILES_PATH")):
        return True
    return (Path.home() / ".prefect" / "profiles.toml").is_file()


def history_sources(args, models: list[str]) -> tuple[list[str] | None, str | None]:
    """``--history`` as given, with ``auto`` (select only) replaced by the earlier select runs it names, and the line
    that announces them (printed once the plan has read them: a refused one is the command's only line). Without
    ``--history`` there is no history: the same command twice gives the same answer."""
    from ..estimators._validation import InputError

    sources = list(getattr(args, "history", None) or [])
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

    from ..estimators._validation import InputError
    from ..lm_eval_requests import fraction_budget, request_options
    from ..lm_eval_tasks import is_lm_eval_task, tasks_bank
    from ..tasks.plan import make_plan

    check_surfaces(args)  # --limit, --num_fewshot / --include_path without --tasks
    models = list(args.model or []) + checkpoint_specs(getattr(args, "checkpoints", None))
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
    plan, prepared = make_plan(plan_request(args, models, sources, options))
    if fraction is not None:
        args.max_items = fraction
        plan = replace(plan, max_items=fraction_budget(prepared.bank.frame, fraction))
    if note:
        print(note, file=sys.stderr)
    return plan, prepared


def plan_request(args, models: list[str], history: list[str] | None, options=None) -> Any:
    """The parsed flags of ``certeval COMMAND`` (or ``certeval backtest COMMAND``: no run options) as the
    :class:`~certeval.tasks.plan.PlanRequest` :func:`~certeval.tasks.plan.make_plan` validates."""
    from ..tasks.plan import PlanRequest

    return PlanRequest(
        args.command, models=models, bank=args.bank,
        output=getattr(args, "output", None), run_id=getattr(args, "run_id", None),
        goal=getattr(args, "goal", None), method=args.method, confidence=args.confidence,
        batch_size=args.batch_size, max_items=args.max_items, seed=args.seed, scorer=getattr(args, "scorer", None),
        margin=getattr(args, "margin", 0.0), threshold=getattr(args, "threshold", None),
        halfwidth=getattr(args, "halfwidth", None), mode=getattr(args, "mode", "best"),
        ray_address=getattr(args, "ray_address", None), replicas=getattr(args, "replicas", 1),
        num_gpus=getattr(args, "num_gpus", 0.0), in_flight=getattr(args, "in_flight", 2),
        history=history, num_cpus=getattr(args, "num_cpus", None), target=getattr(args, "target", None),
        top=getattr(args, "top", None), epsilon=getattr(args, "epsilon", None),
        aggregate=getattr(args, "aggregate", None), options=options,
    )


def dry_run(args, options=None) -> int:
    """``rank|select --dry-run``: validated like the run (without its history), then previewed on the history."""
    from .surfaces import dry_run as preview

    return preview(args, options, plan_from_args)


def run(args) -> int:
    from .surfaces import LIST_WORDS, list_tasks

    if args.bank in LIST_WORDS:  # --tasks list: lm-eval's table of the tasks it knows; nothing started
        print(list_tasks(args.bank, getattr(args, "include_path", None)))
        return 0
    from ..startup import configure, mark

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
    from ..fast_start import prestart
    from ..progress import BARS, progress_mode, say
    from ..tasks.plan import claim_run
    from ._failure import set_run_folder

    if not options.parallel_start:  # --sequential-start (benchmarks/startup.py's "before")
        import certeval.flows.pipeline  # noqa: F401
    start_watchdog(options)
    store = plan.store()
    store.acquire_lock()  # a run id in use stops here; held until this command ends (the flow reuses it)
    warm = None
    try:
        # a changed config of an existing run id stops here; nothing overwritten
        prepared = prepared.claimed(claim_run(plan))
        set_run_folder(store)  # a runtime failure from here on leaves its traceback in <run>/logs/
        mode = progress_mode(args.json, args.quiet)
        if mode == BARS:  # a terminal's first seconds can be silent otherwise (Prefect's server, Ray, models)
            say(f"certeval: {plan.kind} run {plan.run_id}: starting Prefect's server, Ray and the model hosts...")
        # Prefect's server, Ray and the actors start side by side (certeval.fast_start), then the flow adopts them
        warm = prestart(plan, user_prefect)
        from ..flows.pipeline import run_plan

        warm.ready()
        mark("flow_calling")
        results = run_plan(plan, progress=mode, prepared=prepared)
        if getattr(args, "log_samples", False):
            results["samples_files"] = log_samples(plan, prepared.bank, results)
        import time

        from ..report import write_report
        from ..tasks.results import record_report_phase

        # docs/architecture.md §5: report.md (+ PNG) beside results.json in the run folder
        began = time.perf_counter()
        results["report"] = write_report(results["run_folder"]).files.get("report.md")
        record_report_phase(store, results, time.perf_counter() - began)
    finally:
        if warm is not None:
            warm.close()
        store.release_lock()
    if args.json:
        print_json(results)
    else:
        print(summary(results))
    return 0 if results.get("reached") else 1


def log_samples(plan, bank, results: dict[str, Any]) -> list[str]:
    """``--log_samples``: every scored item of the run, in lm-eval's samples format (certeval.harness_output)."""
    import time

    from ..harness_output import write_samples

    store = plan.store()
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S.000000", time.gmtime())
    return write_samples(store.folder, typed(results), store.read_rounds(), bank.frame, stamp)


def typed(results: dict[str, Any]) -> Any:
    """The run's results as the typed record (:class:`certeval.results_record.RunResults`), less what the CLI adds
    to its ``--json`` output (``report``, ``samples_files``)."""
    from dataclasses import fields

    from ..results_record import RunResults

    return RunResults.from_json({f.name: results[f.name] for f in fields(RunResults) if f.name in results})


def summary(results: dict[str, Any]) -> str:
    """A short human summary of a run's results (results.json, plus the CLI's ``report`` path), read through the
    typed record."""
    from ..report import model_verdicts, spell_verdict

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
    from ..estimators._validation import InputError

    if isinstance(args.lm_items, bool) or args.lm_items < 1:
        raise InputError(f"--lm-items must be a positive integer, got {args.lm_items!r}")
    options = runtime_options(args)
    from ..startup import configure

    configure(options.startup_log)
    prepare_env()
    from ..flows.demo import demo_flow, demo_plans

    prepared = demo_plans(output=args.output, lm_items=args.lm_items, skip_lm=args.skip_lm,
                          ray_address=args.ray_address, seed=args.seed, options=options)
    plans = [plan for plan, _ in prepared]
    from ..tasks.plan import claim_run
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
