"""The ``certeval`` command line: a thin shell over estimators and flows (DESIGN §6).

Each subcommand lives in its own module under ``certeval.cli`` exposing
``add_parser(subparsers)`` (which sets ``func``) and a ``run(args) -> int``.
Exit codes: 0 done, 1 goal not reachable within the bank or budget (still
reported), 2 bad input (one-line message on stderr, nothing written).
"""

from __future__ import annotations

import argparse
import importlib
import sys

from ..estimators._validation import InputError

EXIT_OK, EXIT_NOT_REACHED, EXIT_BAD_INPUT = 0, 1, 2

# subcommand -> module under certeval.cli
COMMANDS = {
    "plan": "plan",
    "bounds": "bounds",
    "backtest": "backtest",
    "certify": "pipeline",
    "compare": "pipeline",
    "rank": "pipeline",
    "select": "pipeline",
    "demo": "pipeline",
    "report": "report",
    "import": "harness_import",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's own convention too)
        self.exit(EXIT_BAD_INPUT, f"certeval: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="certeval", description="Adaptive, certified LLM evaluation.")
    from .. import __version__

    parser.add_argument("--version", action="version", version=f"certeval {__version__}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    sub.required = True
    seen = set()
    for command, module in COMMANDS.items():
        if module in seen:
            continue
        try:
            mod = importlib.import_module(f"{__name__}.{module}")
        except ModuleNotFoundError as exc:
            if exc.name == f"{__name__}.{module}":
                continue  # not built in this checkout
            raise
        seen.add(module)
        mod.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"certeval: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("certeval: interrupted", file=sys.stderr)
        return 130


def entry() -> None:
    sys.exit(main())
