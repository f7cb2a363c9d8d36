"""The validation step of each lm-eval-style surface of the pipeline commands (issue 48): ``--tasks`` /
``--include_path`` / ``--num_fewshot``, ``--limit``, ``--model_args``, ``select --checkpoints`` and the cost preview
``--dry-run --history``. Each check runs before Ray or Prefect start and refuses bad input in one line that names
the flag and echoes the value (exit 2, nothing written)."""

from __future__ import annotations

import argparse
import os
from urllib.parse import quote

from certeval.errors import InputError
from certeval.harnesses.lm_eval_requests import parse_bool
from certeval.inputs.model_folders import TRUST_FLAG
from certeval.inputs.model_spec import quote_location

from ._common import print_json

AUTO_HISTORY = "auto"  # select --history auto: earlier select runs under --output as history
LIST_WORDS = {"list": {}, "list_groups": {"list_subtasks": False, "list_tags": False},
              "list_subtasks": {"list_groups": False, "list_tags": False},
              "list_tags": {"list_groups": False, "list_subtasks": False}}  # --tasks list… (lm-eval ls …)

LM_EVAL_MODELS = ("hf", "vllm")  # lm-eval's --model names that certeval hosts under the same kind
RESERVED = "&#?"  # a model spec's own syntax: options, the name, the query
TRUSTING_KINDS = ("hf", "vllm")  # backends that load a folder's code when trust_remote_code is on


# lm-eval 0.4.13's run flags certeval cannot give their lm-eval meaning, each refused in one line saying why
REFUSED_LM_EVAL_FLAGS = {
    "--use_cache": "certeval's score cache is always on (in the output folder's _cache/); drop --use_cache",
    "--cache_requests": "certeval builds a task's requests afresh in every run, before anything starts; drop it",
    "--max_batch_size": "certeval's hf hosts pack rows themselves (--batch_size N caps the rows a forward pass)",
    "--samples": "certeval chooses which docs to score (its method); --limit N or a fraction sets the budget",
    "--predict_only": "certeval certifies the task's metrics; an output-only run has nothing to certify",
    "--check_integrity": "certeval does not run lm-eval's task test suites; run lm-eval validate --tasks ...",
    "--write_out": "the run's requests are in its samples file (--log_samples)",
    "--show_config": "the tasks' configs are in results.json's lm_eval block (configs)",
    "--config": "certeval takes its settings as flags only",
    "--metadata": "task metadata from the command line is not passed to lm-eval's task loader",
    "--confirm_run_unsafe_code": "certeval does not run tasks that execute generated code",
    "--wandb_args": "certeval logs to Prefect and its run folder, not Weights & Biases",
    "--wandb_config_args": "certeval logs to Prefect and its run folder, not Weights & Biases",
    "--trackio_args": "certeval logs to Prefect and its run folder, not Trackio",
    "--hf_hub_log_args": "certeval writes results to --output (a folder or fsspec URL), not the Hugging Face Hub",
    "--verbosity": "certeval's progress is --quiet or one line per round; lm-eval's log level is LMEVAL_LOG_LEVEL",
}


