"""The group estimators of paired runs (compare, rank, select) behind one small protocol.

A paired run scores every model still in play on the same items, the next slice of one shared order of the bank
(:func:`shared_order`). What decides the run is a *group* estimator over the shared score matrix — a pair's
difference, a ranking's pairs, a selection's arms — and there are several: the bank target's exact
without-replacement CSs (:mod:`.bank.ranking`, :mod:`.bank.selection`), the same with history as control variates
(:mod:`.history.paired`), and the distribution target's group-sequential tests (:mod:`.distribution.comparison`,
:mod:`.distribution.ranking`) and i.i.d. betting confidence sequences (:mod:`.distribution.selection`). Each is wrapped here in a :class:`GroupEstimator` — start / update / result /
active, the shape of inspect_ai's four-method ``EarlyStopping``, plus the per-model intervals it reports and what
they claim — so the round engine (:class:`certeval.engine.PairedRounds`) drives any of them the same way and
never probes them::

    group = make_group(request).start(spec, order)   # order: the shared order's bank positions
    group.update(start, stop, block)                 # look: shared columns start..stop, (M, stop-start) scores
    outcome = group.result()                         # Comparison / Ranking / Selection / BestArmResult
    group.active                                     # models still sampled ([]: the run is decided)
    group.intervals(outcome)                         # per model (mean, lower, upper, items) (rank/select), else {}

A paired run resumes by replaying its recorded rounds through ``update`` (the look log is the one record), so
the groups keep no separate state.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import numpy as np

from certeval.errors import InputError

KINDS = ("compare", "rank", "select")
GROUP_NOUN = {"compare": "comparison", "rank": "ranking", "select": "selection"}
# the ε-ranking's construction (rank --epsilon, bank target, no history): "neighbours" (per-model CSs settle the pairs
# far apart, pair tests only for the neighbours they leave unsettled: estimators/bank/neighbour_ranking.py), "all-pairs"
# (two tests for every pair at alpha/P: BankRanking), "auto" (neighbours)
RANKINGS = ("auto", "neighbours", "all-pairs")


def epsilon_ranking_construction(request: GroupRequest) -> str:
    """Which ε-ranking a bank-target ``rank --epsilon`` request runs: ``neighbours`` or ``all-pairs``."""
    if request.ranking not in RANKINGS:
        raise InputError(f"ranking must be one of {', '.join(RANKINGS)}, got {request.ranking!r}")
    return "all-pairs" if request.ranking == "all-pairs" else "neighbours"


@dataclass(frozen=True)
class GroupRequest:
    """What a paired run's group estimator is asked: the kind, the models, the target and the rule's numbers.

    ``history`` maps a model to its :class:`~.history.prior.HistoryPrior` (bank target only); ``max_items`` tunes the
    bets of the bank target's CSs to stop there (any value keeps the guarantee); ``look_size`` is the
    distribution target's planned look size (its alpha spending), ``design`` its test (default: paired statistic,
    Pocock spending, at the request's level and margin)."""

    kind: str
    labels: tuple[str, ...]
    target: str = "bank"
    confidence: float = 0.95
    margin: float = 0.0
    threshold: float | None = None
    halfwidth: float | None = None
    top: int | None = None
    mode: str = "best"
    look_size: int = 50
    max_items: int | None = None
    history: Mapping[str, Any] = field(default_factory=dict)
    design: Any = None  # distribution target: a ComparisonDesign (statistic, spending, guarantee); None: the default
    epsilon: float | None = None  # rank, bank target: ε-statements instead of the margin's strict ones
    precision: float | None = None  # rank, bank target: every model's mean within ±precision (leaderboard)
    ranking: str = "auto"  # rank --epsilon, bank target: "neighbours", "all-pairs" or "auto" (RANKINGS)

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence


