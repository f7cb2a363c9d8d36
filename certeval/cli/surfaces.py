"""The validation step of each lm-eval-style surface of the pipeline commands (issue 48): ``--tasks`` /
``--include_path`` / ``--num_fewshot``, ``--limit``, ``--model_args``, ``select --checkpoints`` and the cost preview
``--dry-run --history``. Each check runs before Ray or Prefect start and refuses bad input in one line that names
the flag and echoes the value (exit 2, nothing written)."""

from __future__ import annotations

import os
from urllib.parse import quote

from ..backends.base import quote_location
from ..estimators._validation import InputError
from ..model_folders import TRUST_FLAG
from ._common import print_json

AUTO_HISTORY = "auto"  # select --history auto: earlier select runs under --output as history

LM_EVAL_MODELS = ("hf", "vllm")  # lm-eval's --model names that certeval hosts under the same kind
RESERVED = "&#?"  # a model spec's own syntax: options, the name, the query
TRUSTING_KINDS = ("hf", "vllm")  # backends that load a folder's code when trust_remote_code is on


def add_lm_eval_flags(p) -> None:
    """``--include_path``, ``--num_fewshot`` and ``--trust-remote-code`` (lm-eval's names)."""
    p.add_argument("--include_path", "--include-path", dest="include_path", default=None, metavar="DIR",
                   help="a folder of your lm-eval task YAMLs, for --tasks NAME (as lm_eval --include_path)")
    p.add_argument("--num_fewshot", "--num-fewshot", dest="num_fewshot", type=_count("--num_fewshot"), default=None,
                   metavar="N", help="few-shot examples per item of every --tasks task (as lm_eval --num_fewshot; "
                                     "default: each task's own num_fewshot)")
    p.add_argument(TRUST_FLAG, "--trust_remote_code", dest="trust_remote_code", action="store_true",
                   help="let hf/vllm models whose folder asks for its own code (config.json auto_map) run it; "
                        "refused otherwise")


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
    """The checks that need no file: --limit, --num_fewshot without --tasks, --include_path without --tasks."""
    limit = getattr(args, "max_items", None)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"--max-items/--limit must be a positive integer, got {limit!r}")
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
    from ..backends.base import parse_model_spec

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
    return out


def _natural(path: str) -> list:
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", path)]


def checkpoint_specs(patterns: list[str] | None) -> list[str]:
    """``select --checkpoints``: every folder the patterns name (globs expanded, in natural order: ckpt-20 before
    ckpt-100) as an ``hf:`` spec, its path escaped (:func:`~certeval.backends.base.quote_location`). Refused: a
    pattern that names nothing, a file, or a folder without a readable config.json holding a JSON object
    (certeval.model_folders)."""
    import glob

    from ..model_folders import read_model_config

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
    """``rank|select --dry-run``: validated like the run (without its history), then previewed on the history; a
    history that is missing, empty or shares no complete model with the bank is refused naming --history."""
    from ..history import load_history
    from ..preview import describe, history_matrix, preview_cost

    sources = list(args.history or [])
    if AUTO_HISTORY in sources:
        raise InputError(f"{args.command} --dry-run previews on recorded models named by --history SOURCE; "
                         f"--history {AUTO_HISTORY} names none")
    if not sources:
        raise InputError(f"{args.command} --dry-run predicts the cells from recorded models: give --history SOURCE "
                         "(a scores file, bundled:<name>, run folders)")
    args.history = None  # the preview plays the statement on the history models; it does not learn from them
    plan, prepared = plan_from_args(args, options)
    history = load_history(sources)
    named = ", ".join(repr(s) for s in sources)
    bank_ids = set(prepared.bank.item_ids)
    shared = history.frame["item_id"].isin(bank_ids)
    if not shared.any():
        raise InputError(f"--history {named} shares no item with the bank ({len(bank_ids)} items, e.g. "
                         f"{next(iter(prepared.bank.item_ids))!r}): nothing to preview on")
    matrix, _ = history_matrix(history.frame, prepared.bank.item_ids, set(plan.labels) | _model_names(plan))
    try:
        preview = preview_cost(plan.group_request(), prepared.bank.spec(mean_of_means=plan.mean_of_means), matrix,
                               len(plan.labels), seed=plan.seed)
    except InputError as exc:
        raise InputError(f"--history {named}: {exc}") from None
    if args.json:
        print_json({"preview": preview.to_dict(), "history": sources})
    else:
        print(describe(preview))
    return 0


def _model_names(plan) -> set[str]:
    """The recorded names of the plan's replay models (a model never stands in for itself)."""
    from ..backends.base import parse_model_spec

    return {spec.name for spec in map(parse_model_spec, plan.models) if spec.kind == "replay" and spec.name}