def add_lm_eval_flags(p) -> None:
    """lm-eval's run flags: ``--include_path``, ``--num_fewshot``, ``--trust-remote-code``, the request flags
    (certeval.harnesses.lm_eval_requests), ``--batch_size`` and ``--device``; those certeval cannot honour are accepted by
    the parser only to be refused in one line saying why (:data:`REFUSED_LM_EVAL_FLAGS`)."""
    p.add_argument("--include_path", "--include-path", dest="include_path", default=None, metavar="DIR",
                   help="a folder of your lm-eval task YAMLs, for --tasks NAME (as lm_eval --include_path)")
    p.add_argument("--num_fewshot", "--num-fewshot", dest="num_fewshot", type=_count("--num_fewshot"), default=None,
                   metavar="N", help="few-shot examples per item of every --tasks task (as lm_eval --num_fewshot; "
                                     "default: each task's own num_fewshot)")
    p.add_argument(TRUST_FLAG, "--trust_remote_code", dest="trust_remote_code", action="store_true",
                   help="let hf/vllm models whose folder asks for its own code (config.json auto_map) run it; "
                        "refused otherwise")
    p.add_argument("--apply_chat_template", "--apply-chat-template", dest="apply_chat_template", nargs="?",
                   const=True, default=None, metavar="NAME",
                   help="render every --tasks request with the model's chat template, as lm_eval "
                        "--apply_chat_template (NAME: one of a tokenizer's named templates)")
    p.add_argument("--system_instruction", "--system-instruction", dest="system_instruction", default=None,
                   metavar="TEXT", help="a system instruction before every --tasks request (as lm_eval)")
    p.add_argument("--fewshot_as_multiturn", "--fewshot-as-multiturn", dest="fewshot_as_multiturn", nargs="?",
                   const=True, default=None, type=parse_bool, metavar="BOOL",
                   help="few-shot examples as chat turns (default with --apply_chat_template; 'false' to disable)")
    p.add_argument("--gen_kwargs", "--gen-kwargs", dest="gen_kwargs", nargs="+", default=None, metavar="K=V",
                   help="generation settings over each generate_until task's own (as lm_eval --gen_kwargs; greedy: "
                        "until, max_gen_toks)")
    p.add_argument("--batch_size", dest="lm_eval_batch_size", default=None, metavar="N|auto|auto:N",
                   help="lm-eval's batch size: rows per forward pass of hf models (auto: the host's own packing); "
                        "not --batch-size, certeval's items per round")
    p.add_argument("--device", default=None, metavar="cpu|cuda|cuda:N",
                   help="where hf models run (as lm_eval --device); cuda asks each model actor for a GPU")
    for flag in REFUSED_LM_EVAL_FLAGS:
        p.add_argument(flag, dest=f"refused_{flag[2:]}", nargs="*", default=None, help=argparse.SUPPRESS)


def _count(flag: str):
    from argparse import ArgumentTypeError

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ArgumentTypeError(f"{flag} must be a whole number >= 0, got {text!r}") from None
        if value < 0:
            raise ArgumentTypeError(f"{flag} must be a whole number >= 0, got {text!r}")
        return value

    parse.__name__ = "count"
    return parse


def check_surfaces(args) -> None:
    """The checks that need no file: lm-eval flags certeval refuses, --limit, --num_fewshot without --tasks,
    --include_path without --tasks."""
    for flag, reason in REFUSED_LM_EVAL_FLAGS.items():
        given = getattr(args, f"refused_{flag[2:]}", None)
        if given is not None:
            value = f" {' '.join(given)!r}" if given else ""
            raise InputError(f"{flag}{value} is lm-eval's flag, refused: {reason}")
    limit = args.max_items
    if isinstance(limit, float) and 0.0 < limit < 1.0:
        if args.bank is None:
            raise InputError(f"--limit {limit!r} is a fraction of each lm-eval task's docs (as in lm-eval): it needs "
                             "--tasks; or give a whole number of items")
    elif limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"--max-items/--limit must be a positive integer (or, with --tasks, a fraction below 1), "
                         f"got {limit!r}")
    if getattr(args, "num_fewshot", None) is not None and args.bank is None:
        raise InputError(f"--num_fewshot {args.num_fewshot!r} sets the few-shot count of lm-eval tasks: it needs "
                         "--tasks (a task YAML or task names)")
    if getattr(args, "include_path", None) is not None and args.bank is None:
        raise InputError(f"--include_path {args.include_path!r} needs --tasks NAME (the lm-eval tasks it holds)")


def parse_model_args(model_args: str | None) -> list[tuple[str, str]]:
    """lm-eval's ``--model_args k=v,k2=v2`` as ordered pairs; InputError for a part that does not parse, a key
    given twice, or a value holding what a model spec reserves (& # ?: it would add options or a name)."""
    pairs: list[tuple[str, str]] = []
    for part in (p.strip() for p in (model_args or "").split(",")):
        if not part:
            continue
        key, eq, value = part.partition("=")
        key = key.strip()
        if not eq or not key:
            raise InputError(f"--model_args must look like key=value,key=value; got {part!r} in {model_args!r}")
        if any(k == key for k, _ in pairs):
            raise InputError(f"--model_args gives {key!r} twice in {model_args!r}; give each key once")
        bad = next((c for c in RESERVED if c in key + value), None)
        if bad is not None:
            raise InputError(f"--model_args {part!r} holds {bad!r}, which a model spec reserves (in {model_args!r}); "
                             f"write it percent-encoded ({quote(bad)})")
        pairs.append((key, value.strip()))
    return pairs


