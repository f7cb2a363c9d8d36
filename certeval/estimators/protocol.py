"""The one round protocol every adaptive method speaks (docs/architecture.md §3).

Life cycle (scikit-learn's contract: ``__init__`` only stores parameters, learned
state ends in ``_``)::

    method = SomeMethod(confidence=0.95, target="bank")
    method.start(bank)                       # bank: BankSpec (size, subsets, features)
    while not done:
        prop = method.propose(k, rng)        # Proposal: item positions (+ probabilities)
        method.update(prop.items, scores)    # any order, any batch size
        est = method.result()                # frozen Estimate
    blob = method.state()                    # JSON-able dict (never pickle)
    again = type(method).from_state(blob)

Items are integer *positions* ``0..n_items-1`` in the bank; the pipeline maps them
to ``item_id`` strings.  Proposals may be requested again before the previous
batch has been absorbed (several batches in flight): methods that sample without
replacement keep proposed-but-unscored items in ``pending_`` and never propose them
twice.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import numpy as np

from certeval.errors import InputError

from .results import Estimate, to_jsonable
from .validation import (
    check_choice,
    check_confidence,
    check_item_indices,
    check_positive_int,
    check_same_length,
    check_scores,
)

TARGETS = ("bank", "distribution")


@dataclass(frozen=True)
class BankSpec:
    """What a method may know about the bank before any score arrives.

    ``subsets`` holds an integer code per item (``subset_names[code]`` is its
    name) or is None for a bank without sub-datasets. ``features`` is an
    ``(n_items, d)`` array of item embeddings (or None).  ``weights`` is the
    estimand's weight per item: ``1/N`` for the plain bank mean, or
    ``1/(S * N_s)`` for the mean-of-means over ``S`` subsets (Arviv et al. 2026, eq. 1).
    """

    n_items: int
    subsets: np.ndarray | None = None
    subset_names: tuple[str, ...] = ()
    features: np.ndarray | None = None
    mean_of_means: bool = True
    history: Any = None  # a HistoryPrior over these items (other models' recorded scores), or None

    def __post_init__(self) -> None:
        n = self.n_items
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise InputError(f"the bank must hold at least one item, got n_items={n!r}")
        if self.subsets is not None:
            codes = np.asarray(self.subsets)
            if codes.shape != (n,):
                raise InputError(f"subsets must have one code per item ({n}), got shape {codes.shape}")
            if len(self.subset_names) and codes.max(initial=0) >= len(self.subset_names):
                raise InputError("subset codes exceed the number of subset names")
        if self.features is not None:
            feats = np.asarray(self.features)
            if feats.ndim != 2 or feats.shape[0] != n:
                raise InputError(f"features must have shape ({n}, d), got {feats.shape}")
            if not np.all(np.isfinite(feats)):
                raise InputError("features (item embeddings) must be finite")
        if self.history is not None and getattr(self.history, "n_items", None) != n:
            raise InputError(f"history must describe the bank's {n} items, got {getattr(self.history, 'n_items', None)}")

    @property
    def n_subsets(self) -> int:
        if self.subsets is None:
            return 1
        return int(np.asarray(self.subsets).max()) + 1

    def subset_codes(self) -> np.ndarray:
        if self.subsets is None:
            return np.zeros(self.n_items, dtype=np.int64)
        return np.asarray(self.subsets, dtype=np.int64)

    def weights(self) -> np.ndarray:
        """Per-item weights of the estimand; they sum to one."""
        codes = self.subset_codes()
        if self.subsets is None or not self.mean_of_means:
            return np.full(self.n_items, 1.0 / self.n_items)
        sizes = np.bincount(codes)
        present = int(np.count_nonzero(sizes))
        return 1.0 / (present * sizes[codes])

    def names(self) -> tuple[str, ...]:
        if self.subset_names:
            return tuple(self.subset_names)
        return tuple(f"subset_{i}" for i in range(self.n_subsets))

    def to_state(self) -> dict[str, Any]:
        return {
            "n_items": int(self.n_items),
            "subsets": None if self.subsets is None else np.asarray(self.subsets).astype(int).tolist(),
            "subset_names": list(self.subset_names),
            "features": None if self.features is None else np.asarray(self.features, dtype=float).tolist(),
            "mean_of_means": bool(self.mean_of_means),
            "history": None if self.history is None else self.history.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BankSpec:
        return cls(
            n_items=int(state["n_items"]),
            subsets=None if state.get("subsets") is None else np.asarray(state["subsets"], dtype=np.int64),
            subset_names=tuple(state.get("subset_names") or ()),
            features=None if state.get("features") is None else np.asarray(state["features"], dtype=float),
            mean_of_means=bool(state.get("mean_of_means", True)),
            history=None if state.get("history") is None else _history_from_state(state["history"]),
        )


def _history_from_state(state: dict[str, Any]):
    from .history.prior import HistoryPrior

    return HistoryPrior.from_state(state)


@dataclass(frozen=True)
class Proposal:
    """Items a method wants scored next, with the probability each was drawn with.

    ``probs[i]`` is the selection probability used by importance-weighted
    estimators (FAQ/PAI); methods that sample uniformly without replacement
    report ``1 / (number of unscored items)`` at the time of the draw.
    """

    items: np.ndarray
    probs: np.ndarray | None = None

    def __len__(self) -> int:
        return int(len(self.items))


@runtime_checkable
class AdaptiveMethod(Protocol):
    name: ClassVar[str]

    def start(self, bank: BankSpec) -> AdaptiveMethod: ...

    def propose(self, k: int, rng: np.random.Generator) -> Proposal: ...

    def update(self, items: np.ndarray, scores: np.ndarray) -> None: ...

    def result(self) -> Estimate: ...

    def state(self) -> dict: ...

    @classmethod
    def from_state(cls, state: dict) -> AdaptiveMethod: ...


def _jsonable(value: Any) -> Any:
    """A method state's plain-Python copy (non-finite floats kept; the storage layer encodes them)."""
    return to_jsonable(value, strict=False)


