"""Certified single-model evaluation: ``static``, ``seq``, ``cer-eval``, ``uniform`` and ``adaptive``.

Importing this package registers every method (``certeval.estimators.make_method``).
"""

from . import adaptive, bounds, cereval, partition, seq, static, strata, uniform  # noqa: F401
from .adaptive import AdaptiveMethod
from .bounds import BettingCS, cereval_radius, hoeffding_radius, seq_radius
from .cereval import CerEvalMethod
from .seq import SeqMethod
from .static import StaticMethod
from .uniform import UniformMethod

__all__ = [
    "AdaptiveMethod", "BettingCS", "CerEvalMethod", "SeqMethod", "StaticMethod", "UniformMethod",
    "cereval_radius", "hoeffding_radius", "seq_radius",
]