def with_model_args(specs: list[str], model_args: str | None, *, trust_remote_code: bool = False) -> list[str]:
    """lm-eval's ``--model_args k=v,k2=v2`` as spec options (``?k=v&k2=v2``) of every model; lm-eval's own form
    ``--model hf --model_args pretrained=DIR,...`` becomes ``hf:DIR?...``. A key a spec already sets is refused.
    ``--trust-remote-code`` adds ``trust_remote_code=true`` to every hf / vllm model."""
    from certeval.inputs.model_spec import parse_model_spec

    parts = parse_model_args(model_args)
    out = []
    for spec in specs:
        extra = list(parts)
        if spec in LM_EVAL_MODELS:
            pretrained = [v for k, v in parts if k == "pretrained"]
            if not pretrained or not pretrained[0]:
                raise InputError(f"--model {spec} is lm-eval's form: it needs --model_args pretrained=DIR (or write "
                                 f"--model {spec}:DIR); got --model_args {model_args!r}")
            extra = [(k, v) for k, v in parts if k != "pretrained"]
            spec = f"{spec}:{pretrained[0]}"
        try:
            given = {k for k, _ in parse_model_spec(spec).options}
        except InputError:  # refused by the plan's own check of the whole spec, options and all
            given = set()
        twice = [k for k, _ in extra if k in given]
        if twice:
            raise InputError(f"--model_args {model_args!r} sets {twice[0]!r}, which --model {spec!r} sets too; give "
                             "it once")
        if trust_remote_code and spec.split(":", 1)[0].lower() in TRUSTING_KINDS and "trust_remote_code" not in \
                given | {k for k, _ in extra}:
            extra.append(("trust_remote_code", "true"))
        out.append(spec + (("&" if "?" in spec else "?") + "&".join(f"{k}={v}" for k, v in extra) if extra else ""))
        _check_backend_options(out[-1], [k for k, _ in extra], model_args)
    return out


def _check_backend_options(spec_text: str, keys: list[str], model_args: str | None) -> None:
    """The options --model_args gave an hf / vllm model, read by its backend now: a key it does not know (or a
    value it refuses) is named with --model_args, before anything starts."""
    from certeval.inputs.model_spec import parse_model_spec

    try:
        spec = parse_model_spec(spec_text)
    except InputError:
        return  # the plan's own check of the whole spec says why, in one line
    if not keys or spec.kind not in TRUSTING_KINDS:
        return
    if spec.kind == "hf":
        from certeval.hosting.hf import parse_options
    else:
        from certeval.hosting.vllm_host import parse_options
    try:
        parse_options(spec)
    except InputError as exc:
        if any(repr(k) in str(exc) or f"{k}=" in str(exc) for k in keys):
            raise InputError(f"--model_args {model_args!r}: {exc}") from None


def _natural(path: str) -> list:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def checkpoint_specs(patterns: list[str] | None) -> list[str]:
    """``select --checkpoints``: every folder the patterns name (globs expanded, in natural order: ckpt-20 before
    ckpt-100) as an ``hf:`` spec, its path escaped (:func:`~certeval.inputs.model_spec.quote_location`). Refused: a
    pattern that names nothing, a file, or a folder without a readable config.json holding a JSON object
    (certeval.inputs.model_folders)."""
    import glob

    from certeval.inputs.model_folders import read_model_config

    specs: list[str] = []
    for pattern in patterns or []:
        found = sorted(glob.glob(os.path.expanduser(pattern)), key=_natural)
        if not found:
            raise InputError(f"--checkpoints {pattern!r} names no folder")
        for path in found:
            if not os.path.isdir(path):
                raise InputError(f"--checkpoints {pattern!r}: {path!r} is a file, not a checkpoint folder")
            read_model_config(path, "--checkpoints", pattern)  # no config.json, not a JSON object: one line here
            spec = f"hf:{quote_location(os.path.abspath(path))}"  # any folder name: '#', '?', '%' escaped
            if spec not in specs:
                specs.append(spec)
    return specs


def dry_run(args, options, plan_from_args) -> int:
    """``rank|select --dry-run``: validated like the run (without its history), then previewed on the history
    (:func:`certeval.reports.preview.preview_plan`, what :func:`certeval.api.preview` plays)."""
    from certeval.reports.preview import check_sources, describe, preview_plan

    sources = list(args.history or [])
    if AUTO_HISTORY in sources:
        raise InputError(f"{args.command} --dry-run previews on recorded models named by --history SOURCE; "
                         f"--history {AUTO_HISTORY} names none")
    check_sources(args.command, sources)
    args.history = None  # the preview plays the statement on the history models; it does not learn from them
    plan, prepared = plan_from_args(args, options)
    preview = preview_plan(plan, prepared, sources)
    if args.json:
        print_json({"preview": preview.to_dict(), "history": sources})
    else:
        print(describe(preview))
    return 0


