"""``certeval report <run folder>``: report.md (+ --html) and PNG plots written into the run folder."""

from __future__ import annotations

from ._common import print_json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="write report.md and plots for a run folder (local or fsspec URL)")
    p.add_argument("run", help="run folder: a local path or an fsspec URL such as s3://bucket/runs/<id>")
    p.add_argument("--html", action="store_true", help="also write report.html")
    p.add_argument("--savings", default=None,
                   help="a benchmark JSON with per-cell savings (e.g. benchmarks/results/efficiency.json) "
                        "for the savings-vs-goal curve")
    p.add_argument("--json", action="store_true", help="machine-readable list of written files on stdout")
    p.set_defaults(func=run)


def run(args) -> int:
    from certeval.errors import InputError
    from certeval.reports.run_report import report_run  # lazy: matplotlib only when a report is asked for

    from ._failure import one_line

    try:
        rep = report_run(args.run, html=args.html, savings=args.savings, publish=True)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        # the run folder is the only input: a shape the report cannot read is damaged input, in one line
        raise InputError(f"run folder {args.run!r} is damaged or was written by another version "
                         f"({one_line(exc)})") from None
    if args.json:
        print_json({"run": rep.url, "files": rep.files})
    else:
        for name, url in rep.files.items():
            print(f"{name}: {url}")
    return 0
