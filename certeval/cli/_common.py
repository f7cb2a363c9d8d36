"""Small helpers shared by subcommands: JSON output and common options."""

from __future__ import annotations

import sys
from typing import Any


def print_json(obj: Any) -> None:
    from ..storage import dumps  # the one JSON encoder (numpy values, NaN -> null)

    sys.stdout.write(dumps(obj).decode() + "\n")


def add_common(parser, *, seed: bool = True, confidence: bool = True) -> None:
    if confidence:
        parser.add_argument("--confidence", type=float, default=0.95, help="confidence level in (0, 1), default 0.95")
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="root seed (stored with every result)")
    add_output_flags(parser)


def add_output_flags(parser) -> None:
    """--json, --quiet: how a command prints, never what it computes."""
    parser.add_argument("--json", action="store_true", help="machine-readable result on stdout")
    parser.add_argument("--quiet", "-q", action="store_true",
                        help="no progress on stderr (default: live bars on a terminal, else one line per round)")
