"""``certeval import lm-eval|inspect PATH… -o scores.parquet [--items items.parquet]``: other harnesses' results
as certeval's recorded scores (``model, item_id, score, subset``) and item bank (``item_id, subset, question,
answer``), for ``--model replay:…``, ``backtest --scores`` and ``--history``.

An lm-eval PATH may be lm-eval's ``--output_path`` folder: its runs are named after their results files' config
(see ``certeval.harnesses.lm_eval_runs``); ``--name`` names the one run given."""

from __future__ import annotations

from certeval.errors import InputError

from ._common import print_json

HARNESSES = ("lm-eval", "inspect")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("import", help="convert lm-eval samples files or Inspect logs to certeval's scores",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("harness", choices=HARNESSES, help="lm-eval (its --output_path folder, or "
                   "samples_<task>_<timestamp>.jsonl files) or inspect (.eval / .json logs)")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="files to read (one model per file), or lm-eval's --output_path folders (repeatable)")
    p.add_argument("-o", "--output", required=True, help="scores file to write (.parquet, .csv or .jsonl)")
    p.add_argument("--items", default=None, help="also write the items (text and target) to this file")
    p.add_argument("--metric", default=None, help="lm-eval metric / Inspect scorer to read (default: the first)")
    p.add_argument("--name", default=None, help="model name for the one run (lm-eval) or log (inspect) given; "
                                                "default: lm-eval's results file config, Inspect's model")
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

    from ..storage import bounded, filesystem, is_local, nearest_existing, stage_file

    staged: list[tuple[str, str]] = []
    put: list[tuple[object, str]] = []
    made: list[tuple[str, str]] = []  # (folder created for a target, the folder that existed above it)
    try:
        for path, data in files:
            fs, target = filesystem(str(path))
            if is_local(fs):
                folder = os.path.dirname(target)
                above = nearest_existing(folder)
                if above != folder:
                    made.append((folder, above))
                staged.append((stage_file(target, data), target))
            else:
                bounded(fs, "pipe_file", target, data, size=len(data))
                put.append((fs, target))
    except BaseException:
        for tmp, _ in staged:
            os.remove(tmp)
        for folder, above in made:  # folders made for the outputs: gone again, so nothing is left half-written
            while folder != above and os.path.isdir(folder):
                try:
                    os.rmdir(folder)
                except OSError:
                    break
                folder = os.path.dirname(folder)
        for fs, target in put:
            try:
                bounded(fs, "rm_file", target)
            except Exception:  # the first failure is the one to report
                pass
        raise
    for tmp, target in staged:
        os.replace(tmp, target)


def _lm_eval(args) -> tuple[list[str], list, list[dict]]:
    """(files read, score frames, where each model name came from) of lm-eval folders and samples files."""
    from certeval.harnesses.lm_eval_runs import collect_runs
    from certeval.harnesses.readers import read_lm_eval_samples

    runs = collect_runs(args.paths, args.name)
    samples = [p for r in runs for p in r.samples]
    check_outputs(samples + [r.results for r in runs if r.results], _outputs(args))
    # everything is read and checked before anything is written
    frames = [read_lm_eval_samples(p, args.metric).assign(model=r.name) for r in runs for p in r.samples]
    return samples, frames, [r.describe() for r in runs]


def _inspect(args) -> tuple[list[str], list, list[dict]]:
    from certeval.harnesses.readers import is_inspect_log, read_inspect_log

    paths = [str(p) for p in args.paths]
    check_outputs(paths, _outputs(args))
    for path in paths:
        if not is_inspect_log(path):
            raise InputError(f"{path!r} is not an Inspect log (.eval, or .json written by Inspect)")
    if args.name is not None and len(paths) > 1:
        raise InputError(f"--name {args.name!r} names one model, but {len(paths)} Inspect logs are given; "
                         "import one log at a time")
    frames = [read_inspect_log(p, args.metric) for p in paths]
    if args.name is not None:
        frames = [f.assign(model=args.name) for f in frames]
    sources = [{"model": str(f["model"].iloc[0]), "named_from": "--name" if args.name else "Inspect log eval.model",
                "log": p} for p, f in zip(paths, frames)]
    return paths, frames, sources


def _outputs(args) -> dict[str, str]:
    return {"-o/--output": args.output, **({"--items": args.items} if args.items else {})}


def _print_summary(summary: dict) -> None:
    print(f"wrote {summary['rows']} scores ({len(summary['models'])} model(s): {', '.join(summary['models'])}; "
          f"{summary['items_count']} items) to {summary['scores']}"
          + (f"; items to {summary['items']}" if summary["items"] else ""))
    for source in summary["sources"]:
        where = source.get("results") or source.get("log") or ", ".join(source.get("samples", []))
        print(f"  {source['model']!r} <- {source['named_from']}: {where}")


def run(args) -> int:
    import pandas as pd

    from certeval.harnesses.readers import read_harness_items
    from certeval.inputs.banks import validate_scores

    files, frames, sources = (_lm_eval if args.harness == "lm-eval" else _inspect)(args)
    scores = validate_scores(pd.concat(frames, ignore_index=True), f"{args.harness} results")
    items = read_harness_items(files) if args.items else None
    write_all([(args.output, _encode(scores, args.output))]
              + ([(args.items, _encode(items, args.items))] if items is not None else []))
    summary = {"scores": args.output, "items": args.items, "rows": int(len(scores)),
               "models": sorted(scores["model"].unique()), "tasks": sorted(scores["subset"].unique()),
               "items_count": int(scores["item_id"].nunique()), "sources": sources}
    if args.json:
        print_json(summary)
    else:
        _print_summary(summary)
    return 0