def with_device_and_batch(args, models: list[str]) -> list[str]:
    """lm-eval's ``--device`` and ``--batch_size`` as hf spec options (``device=``, ``batch=``: rows per forward
    pass); ``--device cuda[:N]`` also gives each model actor a GPU (``--num-gpus 1`` unless set) and is refused when
    this machine has no such GPU and no ``--ray-address`` names a cluster. ``--batch_size auto`` (lm-eval's search
    for the largest batch that fits) leaves an hf host's own batching as it is; vllm schedules its own batches."""
    from certeval.inputs.model_spec import parse_model_spec

    device, batch = getattr(args, "device", None), getattr(args, "lm_eval_batch_size", None)
    extra: list[tuple[str, str]] = []
    if batch is not None:
        text = str(batch).strip().lower()
        rows = text if text.isdigit() and int(text) >= 1 else None
        if rows is None and not (text == "auto" or (text.startswith("auto:") and text[5:].isdigit()
                                                    and int(text[5:]) >= 1)):
            raise InputError(f"--batch_size must be a whole number >= 1, auto or auto:N (as in lm-eval), got {batch!r}")
        if rows is not None:
            extra.append(("batch", rows))
    if device is not None:
        if not (device == "cpu" or device == "cuda" or (device.startswith("cuda:") and device[5:].isdigit())):
            raise InputError(f"--device {device!r}: certeval's hf hosts run on cpu, cuda or cuda:N")
        extra.append(("device", device))
    kinds = [parse_model_spec(m).kind for m in models]
    if device is not None and not any(k in TRUSTING_KINDS for k in kinds):
        raise InputError(f"--device {device!r} places hf and vllm models; the run has none ({', '.join(kinds)})")
    if device is not None and device != "cpu":
        _check_cuda(args, device, "--device")
    elif device is None and any(_cuda(m) for m in models):
        spec_text = next(m for m in models if _cuda(m))
        _check_cuda(args, str(parse_model_spec(spec_text).option("device")), f"--model {spec_text!r}: device")
    if device is not None and "vllm" in kinds and device == "cpu":
        raise InputError(f"--device {device!r}: vllm models run on GPUs")
    out = []
    for spec_text, kind in zip(models, kinds):
        mine = extra if kind == "hf" else []
        given = {k for k, _ in parse_model_spec(spec_text).options}
        twice = [k for k, _ in mine if k in given]
        if twice:
            flag = "--device" if twice[0] == "device" else "--batch_size"
            raise InputError(f"{flag} sets {twice[0]!r}, which --model {spec_text!r} sets too; give it once")
        out.append(spec_text + (("&" if "?" in spec_text else "?") + "&".join(f"{k}={v}" for k, v in mine)
                                if mine else ""))
    return out


def _cuda(spec_text: str) -> bool:
    from certeval.inputs.model_spec import parse_model_spec

    spec = parse_model_spec(spec_text)
    return spec.kind == "hf" and str(spec.option("device", "cpu")).startswith("cuda")


def _check_cuda(args, device: str, flag: str) -> None:
    """A CUDA device this machine has (nvidia-smi, bounded), unless the models run on a cluster named by
    --ray-address; the model actors then ask Ray for a GPU each."""
    from certeval.runs.plan import local_gpu_count

    if not (args.ray_address or os.environ.get("RAY_ADDRESS")):
        found = local_gpu_count()
        index = int(device[5:]) if device[5:].isdigit() else 0
        if index >= found:
            raise InputError(f"{flag} {device!r}: this machine has {found} CUDA GPU(s) (nvidia-smi); run on cpu, "
                             "or pass --ray-address of a cluster with GPUs")
    if not args.num_gpus:
        args.num_gpus = 1.0


def list_tasks(what: str, include_path: str | None) -> str:
    """``--tasks list`` (``list_groups``, ``list_subtasks``, ``list_tags``): lm-eval's own table of the tasks it
    knows (what ``lm-eval ls tasks`` prints), its built-in tasks and those under ``--include_path``."""
    from certeval.harnesses.lm_eval_tasks import _manager, check_include_path

    folder = None if include_path is None else str(check_include_path(include_path))
    manager = _manager(folder, what, with_defaults=True)
    return manager.list_all_tasks(**LIST_WORDS[what])
