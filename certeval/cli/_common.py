"""Small helpers shared by subcommands: JSON output and common options."""

from __future__ import annotations

import json
import math
import sys
from typing import Any


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):
        try:
            return _clean(value.item())
        except (TypeError, ValueError):
            return value
    return value


def print_json(obj: Any) -> None:
    json.dump(_clean(obj), sys.stdout, indent=2)
    sys.stdout.write("\n")


def add_common(parser, *, seed: bool = True, confidence: bool = True) -> None:
    if confidence:
        parser.add_argument("--confidence", type=float, default=0.95, help="confidence level in (0, 1), default 0.95")
    if seed:
        parser.add_argument("--seed", type=int, default=0, help="root seed (stored with every result)")
    parser.add_argument("--json", action="store_true", help="machine-readable result on stdout")
