"""certeval: adaptive, certified LLM evaluation.

The Python API (docs/api.md): a request per question — :class:`Certify`, :class:`Compare`, :class:`Rank`,
:class:`Select` — and three verbs over it: :func:`run` (live), :func:`backtest` (on recorded scores) and
:func:`preview` (the cost of a ranking or selection before any model is called).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

# Bound on first use (PEP 562): every process that imports a submodule imports this package first, and the API
# pulls in the record's types, the estimators and scipy (0.8 s of CPU). A model actor, the watchdog and each
# command's start-up import submodules only; `from certeval import run` and `certeval.Rank` work as before.
_API = {**dict.fromkeys(("BacktestAnswer", "BacktestResult", "CertifyRep", "ComparePair", "CostPreview", "RankRep",
                         "RunResults", "SelectRep", "backtest", "preview", "run"), "api"),
        **dict.fromkeys(("BacktestOptions", "Certify", "Compare", "Rank", "Request", "Select"), "requests")}

__all__ = ["BacktestAnswer", "BacktestOptions", "BacktestResult", "Certify", "CertifyRep", "Compare", "ComparePair",
           "CostPreview", "Rank", "RankRep", "Request", "RunResults", "Select", "SelectRep", "__version__", "backtest",
           "preview", "run"]


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # bound now: the next lookup does not come back here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
