"""The flags of ``certeval certify|compare|rank|select`` and ``certeval backtest COMMAND``, generated from the request.

Each request field (:mod:`certeval.requests`) that names flags becomes one argument: its spellings, help and
argparse settings come from the field's metadata and its default from the field, so no default is written here.
:func:`request_from_args` turns the parsed flags back into the same request object the Python API takes.
"""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from ..requests import REQUESTS, BacktestOptions, Request, field_default, field_help, reads


def request_fields(kind: str, *, live: bool = True) -> list[Any]:
    """The fields of ``kind``'s request that are flags of its command (``live=False``: of ``certeval backtest
    COMMAND``, which writes nothing and starts nothing, so takes none of a live run's ``live`` fields)."""
    cls = REQUESTS[kind]
    return [f for f in fields(cls) if f.metadata.get("flags") and reads(cls, f.name)
            and (live or not f.metadata.get("live"))]


def add_request_flags(parser: argparse.ArgumentParser, kind: str, *, live: bool = True,
                      types: dict[str, Any] | None = None, helps: dict[str, str] | None = None,
                      only: tuple[str, ...] | None = None) -> None:
    """One argument per request field of ``kind``; ``types``: a field's command-line parser where text needs more
    than the field's type (``--limit 0.5``); ``helps``: a field's help where the command reads it otherwise;
    ``only``: these fields alone (``certeval demo``'s few)."""
    for f in request_fields(kind, live=live):
        if only is not None and f.name not in only:
            continue
        settings = dict(f.metadata.get("cli", {}))
        if types and f.name in types:
            settings["type"] = types[f.name]
        default = field_default(f)
        parser.add_argument(*f.metadata["flags"], dest=f.name, default=list(default) if isinstance(default, tuple)
                            else default, help=(helps or {}).get(f.name) or field_help(f, kind), **settings)


def request_from_args(args: argparse.Namespace, kind: str, **given: Any) -> Request:
    """The request of ``kind`` from its parsed flags (those ``args`` holds), with ``given`` values over them."""
    values = {f.name: getattr(args, f.name) for f in request_fields(kind) if hasattr(args, f.name)}
    values.update(given)
    return REQUESTS[kind](**values)


def backtest_fields(kind: str) -> list[Any]:
    """The fields of :class:`~certeval.requests.BacktestOptions` that ``certeval backtest KIND`` reads."""
    return [f for f in fields(BacktestOptions) if BacktestOptions.reads(f.name, kind)]


def add_backtest_flags(parser: argparse.ArgumentParser, kind: str) -> None:
    """One argument per backtest option ``certeval backtest KIND`` reads, generated as the request's flags are."""
    for f in backtest_fields(kind):
        parser.add_argument(*f.metadata["flags"], dest=f.name, default=field_default(f),
                            help=field_help(f, kind), **f.metadata.get("cli", {}))


def backtest_options_from_args(args: argparse.Namespace, kind: str) -> BacktestOptions:
    """The backtest options of ``certeval backtest KIND`` from its parsed flags."""
    return BacktestOptions(**{f.name: getattr(args, f.name) for f in backtest_fields(kind)})