class BankMethod:
    """Bookkeeping shared by methods over a finite bank.

    Subclasses set ``name`` and implement ``_choose(k, rng)`` (positions among
    the unscored, unpending items) and ``result()``. Scores are kept per item;
    an item scored twice keeps its first score (without-replacement methods
    never ask twice; a pipeline retry must not double-count).

    Parameters common to all methods: ``confidence`` (fixed before data
    arrive) and ``target`` (``"bank"`` or ``"distribution"``). A method may take
    some parameters as one typed options object (:attr:`option_groups`); its
    fields stay flat parameters everywhere else (``make_method``, ``get_params``,
    a stored state), so a parameter has one name whether it is grouped or not.
    """

    name: ClassVar[str] = "base"
    # draws with replacement (may propose an item again): a run's draws may then exceed the bank size
    with_replacement: ClassVar[bool] = False
    anytime_valid: ClassVar[bool] = True
    validity: ClassVar[str] = "exact"  # the Estimate.validity of its results: exact, asymptotic or heuristic
    # constructor parameters that are a frozen dataclass of options: {parameter: its dataclass}
    option_groups: ClassVar[dict[str, type]] = {}

    def __init__(self, confidence: float = 0.95, target: str = "bank") -> None:
        self.confidence = confidence
        self.target = target

    # -- parameters ------------------------------------------------------
    @classmethod
    def from_params(cls, params: dict[str, Any]) -> BankMethod:
        """The method with flat ``params`` (as :meth:`get_params` gives them): each options group's fields are
        gathered into its object; an unknown name is refused as the constructor refuses it."""
        params = dict(params)
        for name, options in cls.option_groups.items():
            given = [f.name for f in dataclasses.fields(options) if f.name in params]
            if given and name not in params:
                params[name] = options(**{f: params.pop(f) for f in given})
        return cls(**params)

    def get_params(self) -> dict[str, Any]:
        """The constructor's parameters, flat (an options group's fields in its place)."""
        import inspect

        out: dict[str, Any] = {}
        for p in inspect.signature(type(self).__init__).parameters:
            if p in self.option_groups:
                group = getattr(self, p)
                out.update({f.name: getattr(group, f.name) for f in dataclasses.fields(group)})
            elif p != "self":
                out[p] = getattr(self, p)
        return out

    def _validate_params(self) -> None:
        check_confidence(self.confidence)
        check_choice(self.target, "target", TARGETS)

    @property
    def delta(self) -> float:
        return 1.0 - float(self.confidence)

    # -- life cycle ------------------------------------------------------
    def start(self, bank: BankSpec) -> BankMethod:
        self._validate_params()
        self.bank_ = bank
        n = bank.n_items
        self.scores_ = np.full(n, np.nan)
        self.scored_ = np.zeros(n, dtype=bool)
        self.order_ = np.zeros(0, dtype=np.int64)  # positions in the order they were absorbed
        self.pending_ = np.zeros(n, dtype=bool)
        self.n_looks_ = 0
        self.proposed_rank_ = None
        self._start_extra()
        return self

    def _start_extra(self) -> None:
        """Hook for subclasses: initialise learned state after ``start``."""

    def _check_started(self) -> None:
        if not hasattr(self, "bank_"):
            raise InputError(f"method {self.name!r} was used before start(bank)")

    @property
    def n_scored(self) -> int:
        return int(self.scored_.sum())

    @property
    def exhausted(self) -> bool:
        return bool(self.scored_.all())

    def available(self) -> np.ndarray:
        """Positions neither scored nor pending."""
        return np.flatnonzero(~self.scored_ & ~self.pending_)

    def propose(self, k: int, rng: np.random.Generator) -> Proposal:
        self._check_started()
        k = check_positive_int(k, "k (batch size)")
        avail = self.available()
        if avail.size == 0:
            return Proposal(np.zeros(0, dtype=np.int64), np.zeros(0))
        k = min(k, avail.size)
        items, probs = self._choose(k, rng)
        items = np.asarray(items, dtype=np.int64)
        self.pending_[items] = True
        rank = self._proposed_rank()
        rank[items] = self._next_rank + np.arange(items.size)
        self._next_rank += items.size
        if probs is None:
            probs = np.full(len(items), 1.0 / avail.size)
        return Proposal(items, np.asarray(probs, dtype=float))

    def _choose(self, k: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
        avail = self.available()
        return rng.choice(avail, size=k, replace=False), None

    def update(self, items: Any, scores: Any) -> None:
        self._check_started()
        items = check_item_indices(items, self.bank_.n_items)
        scores = check_scores(scores)
        check_same_length(items, scores, "items", "scores")
        if items.size == 0:
            return
        # keep the first score of an item; ignore repeats (retries)
        _, first = np.unique(items, return_index=True)
        first.sort()
        items, scores = items[first], scores[first]
        # a batch's scores are absorbed in proposal order, whatever order they arrived in, so a result never
        # depends on which model call finished first (items never proposed keep their given order, after)
        by_proposal = np.argsort(self._proposed_rank()[items], kind="stable")
        items, scores = items[by_proposal], scores[by_proposal]
        fresh = ~self.scored_[items]
        items, scores = items[fresh], scores[fresh]
        self.pending_[items] = False
        self.scores_[items] = scores
        self.scored_[items] = True
        self.order_ = np.concatenate([self.order_, items])
        self.n_looks_ += 1
        self._absorb(items, scores)

    def _proposed_rank(self) -> np.ndarray:
        """Position of each item in the sequence of proposals (a large number for never proposed)."""
        if getattr(self, "proposed_rank_", None) is None:
            self.proposed_rank_ = np.full(self.bank_.n_items, np.iinfo(np.int64).max, dtype=np.int64)
            self._next_rank = 0
        return self.proposed_rank_

    def _absorb(self, items: np.ndarray, scores: np.ndarray) -> None:
        """Hook: incremental statistics after new scores (items already recorded)."""

    def propose_shared_order(self, items: Any) -> None:
        """Take ``items`` as the next draws, made ∝ the estimand's weights without replacement by the caller (a
        shared order fixed before any score, as in paired runs). Methods whose martingale needs each draw's law
        record it here; for the others the order needs no record (default: nothing to do)."""

    def release(self, items: Any) -> None:
        """Forget that ``items`` are pending (their batch was lost); they may be proposed again."""
        items = check_item_indices(items, self.bank_.n_items)
        self.pending_[items] = False

    # -- persistence -----------------------------------------------------
    def state(self) -> dict[str, Any]:
        self._check_started()
        return _jsonable(
            {
                "method": self.name,
                "params": self.get_params(),
                "bank": self.bank_.to_state(),
                "order": self.order_,
                "scores": self.scores_[self.order_],
                "looks": self.n_looks_,
                "extra": self._state_extra(),
            }
        )

    def _state_extra(self) -> dict[str, Any]:
        return {}

    def _load_extra(self, extra: dict[str, Any]) -> None:
        """Hook: restore learned state that cannot be replayed from the scores."""

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BankMethod:
        if state.get("method") != cls.name:
            raise InputError(f"state is for method {state.get('method')!r}, not {cls.name!r}")
        obj = cls.from_params(state["params"])
        obj.start(BankSpec.from_state(state["bank"]))
        order = np.asarray(state["order"], dtype=np.int64)
        scores = np.asarray(state["scores"], dtype=float)
        obj._replay(order, scores, int(state.get("looks", 1)))
        obj._load_extra(state.get("extra") or {})
        return obj

    def _replay(self, order: np.ndarray, scores: np.ndarray, looks: int) -> None:
        """Rebuild statistics from the absorbed scores (one update per look is not needed)."""
        if order.size:
            self.update(order, scores)
        self.n_looks_ = looks

    def to_json(self) -> str:
        return json.dumps(self.state())

    # -- helpers for results ----------------------------------------------
    def _empty_estimate(self, guarantee: str) -> Estimate:
        return Estimate(
            method=self.name,
            mean=float("nan"),
            lower=0.0,
            upper=1.0,
            n_scored=0,
            confidence=float(self.confidence),
            anytime_valid=self.anytime_valid,
            target=self.target,
            n_total=self.bank_.n_items,
            guarantee=guarantee,
            validity=self.validity,
        )


@dataclass
class _Registry:
    methods: dict[str, type] = field(default_factory=dict)


REGISTRY = _Registry()


def register(cls: type) -> type:
    """Class decorator: make a method available by its ``name``."""
    REGISTRY.methods[cls.name] = cls
    return cls
