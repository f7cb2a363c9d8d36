"""Bank-target best-model selection: top-K within epsilon on the shared item order drawn ∝ weight.

Each model has an exact without-replacement confidence sequence for its bank mean
(:mod:`~.wor_streams`), simultaneous over the M models; up to :data:`PAIRED_MODELS` models every pair also has one
for its paired difference, which close arms need (models answer the same items, so a difference varies far less
than two separate means suggest). The rule is LUCB's (Kalyanakrishnan et al. 2012) on both, see
:class:`BankSelection`. For the best model within epsilon > 0 the pairs' CSs give way to boundary tests: one
"not the best" test per model (:mod:`.best_arm_tests`) for the drops and the ε-listing tests of
:mod:`.epsilon_tests` for the stop.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from certeval.errors import InputError

from ..results import to_jsonable
from ..validation import check_alpha, check_in_range, check_positive_int
from .best_arm_tests import LeaderListings, NotBestTests
from .ranking import look_arrays
from .wor_streams import absorb_rows, check_weights, fresh_like, make_streams, streams_from_state

PAIRED_MODELS = 400  # beyond, P = M(M-1)/2 pair streams cost more than close arms save: per-model CSs alone
# the top-1 tests replay the order so far for a new leader's pairs: they keep every running model's scores (M x N
# floats, 64 MB at this many cells); a larger board keeps the per-model CSs alone
LISTING_CELLS = 1 << 23


@dataclass(frozen=True)
class BestArmResult:
    """Top-K identification within epsilon on the bank target (see :class:`BankSelection`)."""

    selected: tuple[str, ...]
    discarded: tuple[str, ...]
    models: tuple[Any, ...]  # ModelStatus
    n_total: int
    top: int
    epsilon: float
    threshold: float
    alpha: float
    guarantee: str
    done: bool

    @property
    def fraction_used(self) -> float:
        return float(sum(m.n_scored for m in self.models)) / (len(self.models) * self.n_total)

    def to_dict(self) -> dict[str, Any]:
        return to_jsonable({
            "selected": list(self.selected), "discarded": list(self.discarded),
            "models": [dict(vars(m)) for m in self.models], "n_total": self.n_total,
            "fraction_used": self.fraction_used, "top": self.top, "epsilon": self.epsilon,
            "threshold": self.threshold, "halfwidth": self.epsilon, "mode": "best", "alpha": self.alpha,
            "guarantee": self.guarantee, "target": "bank", "done": self.done})


class BankSelection:
    """Best-arm (top-K) identification within epsilon, bank target, on the shared order drawn ∝ weight.

    Each model has a without-replacement CS for its bank mean at level alpha / M (simultaneous over models
    and looks). With ``paired`` (default) and 2 to :data:`PAIRED_MODELS` models, each pair also has one for its
    paired difference mu_i - mu_j, and alpha is split: alpha / (2M) per model, alpha / (2Q) per pair, where
    Q = K(M - K) + K(K - 1)/2 (:func:`top_pairs`, at most P) counts the pairs with a member in a fixed top-K set
    T of the bank means — the only pairs whose CSs the statements below rely on. At each look, with A the models
    not yet dropped:

    * a model with ``upper < threshold`` is dropped ("below");
    * a model with at least K models of A surely better — their lower bound above its upper bound, or the
      pair's difference surely positive — is outside the top K and is dropped ("not-best");
    * stop when the K models of A with the largest means, S, satisfy ``min_{i in S} lower_i >=
      max_{j in A \\ S} upper_j - epsilon`` (LUCB's rule, Kalyanakrishnan et al. 2012), or every pair (i in S,
      j in A \\ S) has its difference's lower bound at least -epsilon: on the event that every CS covers, each
      selected model's bank mean is at least every unselected one's minus epsilon, i.e. the selection is an
      epsilon-top-K of the bank, with probability >= 1 - alpha. Models of S keep being scored until then; at
      exhaustion the exact means decide.

    Why pairs of T suffice (Q, not P): on the event that every model CS and every pair CS with a member in T
    covers (probability >= 1 - alpha), (i) no t in T is dropped as "not-best": that needs K models surely above t,
    each read from a covering pair (k, t) or the models' CSs, but at most K - 1 models lie above a member of T;
    (ii) a wrong stop — some selected i with mu_i < mu_j - epsilon for an unselected j — implies some t in T \\ S
    with mu_t > mu_i + epsilon (if j is not in T, S misses a member of T, each at least mu_j); t is still running
    by (i) (or left below the threshold), so the stop read the covering pair (i, t) as >= -epsilon: impossible.
    A "not-best" drop of a model outside T is then correct when the K-th and (K+1)-th bank means differ.

    The best model within epsilon > 0 (``top=1``, pairs on) is certified by boundary tests instead of the pair
    CSs, which must clear a whole interval at alpha / (2(M - 1)) each. Of the pairs' alpha / 2, half goes to one
    test per model of "it is a best model" (:class:`~.best_arm_tests.NotBestTests`, against the leader picked item
    by item; only a best model's null is true, so each runs at alpha / 4 whole): its rejection drops the model as
    "not-best". The other half goes to the ε-listing tests of the pairs (:class:`~.epsilon_tests.EpsilonTests`)
    at alpha / (4(M − 1)): stop once the leader is listed above every other running model (mu_leader >= mu_j −
    epsilon). Only the leader's pairs are read, so they are opened when first read by replaying the order so far
    (:class:`~.best_arm_tests.LeaderListings`): no pair limit, up to :data:`LISTING_CELLS` model × item cells.
    Why that level suffices: fix a best model b; off the event that b's not-best test rejects (alpha / 4) b keeps
    running, and a leader more than epsilon below b can only be stopped on by a false listing of one of the M − 1
    pairs (leader, b). Beside the model CSs (alpha / 2) the selection is an epsilon-top-1 and a best model is never
    dropped, jointly with probability >= 1 - alpha.
    """

    TESTED = True  # the boundary tests for top-1 within epsilon (a subclass with its own pair streams turns them off)

    def __init__(self, names: Sequence[str], *, alpha: float = 0.05, top: int = 1, epsilon: float = 0.0,
                 threshold: float = 0.0, paired: bool = True) -> None:
        self.names = tuple(str(x) for x in names)
        if len(self.names) < 1:
            raise InputError("selection needs at least one model")
        self.alpha = check_alpha(alpha)
        self.top = check_positive_int(top, "top")
        if self.top > len(self.names):
            raise InputError(f"top must be at most the number of models ({len(self.names)}), got {top!r}")
        self.epsilon = check_in_range(epsilon, "epsilon", 0.0, 1.0)
        self.threshold = check_in_range(threshold, "threshold", 0.0, 1.0)
        self.paired = bool(paired)

    def start(self, weights: np.ndarray, bet_horizon: int | None = None) -> BankSelection:
        """As :meth:`BankRanking.start`: weights in ``update``'s positions, the order drawn ∝ them."""
        self.w = check_weights(weights)
        m = len(self.names)
        self.tested_ = (self.paired and self.TESTED and self.top == 1 and self.epsilon > 0 and m >= 2
                        and (m <= PAIRED_MODELS or m * self.w.size <= LISTING_CELLS))
        self.paired_ = self.paired and 2 <= m <= PAIRED_MODELS and not self.tested_  # the pair CSs
        self.streams = make_streams(m, self.w.size, self.model_alpha(), bet_horizon)
        if self.tested_:  # O(M) tests and the leader's pairs
            self.not_best = NotBestTests(m, self.w.size, self.alpha / 4)
            self.listings = LeaderListings(m, self.w.size, self.alpha / (4 * (m - 1)), self.epsilon)
        if self.paired_:
            self.pair_a, self.pair_b = (v.astype(np.int64) for v in np.triu_indices(m, k=1))
            p = self.pair_a.size
            self.pairs = make_streams(p, self.w.size, self.alpha / (2 * top_pairs(m, self.top)), bet_horizon)
            self.pair_lower, self.pair_upper = np.full(p, -1.0), np.ones(p)
            self.pair_open = np.zeros(p, dtype=bool)
            # the order so far, for pairs opened late: filled look by look (self.n items), never regrown
            self.seen_items = np.zeros(self.w.size, dtype=np.int64)
            self.seen_x = np.full((m, self.w.size), np.nan)
        self.status = np.array(["running"] * m, dtype=object)
        self.look_of = np.zeros(m, dtype=np.int32)
        self.used = np.zeros(m, dtype=np.int32)
        self.mean = np.full(m, np.nan)
        self.lower = np.zeros(m)
        self.upper = np.ones(m)
        self.n = 0
        self.looks = 0
        self.finished = False
        return self

    def model_alpha(self) -> float:
        """Each model's CS level: alpha / 2M beside the pairs' CSs or tests, else alpha / M."""
        m = len(self.names)
        return self.alpha / (2 * m if self.paired_ or self.tested_ else m)

    @property
    def n_total(self) -> int:
        return int(self.w.size)

    @property
    def active(self) -> list[str]:
        return [self.names[k] for k in range(len(self.names)) if self.status[k] == "running"]

    def open_look(self, items: Any, scores: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """A look's checked arrays and the models still running (None when there is nothing to do); counts it."""
        items, x = look_arrays(self.names, items, scores)
        if items.size == 0 or self.finished:
            return None
        live = np.flatnonzero(self.status == "running")
        if np.isnan(x[live]).any():
            raise InputError("every model still in play needs a score for every item of the look")
        self.n += items.size
        self.looks += 1
        return items, x, live

    def update(self, items: Any, scores: Any) -> BankSelection:
        look = self.open_look(items, scores)
        if look is None:
            return self
        items, x, live = look
        absorb_rows(self.streams, live, x[live], self.w[items])
        self.used[live] = self.n
        mean, lower, upper = self.streams.bounds()
        self.mean[live], self.lower[live], self.upper[live] = mean[live], lower[live], upper[live]
        self.absorb_paired(live, x, items)
        self._decide(live)
        return self

    def absorb_paired(self, live: np.ndarray, x: np.ndarray, items: np.ndarray) -> None:
        """The look's paired differences (models answer the same items): into the running models' not-best tests
        and their open pairs' ε-listing tests (top-1 within epsilon), else into the pair CSs."""
        if self.tested_:
            w = self.w[items]
            self.not_best.absorb(live, x[live], w)
            self.listings.absorb(live, x, items, w)
        elif self.paired_:
            self._absorb_pairs(live, x, items)

    def listed_above(self) -> np.ndarray:
        """``(M, M)``: True where an open pair's ε-listing test certifies mu_i >= mu_j − epsilon."""
        return self.listings.matrix()

    def _absorb_pairs(self, live: np.ndarray, x: np.ndarray, items: np.ndarray) -> None:
        """The look's paired differences (as scores in [0, 1]) for the open pairs whose models both still run;
        then the pairs the rule needs now — each of the K leading models with every other running model — are
        opened by replaying the order so far. A pair's CS is a function of the order alone, so opening it late
        gives exactly the CS it would have had from the start (the Bonferroni covers all P pairs): the cost is
        the pairs the rule reads, not all P. Pairs whose model left stay frozen."""
        m = len(self.names)
        seen = slice(self.n - items.size, self.n)  # open_look has counted the look's items
        self.seen_items[seen], self.seen_x[:, seen] = items, x
        running = np.zeros(m, dtype=bool)
        running[live] = True
        rows = np.flatnonzero(self.pair_open & running[self.pair_a] & running[self.pair_b])
        if rows.size:
            self._pair_look(rows, x, items)
        new = self._pairs_needed(live, running)
        if new.size:  # running models were scored at every look: their whole order so far is in seen_x
            self.pairs.put_rows(new, self._pair_replay(new))
            self.pair_open[new] = True
            rows = np.concatenate([rows, new])
        if rows.size:
            _, lower, upper = self.pairs.bounds()
            self.pair_lower[rows], self.pair_upper[rows] = 2.0 * lower[rows] - 1.0, 2.0 * upper[rows] - 1.0

    def _pair_look(self, rows: np.ndarray, x: np.ndarray, items: np.ndarray) -> None:
        """The look's paired differences into the open pair streams ``rows``."""
        diff = (x[self.pair_a[rows]] - x[self.pair_b[rows]] + 1.0) / 2.0
        absorb_rows(self.pairs, rows, diff, self.w[items])

    def _pair_replay(self, new: np.ndarray) -> Any:
        """Fresh streams for the pairs ``new``, having absorbed the whole order so far."""
        past_x, past_items = self.seen_x[:, :self.n], self.seen_items[:self.n]
        diff = (past_x[self.pair_a[new]] - past_x[self.pair_b[new]] + 1.0) / 2.0
        fresh = fresh_like(self.pairs, new.size)
        fresh.absorb(diff, self.w[past_items])
        return fresh

    def _pairs_needed(self, live: np.ndarray, running: np.ndarray) -> np.ndarray:
        """Rows of the unopened pairs between one of the K running models with the largest means and another
        running model (what LUCB's stop and the drops read); ``running`` is ``live`` as a mask."""
        if live.size <= self.top:
            return np.zeros(0, dtype=np.int64)
        leaders = live[np.argsort(-self.mean[live], kind="stable")[:self.top]]
        lead = np.zeros(len(self.names), dtype=bool)
        lead[leaders] = True
        a, b = self.pair_a, self.pair_b
        want = running[a] & running[b] & (lead[a] | lead[b]) & ~self.pair_open
        return np.flatnonzero(want)

    def surely_above(self) -> np.ndarray:
        """``(M, M)`` lower bounds of mu_i - mu_j: the pair's CS where there is one, else the two models' CSs."""
        low = self.lower[:, None] - self.upper[None, :]
        if self.paired_:
            a, b = self.pair_a, self.pair_b
            low[a, b] = np.maximum(low[a, b], self.pair_lower)
            low[b, a] = np.maximum(low[b, a], -self.pair_upper)
        np.fill_diagonal(low, -np.inf)
        return low

    def _decide(self, live: np.ndarray) -> None:
        k = self.top
        alive = np.flatnonzero(self.status != "below")
        alive = alive[self.status[alive] != "not-best"]
        for j in live:
            if self.upper[j] < self.threshold:
                self.status[j], self.look_of[j] = "below", self.looks
        alive = alive[self.status[alive] != "below"]
        diff_low = self.surely_above()
        if self.tested_:  # a model whose "best" null is rejected leaves
            for j in live:
                if self.status[j] == "running" and self.not_best.rejected[j]:
                    self.status[j], self.look_of[j] = "not-best", self.looks
            alive = alive[self.status[alive] != "not-best"]
        if len(alive) > k:  # surely outside the top K: K models certainly better
            # 1e-12: an exact tie at exhaustion must not read as 'surely better' both ways after rounding
            better = (diff_low[np.ix_(alive, alive)] > 1e-12).sum(axis=0)
            for j, n_better in zip(alive, better):
                if self.status[j] == "running" and n_better >= k:
                    self.status[j], self.look_of[j] = "not-best", self.looks
            alive = alive[self.status[alive] != "not-best"]
        exact = self.n == self.n_total
        if len(alive) <= k:
            chosen, rest = alive, alive[:0]
        else:
            by_mean = alive[np.argsort(-self.mean[alive], kind="stable")]
            chosen, rest = by_mean[:k], by_mean[k:]
        certified = diff_low[np.ix_(chosen, rest)] >= -self.epsilon
        if self.tested_ and not exact and len(rest) and len(chosen):
            certified |= self.listings.listed_above(int(chosen[0]), rest, self.w)[None, :]
        if exact or len(rest) == 0 or certified.all():
            for j in chosen:
                if self.status[j] == "running":
                    self.status[j], self.look_of[j] = "selected", self.looks
            for j in rest:
                if self.status[j] == "running":
                    self.status[j], self.look_of[j] = "not-selected", self.looks
            self.finished = True

    def result(self) -> BestArmResult:
        from ..distribution.selection import ModelStatus

        m = len(self.names)
        keep = [j for j in range(m) if self.status[j] in ("selected", "running")]
        keep.sort(key=lambda j: -self.mean[j])
        models = tuple(ModelStatus(self.names[j], float(self.mean[j]), float(self.lower[j]), float(self.upper[j]),
                                   int(self.used[j]), str(self.status[j]), int(self.look_of[j]) or None)
                       for j in range(m))
        guarantee = (f"bank target, anytime-valid: without-replacement {self.streams.CONSTRUCTION} CS per model, items "
                     f"drawn in proportion to their weights, at level {1 - self.model_alpha():.4g}"
                     f"{self.pairs_guarantee()}; {self.selection_statement()}")
        return BestArmResult(tuple(self.names[j] for j in keep),
                             tuple(self.names[j] for j in range(m) if j not in keep), models, self.n_total, self.top,
                             self.epsilon, self.threshold, self.alpha, guarantee, self.finished)

    def pairs_guarantee(self) -> str:
        """What the pairs add to the models' CSs, for the guarantee."""
        m = len(self.names)
        if self.tested_:
            return (f", a 'best model' betting test per model (its opponent the leader before each item) at level "
                    f"{1 - self.alpha / 4:.4g} and two one-sided without-replacement betting tests per pair on the "
                    f"paired difference (mu_a - mu_b <= -{self.epsilon:g} and >= {self.epsilon:g}) at level "
                    f"{1 - self.alpha / (4 * (m - 1)):.4g} (the stop needs the leader's {m - 1} listings; only a best "
                    f"model's null is true)")
        if self.paired_:
            p = self.pair_a.size
            q = top_pairs(m, self.top)
            return (f", and one per pair on the paired difference at level {1 - self.pairs.delta:.4g} "
                    f"(Bonferroni over {m} models and the {q} of the {p} pairs with a member in a top-{self.top} set: "
                    f"no other pair's CS enters the statement)")
        return f" (Bonferroni over {m} models)"

    def selection_statement(self) -> str:
        if self.tested_:
            return (f"the selection is an epsilon-top-1 of the bank means and a best model is never dropped (every "
                    f"drop is correct when the best is unique), jointly with probability >= {1 - self.alpha:g}")
        return (f"the selection is an epsilon-top-{self.top} of the bank means and no model of a top-{self.top} set "
                f"is dropped (every drop is correct when the {self.top}-th and next bank means differ), jointly with "
                f"probability >= {1 - self.alpha:g}")

    ARRAYS = ("w", "status", "look_of", "used", "mean", "lower", "upper")

    def state(self) -> dict[str, Any]:
        return {"kind": "bank-selection", "names": list(self.names), "alpha": self.alpha, "top": self.top,
                "epsilon": self.epsilon, "threshold": self.threshold, "n": self.n, "looks": self.looks,
                "finished": self.finished, "streams": self.streams.state(), "paired": self.paired_,
                "tested": self.tested_,
                **({"not_best": self.not_best.state(), "listings": self.listings.state()} if self.tested_ else {}),
                **({"pairs": self.pairs.state(), "pair_lower": self.pair_lower.copy(),
                    "pair_upper": self.pair_upper.copy(), "pair_open": self.pair_open.copy(),
                    "seen_items": self.seen_items.copy(), "seen_x": self.seen_x.copy()} if self.paired_ else {}),
                **{k: (getattr(self, k).astype(str).tolist() if k == "status" else getattr(self, k).copy())
                   for k in self.ARRAYS}}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> BankSelection:
        obj = cls(state["names"], alpha=float(state["alpha"]), top=int(state["top"]),
                  epsilon=float(state["epsilon"]), threshold=float(state["threshold"]),
                  paired=bool(state.get("paired", False)))  # states stored before pairs had none
        obj.n, obj.looks, obj.finished = int(state["n"]), int(state["looks"]), bool(state["finished"])
        obj.streams = streams_from_state(state["streams"])
        obj.paired_ = obj.paired
        obj.tested_ = bool(state.get("tested", False))  # states stored before the tests had none
        if obj.tested_:
            obj.not_best = NotBestTests.from_state(state["not_best"])
            obj.listings = LeaderListings.from_state(state["listings"])
        if obj.paired_:
            m = len(obj.names)
            obj.pair_a, obj.pair_b = (v.astype(np.int64) for v in np.triu_indices(m, k=1))
            obj.pairs = streams_from_state(state["pairs"])
            obj.pair_lower, obj.pair_upper = np.asarray(state["pair_lower"]).copy(), np.asarray(state["pair_upper"]).copy()
            obj.pair_open = np.asarray(state["pair_open"], dtype=bool).copy()
            obj.seen_items = np.asarray(state["seen_items"], dtype=np.int64).copy()
            obj.seen_x = np.asarray(state["seen_x"], dtype=float).reshape(m, -1).copy()  # (M, bank size)
        for k in cls.ARRAYS:
            v = np.asarray(state[k])
            setattr(obj, k, v.astype(object) if k == "status" else v.copy())
        return obj


def top_pairs(m: int, top: int) -> int:
    """Pairs with at least one member in a fixed set of ``top`` of ``m`` models: K(M − K) + K(K − 1)/2."""
    return top * (m - top) + top * (top - 1) // 2
