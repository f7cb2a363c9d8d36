"""certeval: adaptive, certified LLM evaluation.

The Python API (docs/api.md): a request per question — :class:`Certify`, :class:`Compare`, :class:`Rank`,
:class:`Select` — and three verbs over it: :func:`run` (live), :func:`backtest` (on recorded scores) and
:func:`preview` (the cost of a ranking or selection before any model is called).
"""

__version__ = "0.1.0"

from .api import (  # noqa: E402
    BacktestAnswer,
    BacktestResult,
    CertifyRep,
    ComparePair,
    CostPreview,
    RankRep,
    RunResults,
    SelectRep,
    backtest,
    preview,
    run,
)
from .requests import BacktestOptions, Certify, Compare, Rank, Request, Select  # noqa: E402

__all__ = ["BacktestAnswer", "BacktestOptions", "BacktestResult", "Certify", "CertifyRep", "Compare", "ComparePair",
           "CostPreview", "Rank", "RankRep", "Request", "RunResults", "Select", "SelectRep", "__version__", "backtest",
           "preview", "run"]
