"""certeval: adaptive, certified LLM evaluation.

The Python API (docs/api.md): a request per question — :class:`Certify`, :class:`Compare`, :class:`Rank`,
:class:`Select` — and three verbs over it: :func:`run` (live), :func:`backtest` (on recorded scores) and
:func:`preview` (the cost of a ranking or selection before any model is called).
"""

__version__ = "0.1.0"

from .api import BacktestAnswer, BacktestResult, CostPreview, RunResults, backtest, preview, run  # noqa: E402
from .requests import Certify, Compare, Rank, Request, Select  # noqa: E402

__all__ = ["BacktestAnswer", "BacktestResult", "Certify", "Compare", "CostPreview", "Rank", "Request", "RunResults",
           "Select", "__version__", "backtest", "preview", "run"]