@runtime_checkable
class GroupEstimator(Protocol):
    """One paired run's decision-maker (see the module docstring)."""

    def start(self, spec: Any, order: np.ndarray) -> GroupEstimator: ...

    def update(self, start: int, stop: int, block: np.ndarray) -> None: ...

    def result(self) -> Any: ...

    @property
    def active(self) -> list[str]: ...

    def intervals(self, outcome: Any) -> dict[str, tuple[float, float, float, int]]: ...

    def interval_claim(self) -> dict[str, Any]: ...


def make_group(request: GroupRequest) -> GroupEstimator:
    """The group estimator for ``request`` (not started)."""
    if request.kind not in KINDS:
        raise InputError(f"a paired run is one of {', '.join(KINDS)}, got {request.kind!r}")
    special = request.epsilon is not None or request.precision is not None
    if special and (request.kind != "rank" or request.target != "bank"):
        raise InputError("epsilon-statements and leaderboard precision are bank-target rankings, got kind "
                         f"{request.kind!r}, target {request.target!r}")
    if request.target == "bank":
        if request.kind == "compare" and request.history:
            return HistoryPairGroup(request)
        return BankGroup(request)
    if request.history:
        raise InputError("history answers the bank target; a distribution-target run takes none")
    return DistributionGroup(request)


