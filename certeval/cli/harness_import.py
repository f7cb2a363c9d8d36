"""``certeval import lm-eval|inspect PATH… -o scores.parquet [--items items.parquet]``: other harnesses' results
as certeval's recorded scores (``model, item_id, score, subset``) and item bank (``item_id, subset, question,
answer``), for ``--model replay:…``, ``backtest --scores`` and ``--history``."""

from __future__ import annotations

from pathlib import PurePosixPath

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


def _write(frame, path: str) -> None:
    import io

    from ..storage import Folder, filesystem

    fs, local = filesystem(str(path))
    parent = str(PurePosixPath(local).parent)
    folder = Folder(fs, parent)
    name = PurePosixPath(local).name
    if name.lower().endswith(".parquet"):
        folder.write_parquet(name, frame)
        return
    buf = io.StringIO()
    if name.lower().endswith(".csv"):
        frame.to_csv(buf, index=False)
    else:
        frame.to_json(buf, orient="records", lines=True)
    folder.write_bytes(name, buf.getvalue().encode())


def run(args) -> int:
    from ..banks import validate_scores
    from ..readers import (is_inspect_log, is_lm_eval_samples, read_harness_items, read_inspect_log,
                           read_lm_eval_samples)

    _check_target(args.output, "-o/--output")
    if args.items:
        _check_target(args.items, "--items")
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
    _write(scores, args.output)
    if items is not None:
        _write(items, args.items)
    summary = {"scores": args.output, "items": args.items, "rows": int(len(scores)),
               "models": sorted(scores["model"].unique()), "tasks": sorted(scores["subset"].unique()),
               "items_count": int(scores["item_id"].nunique())}
    if args.json:
        print_json(summary)
    else:
        print(f"wrote {summary['rows']} scores ({len(summary['models'])} model(s): {', '.join(summary['models'])}; "
              f"{summary['items_count']} items) to {args.output}" + (f"; items to {args.items}" if args.items else ""))
    return 0
