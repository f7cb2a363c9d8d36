"""Certified single-model evaluation: ``static``, ``seq``, ``cer-eval``, ``uniform``, ``adaptive`` and ``history``.

Importing this package registers every method (``certeval.estimators.make_method``).
"""

from . import adaptive, betting_strata, bounds, cereval, history, partition, seq, static, strata, uniform  # noqa: F401
from .adaptive import AdaptiveMethod
from .bounds import BettingCS, cereval_radius, hoeffding_radius, seq_radius
from .cereval import CerEvalMethod
from .history import HistoryMethod
from .seq import SeqMethod
from .static import StaticMethod
from .uniform import UniformMethod

__all__ = [
    "AdaptiveMethod", "BettingCS", "CerEvalMethod", "HistoryMethod", "SeqMethod", "StaticMethod", "UniformMethod",
    "cereval_radius", "hoeffding_radius", "seq_radius",
]
