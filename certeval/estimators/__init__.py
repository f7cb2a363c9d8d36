"""Pure statistics over numpy arrays (numpy, scipy, scikit-learn and the standard library only).

No I/O, no Prefect, no Ray, no global RNG: randomness is an explicit ``rng``.
"""

import inspect

from certeval.errors import InputError

from .goals import Goal, parse_goal
from .protocol import REGISTRY, AdaptiveMethod, BankMethod, BankSpec, Proposal, register
from .results import Decision, Estimate, SubsetEstimate

__all__ = [
    "AdaptiveMethod", "BankMethod", "BankSpec", "Decision", "Estimate", "Goal", "InputError",
    "Proposal", "REGISTRY", "SubsetEstimate", "make_method", "method_for_goal", "method_names", "parse_goal", "register",
]

# The modules that register methods when imported (imported on first use: they import this package).
_METHOD_MODULES = ("certeval.estimators.single", "certeval.estimators.distribution.sequential", "certeval.estimators.faq.querying")


def _load_methods() -> None:
    import importlib

    for module in _METHOD_MODULES:
        importlib.import_module(module)


def method_names() -> list[str]:
    _load_methods()
    return sorted(REGISTRY.methods)


def make_method(name: str, **params):
    """Build a registered method by name with its parameters (no logic runs until ``start``)."""
    _load_methods()
    try:
        cls = REGISTRY.methods[name]
    except KeyError:
        raise InputError(f"unknown method {name!r}; choose one of {', '.join(sorted(REGISTRY.methods))}") from None
    return cls.from_params(params)


def method_for_goal(name: str, goal, max_items: int | None = None, **params):
    """:func:`make_method` with bets tuned to where the run will stop, for the methods that take it (the exact
    betting CSs: ``uniform``, ``adaptive``, ``history``): the reachable horizon ``min(n_goal, max_items, N)``.

    A ``halfwidth:E`` goal gives ``bet_halfwidth=E`` and, with an item budget, ``bet_horizon=max_items`` as well:
    the bets then tune to whichever stops the run first (:func:`~.single.bounds.bet_sizes`), so a goal the budget
    cannot reach does not tune the bets for a run that never happens; any other goal with an item budget gives
    ``bet_horizon=max_items``. A budget at or past the bank's size N adds nothing (the width is 0 there). ``params``
    that set either win. Both are fixed before any score, so bets change the width at the stop, never the
    validity."""
    _load_methods()
    cls = REGISTRY.methods.get(name)
    takes = set() if cls is None else set(inspect.signature(cls.__init__).parameters)
    if "bet_halfwidth" in takes and not {"bet_halfwidth", "bet_horizon"} & set(params):
        if getattr(goal, "kind", None) == "halfwidth":
            params = {**params, "bet_halfwidth": float(goal.value)}
        if max_items is not None:
            params = {**params, "bet_horizon": int(max_items)}
    return make_method(name, **params)


def method_from_state(state: dict):
    """Rebuild a method from its ``state()`` dict."""
    _load_methods()
    name = state.get("method")
    if name not in REGISTRY.methods:
        raise InputError(f"state names unknown method {name!r}")
    return REGISTRY.methods[name].from_state(state)