def shared_order(weights: np.ndarray | None, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The shared order of a paired run and each draw's probability given the draws before it: items drawn ∝
    their weight in the estimand without replacement (bank target), or a uniform permutation (``weights`` None:
    the distribution target)."""
    from .bank.wor_streams import weighted_order

    if weights is None:
        return rng.permutation(n), 1.0 / (n - np.arange(n))
    order = weighted_order(weights, rng)
    undrawn = 1.0 - np.concatenate([[0.0], np.cumsum(weights[order])[:-1]])
    return order, weights[order] / np.maximum(undrawn, weights[order])


class _Group:
    """Shared plumbing: the request, the started estimator in ``estimator_``, the shared order in ``order_``;
    the outcome is computed once per look (a ranking's result over millions of pairs is not free)."""

    def __init__(self, request: GroupRequest) -> None:
        self.request = request

    def update(self, start: int, stop: int, block: np.ndarray) -> None:
        self.outcome_ = None
        self.looks_ += 1
        self._absorb(start, stop, block)

    @property
    def active(self) -> list[str]:
        """Models still sampled: every model before the first look, [] once the group has decided."""
        return list(self.request.labels) if not self.looks_ else self._still()

    def result(self) -> Any:
        if self.outcome_ is None:
            self.outcome_ = self._result()
        return self.outcome_

    def _everyone_until_done(self, outcome: Any) -> list[str]:
        return [] if outcome.done else list(self.request.labels)

    def intervals(self, outcome: Any) -> dict[str, tuple[float, float, float, int]]:
        if self.request.kind == "select":
            return {s.model: (s.mean, s.lower, s.upper, s.n_scored) for s in outcome.models}
        return {}

    def interval_claim(self) -> dict[str, Any]:
        """What the per-model intervals of :meth:`intervals` claim, as :class:`~.results.Estimate` fields."""
        r = self.request
        m = len(r.labels)
        exact = r.target == "bank"
        how = ("exact without-replacement betting confidence sequences for the bank means" if exact else
               "group-sequential normal intervals for the expected scores (asymptotic, at the planned looks)")
        uses = ("on the items both models scored, the same estimator as the pair's difference (the two means differ "
                "by it)" if r.kind == "compare" else "the intervals its verdicts use")
        return {"method": r.kind, "validity": "exact" if exact else "asymptotic", "anytime_valid": exact,
                "confidence": r.confidence, "subsets": (),
                "guarantee": f"the {GROUP_NOUN[r.kind]}'s own interval for each model: {how}, each at level "
                             f"1 - alpha/{m}, simultaneous over the {m} models with probability >= {r.confidence:g} "
                             f"({uses})"}


class BankGroup(_Group):
    """Bank target: :class:`~.bank.ranking.BankRanking` (rank; compare is its ranking of two) or
    :class:`~.bank.selection.BankSelection`, or their history-powered forms
    (:class:`~.history.ranking.HistoryRanking`, :class:`~.history.paired.HistorySelection`,
    :class:`~.history.paired.HistoryPrecision`). Updates take the looks' bank positions."""

    def start(self, spec: Any, order: np.ndarray) -> BankGroup:
        from .bank.ranking import BankRanking
        from .bank.selection import BankSelection
        from .history.paired import HistorySelection
        from .history.ranking import HistoryRanking

        r = self.request
        self.order_ = np.asarray(order, dtype=np.int64)
        priors = [r.history[label] for label in r.labels] if r.history else None
        if r.kind == "rank" and priors and r.precision is not None:  # each model: certify --history's CS, alpha / M
            from .history.paired import HistoryPrecision

            self.estimator_ = HistoryPrecision(r.labels, priors, spec, halfwidth=r.precision, alpha=r.alpha).start()
        elif r.kind == "rank" and priors:  # each pair: the bank ranking's CS on difference − prediction, at alpha / P
            self.estimator_ = HistoryRanking(r.labels, priors, spec, alpha=r.alpha, margin=r.margin, epsilon=r.epsilon,
                                             bet_horizon=r.max_items)
        elif r.kind == "select" and priors:  # each model: certify --history's exact CS, at alpha / M
            self.estimator_ = HistorySelection(r.labels, priors, spec, alpha=r.alpha, top=r.top or 1,
                                               epsilon=r.halfwidth or 0.0, threshold=r.threshold or 0.0).start()
        elif r.kind == "rank" and r.precision is not None:
            from .bank.precision import BankPrecision

            self.estimator_ = BankPrecision(r.labels, halfwidth=r.precision, alpha=r.alpha).start(
                spec.weights(), bet_horizon=r.max_items)
        elif r.kind == "select":
            self.estimator_ = BankSelection(r.labels, alpha=r.alpha, top=r.top or 1, epsilon=r.halfwidth or 0.0,
                                            threshold=r.threshold or 0.0).start(spec.weights(), bet_horizon=r.max_items)
        elif r.kind == "rank" and r.epsilon is not None and epsilon_ranking_construction(r) == "neighbours":
            from .bank.neighbour_ranking import NeighbourRanking

            self.estimator_ = NeighbourRanking(r.labels, alpha=r.alpha, epsilon=r.epsilon).start(
                spec.weights(), bet_horizon=r.max_items)
        else:
            self.estimator_ = BankRanking(r.labels, alpha=r.alpha, margin=r.margin, epsilon=r.epsilon).start(
                spec.weights(), bet_horizon=r.max_items)
        self.outcome_, self.looks_ = None, 0
        return self

    def _absorb(self, start: int, stop: int, block: np.ndarray) -> None:
        self.estimator_.update(self.order_[start:stop], block)

    def _result(self) -> Any:
        if self.request.kind == "compare":
            return self.estimator_.pair_table().comparison(0)
        return self.estimator_.result()

    def _still(self) -> list[str]:
        if self.request.kind == "compare":
            return self._everyone_until_done(self.result())
        return self.estimator_.active

    def interval_claim(self) -> dict[str, Any]:
        claim = super().interval_claim()
        share = getattr(getattr(self, "estimator_", None), "model_share", None)
        if share is not None:  # the neighbour ε-ranking: its model CSs spend share·alpha (the pairs the rest)
            m, r = len(self.request.labels), self.request
            claim["guarantee"] = (f"the ranking's own interval for each model: without-replacement confidence "
                                  f"sequences for the bank means, each at level 1 - {share:g}·alpha/{m}, "
                                  f"simultaneous over the {m} models with probability >= {1 - share * r.alpha:g} "
                                  f"(the intervals its certificates use; the pair tests spend the rest of alpha)")
        return claim

    def intervals(self, outcome: Any) -> dict[str, tuple[float, float, float, int]]:
        # BankRanking's, at alpha / M: a comparison is its ranking of two, whose model streams see the pair's items
        # (drawn ∝ the estimand's weights), so the two means differ by the pair's difference
        model_intervals = getattr(self.estimator_, "model_intervals", None)
        if self.request.kind in ("rank", "compare") and model_intervals is not None:
            return model_intervals()
        return super().intervals(outcome)


class HistoryPairGroup(_Group):
    """compare --history: :class:`~.history.paired.PairDifferenceMethod`, the exact bank-target CS of the
    difference with both models' predicted scores as control variate."""

    def start(self, spec: Any, order: np.ndarray) -> HistoryPairGroup:
        from .history.paired import PairDifferenceMethod, PairPrior

        a, b = self.request.labels
        prior = PairPrior(self.request.history[a], self.request.history[b])
        self.order_ = np.asarray(order, dtype=np.int64)
        self.estimator_ = PairDifferenceMethod(confidence=self.request.confidence, subset_intervals=False).start(
            replace(spec, history=prior))
        # each model's bank mean: certify --history's exact CS with its own prediction as control variate, at
        # alpha / 2, on the same draws (the comparison's per-model intervals; the pair's CS decides)
        from .single.history import HistoryMethod

        level = 1.0 - self.request.alpha / 2
        self.models_ = [HistoryMethod(confidence=level, subset_intervals=False).start(
            replace(spec, history=self.request.history[label])) for label in (a, b)]
        self.outcome_, self.looks_ = None, 0
        return self

    def _absorb(self, start: int, stop: int, block: np.ndarray) -> None:
        pair, pos = self.estimator_, self.order_[start:stop]
        methods = [pair, *self.models_]
        self._share_trust()  # measured on the draws before this block: predictable for all three
        for method in methods:
            fresh = ~method.in_log_[pos]
            if fresh.any():  # the shared order's draws (probability w_j / undrawn weight), logged before any score
                method.propose_shared_order(pos[fresh])
        pair.update_pair(pos, block[0], block[1])
        for method, x in zip(self.models_, block):
            method.update(pos, x)
        self._share_trust()  # the point estimates shown at this look

    def _share_trust(self) -> None:
        """One history trust ρ for the pair and both models, measured on the pair's processed draws.

        The control variates are linear in z and h, and with the same pseudo-counts and ρ the pair's
        ``(a_A − a_B + 1)/2`` is its own ``z + ρ (h − z)``, so the models' point estimates differ by the pair's
        exactly; useless history still falls back, as the pair's ρ measures the predicted difference.
        """
        pair = self.estimator_
        pair.share_trust(None)
        rho = pair.measured_trust()
        for method in (pair, *self.models_):
            method.share_trust(rho)

    def intervals(self, outcome: Any) -> dict[str, tuple[float, float, float, int]]:
        out = {}
        for label, method in zip(self.request.labels, self.models_):
            est = method.result()
            out[label] = (float(est.mean), float(est.lower), float(est.upper), int(est.n_scored))
        return out

    def _result(self) -> Any:
        from .history.paired import bank_comparison

        a, b = self.request.labels
        return bank_comparison(self.estimator_, a, b, self.request.margin, self.looks_)

    def _still(self) -> list[str]:
        return self._everyone_until_done(self.result())


class DistributionGroup(_Group):
    """Distribution target, fed one look at a time: the group-sequential tests (:class:`~.distribution.comparison.PairedComparison`,
    :class:`~.distribution.ranking.SequentialRanking`; asymptotic) and the selection's exact i.i.d. betting confidence sequences
    (:class:`~.distribution.selection.SequentialSelection`); their sub-dataset codes (a mean of sub-dataset means only) are in
    the shared order."""

    def start(self, spec: Any, order: np.ndarray) -> DistributionGroup:
        from .distribution.comparison import ComparisonDesign, PairedComparison
        from .distribution.ranking import RankingOptions, SequentialRanking
        from .distribution.selection import SelectionIntervals, SelectionRule, SequentialSelection

        r, n = self.request, int(spec.n_items)
        self.order_ = np.asarray(order, dtype=np.int64)
        by_subset = spec.subsets is not None and spec.mean_of_means  # else the estimand is the plain item mean
        codes = spec.subset_codes()[self.order_] if by_subset else None
        n_subsets = None if codes is None else int(spec.subset_codes().max()) + 1
        design = r.design or ComparisonDesign(alpha=r.alpha, margin=r.margin, look_size=r.look_size)
        if r.kind == "compare":
            self.estimator_ = PairedComparison(r.labels[0], r.labels[1], confidence=r.confidence,
                                               design=design).start(n, codes)
        elif r.kind == "rank":
            options = RankingOptions(r.alpha, r.margin, design)
            self.estimator_ = SequentialRanking(r.labels, n_total=n, options=options, subsets=codes, n_subsets=n_subsets)
        else:
            # exact i.i.d. betting CSs per model (the design's spending is the asymptotic construction's alone)
            rule = SelectionRule(r.threshold, r.halfwidth, r.alpha, r.mode)
            intervals = SelectionIntervals(spending=design.spending, look_size=r.look_size, bet_horizon=r.max_items)
            self.estimator_ = SequentialSelection(r.labels, n_total=n, rule=rule, intervals=intervals, subsets=codes,
                                                  n_subsets=n_subsets)
        self.outcome_, self.looks_ = None, 0
        return self

    def _absorb(self, start: int, stop: int, block: np.ndarray) -> None:
        if self.request.kind == "compare":  # positions in the shared order, where its sub-dataset codes are
            pair = np.where(np.isnan(block), 0.0, block)
            self.estimator_.update(np.arange(start, stop), pair[0], pair[1])
        else:  # the ranking and the selection leave the rows of models that left unread themselves
            self.estimator_.update(block)

    def _result(self) -> Any:
        return self.estimator_.result()

    def interval_claim(self) -> dict[str, Any]:
        claim = super().interval_claim()
        selection = getattr(self, "estimator_", None)  # None before start: the default construction, betting
        if self.request.kind == "select" and getattr(selection, "construction", "betting") == "betting":
            m, r = len(self.request.labels), self.request
            union = (" (one CS on the sub-datasets' importance-weighted scores)" if getattr(selection, "n_sub", 1) > 1
                     else "")
            claim.update(validity="exact", anytime_valid=True,
                         guarantee=f"the selection's own interval for each model: exact i.i.d. betting confidence "
                                   f"sequences for the expected scores (Waudby-Smith & Ramdas 2024){union}, each at "
                                   f"level 1 - alpha/{m}, simultaneous over the {m} models and every item with "
                                   f"probability >= {r.confidence:g} (the intervals its verdicts use)")
        return claim

    def intervals(self, outcome: Any) -> dict[str, tuple[float, float, float, int]]:
        if self.request.kind != "compare":
            return super().intervals(outcome)
        # each model by the pair's own design (statistic, sub-dataset weights, boundary) at alpha / 2, on the
        # items both scored: the two means differ by the pair's difference
        pair = self.estimator_
        n = len(pair.items)
        if n == 0:
            return {}
        design = replace(pair.design, alpha=pair.design.alpha / 2)
        codes = None if pair.subsets is None else pair.subsets[pair.items]
        out = {}
        for label, x in zip(self.request.labels, (pair.a, pair.b)):
            mean, lower, upper = design.interval(x, np.zeros_like(x), pair.look_n, pair.n_total, codes,
                                                 pair.n_subsets)
            mean = float(mean)
            lower = max(0.0, float(lower)) if np.isfinite(lower) else 0.0
            upper = min(1.0, float(upper)) if np.isfinite(upper) else 1.0
            out[label] = (mean, min(lower, mean), max(upper, mean), n)
        return out

    def _still(self) -> list[str]:
        outcome = self.result()
        if self.request.kind == "rank":
            return outcome.undecided_models()  # vectorised: millions of pairs at M ~ 2000
        if self.request.kind == "select":
            return [s.model for s in outcome.models if s.status == "running"]
        return self._everyone_until_done(outcome)
