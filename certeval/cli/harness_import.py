"""``certeval import lm-eval|inspect PATH… -o scores.parquet [--items items.parquet]``: other harnesses' results
as certeval's recorded scores (``model, item_id, score, subset``) and item bank (``item_id, subset, question,
answer``), for ``--model replay:…``, ``backtest --scores`` and ``--history``."""

from __future__ import annotations

from ..estimators._validation import InputError
from ._common import print_json

HARNESSES = ("lm-eval", "inspect")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("import", help="convert lm-eval samples files or Inspect logs to certeval's scores",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("harness", choices=HARNESSES, help="lm-eval (samples_<task>_<timestamp>.jsonl) or inspect "
                                                      "(.eval / .json logs)")
    p.add_argument("paths", nargs="+", metavar="PATH", help="files to read (one model per file; repeatable)")
    p.add_argument("-o", "--output", required=True, help="scores file to write (.parquet, .csv or .jsonl)")
    p.add_argument("--items", default=None, help="also write the items (text and target) to this file")
    p.add_argument("--metric", default=None, help="lm-eval metric / Inspect scorer to read (default: the first)")
    p.add_argument("--json", action="store_true", help="machine-readable summary on stdout")
    p.set_defaults(func=run, command="import")


def _check_target(path: str, option: str) -> None:
    if not str(path).lower().endswith((".parquet", ".csv", ".jsonl")):
        raise InputError(f"{option} {path!r} must end in .parquet, .csv or .jsonl")


def _same_file(a: str, b: str) -> bool:
    """Whether two local paths or URLs name one file (links and relative paths resolved where local)."""
    import os

    from ..storage import filesystem, is_local

    (fs_a, pa), (fs_b, pb) = filesystem(str(a)), filesystem(str(b))
    if type(fs_a) is not type(fs_b):
        return False
    if is_local(fs_a):
        if os.path.exists(pa) and os.path.exists(pb):
            return os.path.samefile(pa, pb)
        return os.path.realpath(pa) == os.path.realpath(pb)
    return pa == pb


def _check_local_parent(path: str, option: str) -> None:
    """A local output's folder must be a folder (or creatable below one), not a file."""
    import os

    from ..storage import filesystem, is_local, nearest_existing

    fs, target = filesystem(str(path))
    if not is_local(fs):
        return
    if os.path.isdir(target):
        raise InputError(f"{option} {path!r} is a folder; name a file")
    parent = nearest_existing(os.path.dirname(target))
    if not os.path.isdir(parent):
        raise InputError(f"{option} {path!r} lies under {parent!r}, which is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"{option} {path!r} is not writable (the folder {parent!r} does not allow it)")


def check_outputs(inputs: list[str], outputs: dict[str, str]) -> None:
    """Validation step: no output names an input, and the outputs name different files."""
    named = list(outputs.items())
    for option, out in named:
        _check_target(out, option)
        _check_local_parent(out, option)
        for src in inputs:
            if _same_file(out, src):
                raise InputError(f"{option} {out!r} is one of the files being read; write the output elsewhere")
    for i, (opt_a, out_a) in enumerate(named):
        for opt_b, out_b in named[i + 1:]:
            if _same_file(out_a, out_b):
                raise InputError(f"{opt_a} and {opt_b} name the same file ({out_a!r}); give each its own")


def _encode(frame, path: str) -> bytes:
    import io

    from ..storage import parquet_bytes

    name = str(path).lower()
    if name.endswith(".parquet"):
        return parquet_bytes(frame)
    buf = io.StringIO()
    if name.endswith(".csv"):
        frame.to_csv(buf, index=False)
    else:
        frame.to_json(buf, orient="records", lines=True)
    return buf.getvalue().encode()


def write_all(files: list[tuple[str, bytes]]) -> None:
    """Write every ``(path, data)`` or none: each goes to a temporary beside its target first (removed if any
    write fails); only when all are complete are they moved into place. On object stores (one PUT each) an
    object already put is deleted when a later one fails."""
    import os

    from ..storage import bounded, filesystem, is_local, stage_file

    staged: list[tuple[str, str]] = []
    put: list[tuple[object, str]] = []
    try:
        for path, data in files:
            fs, target = filesystem(str(path))
            if is_local(fs):
                staged.append((stage_file(target, data), target))
            else:
                bounded(fs, "pipe_file", target, data, size=len(data))
                put.append((fs, target))
    except BaseException:
        for tmp, _ in staged:
            os.remove(tmp)
        for fs, target in put:
            try:
                bounded(fs, "rm_file", target)
            except Exception:  # the first failure is the one to report
                pass
        raise
    for tmp, target in staged:
        os.replace(tmp, target)


def run(args) -> int:
    from ..banks import validate_scores
    from ..readers import (is_inspect_log, is_lm_eval_samples, read_harness_items, read_inspect_log,
                           read_lm_eval_samples)

    outputs = {"-o/--output": args.output, **({"--items": args.items} if args.items else {})}
    check_outputs(list(args.paths), outputs)
    is_kind, read = ((is_lm_eval_samples, read_lm_eval_samples) if args.harness == "lm-eval"
                     else (is_inspect_log, read_inspect_log))
    for path in args.paths:
        if not is_kind(path):
            want = ("an lm-eval samples file (samples_<task>_<timestamp>.jsonl)" if args.harness == "lm-eval"
                    else "an Inspect log (.eval, or .json written by Inspect)")
            raise InputError(f"{path!r} is not {want}")
    import pandas as pd

    # everything is read and checked before anything is written
    frames = [read(str(p), args.metric) for p in args.paths]
    scores = validate_scores(pd.concat(frames, ignore_index=True), f"{args.harness} results")
    items = read_harness_items(args.paths) if args.items else None
    write_all([(args.output, _encode(scores, args.output))]
              + ([(args.items, _encode(items, args.items))] if items is not None else []))
    summary = {"scores": args.output, "items": args.items, "rows": int(len(scores)),
               "models": sorted(scores["model"].unique()), "tasks": sorted(scores["subset"].unique()),
               "items_count": int(scores["item_id"].nunique())}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {summary['rows']} scores ({len(summary['models'])} model(s): {', '.join(summary['models'])}; "
              f"{summary['items_count']} items) to {args.output}" + (f"; items to {args.items}" if args.items else ""))
    return 0
