"""The ``certeval`` command line: a thin shell over estimators and flows (docs/architecture.md §6).

Each subcommand lives in its own module under ``certeval.cli`` exposing
``add_parser(subparsers)`` (which sets ``func``) and a ``run(args) -> int``.
Exit codes: 0 done, 1 goal not reachable within the bank or budget (still
reported), 2 bad input (one-line message on stderr, nothing written), 3 runtime
failure (storage, cluster, model: one line on stderr, the traceback in the run
folder's ``logs/``), 130 / 143 interrupted by SIGINT / SIGTERM (the folder stays
resumable: the round in flight is simply run again).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import signal
import sys
import threading

from certeval.errors import InputError
from certeval.runtime.redact import redact

from ..messages import one_line
from .ranges import bound_whole_numbers

EXIT_OK, EXIT_NOT_REACHED, EXIT_BAD_INPUT, EXIT_RUNTIME = 0, 1, 2, 3
EXIT_SIGINT, EXIT_SIGTERM = 130, 143

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
    "rescore": "rescore",
    "import": "harness_import",
    "up": "services",
    "down": "services",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2 (argparse's own convention too)
        self.exit(EXIT_BAD_INPUT, f"certeval: error: {one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="certeval", description="Adaptive, certified LLM evaluation.")
    from importlib.metadata import version  # the installed distribution's (the package root imports the API)

    parser.add_argument("--version", action="version", version=f"certeval {version('certeval')}")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser, metavar="COMMAND")
    sub.required = True
    seen = set()
    for module in COMMANDS.values():
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
    _add_everywhere(parser)
    bound_whole_numbers(parser)
    return parser


def _add_everywhere(parser: argparse.ArgumentParser) -> None:
    """Flags every command takes, wherever they stand on the line (a subcommand's own parser included)."""
    parser.add_argument("--max-file-size", default=argparse.SUPPRESS, metavar="SIZE", type=_size,
                        help="refuse any file certeval reads above SIZE bytes (K, M, G suffixes; default: 2G for "
                             "tables, 256M for JSON records), checked before reading")
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in dict.fromkeys(action.choices.values()):
                _add_everywhere(child)


def _size(text: str) -> int:
    """``--max-file-size``: bytes, or a number with a K, M or G suffix (powers of 1024)."""
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    body = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = body[-1:] if body[-1:] in units and body[-1:] else ""
    try:
        value = float(body[: len(body) - len(unit)])
    except ValueError:
        raise argparse.ArgumentTypeError(f"--max-file-size takes a size such as 512M or 4G, got {text!r}") from None
    if not 1 <= value * units[unit] <= 1 << 50:
        raise argparse.ArgumentTypeError(f"--max-file-size must lie in [1 byte, 1P], got {text!r}")
    return int(value * units[unit])


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C so every ``finally`` (actors, Ray, Prefect) runs."""


_SIGTERMS: list[Terminated] = []  # raised by this process's handler (a signal handler has no other channel)


def _on_sigterm(signum, frame) -> None:
    _SIGTERMS.append(Terminated())
    raise _SIGTERMS[-1]


def _redeliver_swallowed(unraisable, default=sys.unraisablehook) -> None:
    """An interrupt raised where Python cannot raise (a weakref callback, e.g. importlib's module-lock cleanup while
    Prefect is imported in a thread) is printed as "Exception ignored" and lost, and the command ran on past its
    SIGTERM. Deliver the same signal again a moment later, from a thread: the handler raises it anew in the main
    thread, outside the callback."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        signum = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
        timer = threading.Timer(0.05, os.kill, (os.getpid(), signum))
        timer.daemon = True
        timer.start()
        return
    default(unraisable)


def _interrupt_in(exc: BaseException) -> KeyboardInterrupt | None:
    """The SIGINT/SIGTERM behind ``exc``. Raised inside a C extension (Ray's ``get`` building its results), the
    interrupt surfaces as another error (SystemError), and a task engine may re-raise that without its context:
    so a SIGTERM this command received counts whatever error it turned into."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return exc
        if _prefect_termination(exc):
            return Terminated()
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return _SIGTERMS[-1] if _SIGTERMS else None


def _prefect_termination(exc: BaseException) -> bool:
    """Inside a flow run Prefect's own SIGTERM handler raises its TerminationSignal (a BaseException) instead."""
    return type(exc).__name__ == "TerminationSignal" and type(exc).__module__.startswith("prefect")


def _ray_termination(exc: BaseException) -> bool:
    """While ``ray.init`` starts a node, Ray's own SIGTERM handler is installed (certeval restores its own after):
    it raises ``SystemExit(15)``, which ended the command with status 15 and no word."""
    return isinstance(exc, SystemExit) and exc.code == signal.SIGTERM


def _interrupted(exc: KeyboardInterrupt) -> int:
    terminated = isinstance(exc, Terminated)
    print(f"certeval: {'terminated (SIGTERM)' if terminated else 'interrupted'}; the run folder is resumable: "
          "rerun the same command (same --run-id) to go on from its last round", file=sys.stderr)
    return EXIT_SIGTERM if terminated else EXIT_SIGINT


def main(argv: list[str] | None = None) -> int:
    from . import _failure

    parser = build_parser()
    args = parser.parse_args(argv)
    previous = _install_sigterm()
    previous_hook = sys.unraisablehook
    sys.unraisablehook = functools.partial(_redeliver_swallowed, default=previous_hook)
    _SIGTERMS.clear()
    _failure.clear_run_folder()
    _max_file_size(getattr(args, "max_file_size", None))
    try:
        return int(args.func(args) or 0)
    except InputError as exc:
        print(f"certeval: error: {one_line(redact(str(exc)))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except Exception as exc:  # storage, cluster, model: one line here, the traceback in the run folder
        interrupt = _interrupt_in(exc)
        if interrupt is not None:
            return _interrupted(interrupt)
        where = _failure.record(exc)
        step = _failure.next_step(exc)  # what to try, before the run folder is forgotten
        print(one_line(f"certeval: runtime failure: {_failure.one_line(exc)}" + (f"; {step}" if step else "")
                       + (f" (traceback: {where})" if where else ""), word=1000, total=4000), file=sys.stderr)
        return EXIT_RUNTIME
    except BaseException as exc:
        if _prefect_termination(exc) or _ray_termination(exc):
            return _interrupted(Terminated())
        raise
    finally:
        _failure.clear_run_folder()
        _max_file_size(None)
        sys.unraisablehook = previous_hook
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _max_file_size(limit: int | None) -> None:
    if limit is not None or "certeval.storage.io" in sys.modules:  # storage (pandas, pyarrow) only when used
        from ..storage.io import set_max_file_bytes

        set_max_file_bytes(limit)


def _install_sigterm():
    """SIGTERM → :class:`Terminated` in the main thread (the only thread allowed to set handlers)."""
    try:
        return signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread (e.g. called from a worker thread in tests)
        return None


def entry() -> None:
    sys.exit(main())
