"""Pure statistics over numpy arrays (numpy, scipy, scikit-learn and the standard library only).

No I/O, no Prefect, no Ray, no global RNG: randomness is an explicit ``rng``.
"""

from ._validation import InputError
from .goals import Goal, parse_goal
from .protocol import REGISTRY, AdaptiveMethod, BankMethod, BankSpec, Proposal, register
from .results import Decision, Estimate, SubsetEstimate

__all__ = [
    "AdaptiveMethod", "BankMethod", "BankSpec", "Decision", "Estimate", "Goal", "InputError",
    "Proposal", "REGISTRY", "SubsetEstimate", "make_method", "method_names", "parse_goal", "register",
]

# Modules that register methods on import. Each is owned by one area of the code.
_METHOD_MODULES = ("single", "sequential", "faq")


def _load_methods() -> None:
    import importlib

    for mod in _METHOD_MODULES:
        try:
            importlib.import_module(f"{__name__}.{mod}")
        except ModuleNotFoundError as exc:  # module not written yet in this checkout
            if exc.name != f"{__name__}.{mod}":
                raise


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
    return cls(**params)


def method_from_state(state: dict):
    """Rebuild a method from its ``state()`` dict."""
    _load_methods()
    name = state.get("method")
    if name not in REGISTRY.methods:
        raise InputError(f"state names unknown method {name!r}")
    return REGISTRY.methods[name].from_state(state)
