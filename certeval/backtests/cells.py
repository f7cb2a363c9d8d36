"""The types every backtest shares — one rep's result, :class:`Cell` / :class:`DatasetArrays`, the seeds of a rep
(never from scheduling), the FAQ and history cells — and the ``certify`` kind's rows: :func:`replay_one` (the pure
replay loop) and :func:`certify_rows`.

A cell has a kind: ``certify`` (one model replayed until its goal decides), ``paired`` (one paired run of a
compare / rank / select request, :mod:`certeval.backtests.paired_rows`) and ``faq-budget`` (FAQ and uniform sampling
at fixed budgets, :mod:`certeval.backtests.faq_rows`); :mod:`certeval.backtests.kinds` holds the table of kinds and
``run_chunk``, which every backtest path (in-process or on Ray, :mod:`certeval.backtests.ray_fanout`) calls. Every
kind seeds rep ``r`` with :func:`rep_seed`."""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from certeval.engine import Replay, replay_once  # the pipeline's own round engine, inference by lookup
from certeval.errors import InputError
from certeval.estimators import BankSpec, parse_goal
from certeval.estimators.goals import Goal
from certeval.estimators.validation import check_positive_int

# --------------------------------------------------------------------------------------
# one rep: the pure replay loop
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RepResult:
    """Where one replay stopped and whether its interval covered the bank's mean."""

    n_scored: int
    mean: float
    lower: float
    upper: float
    truth: float
    reached: bool
    rule: str | None
    looks: int
    anytime_valid: bool
    controller_s: float  # time spent in propose/update/result/decide (no inference in a replay)
    curve: tuple[tuple[int, float, float, float], ...] = ()  # (n_scored, mean, lower, upper) per look
    # methods that draw with replacement (faq): n_scored counts draws, this the distinct items among them
    n_distinct: int | None = None
    verdict: str | None = None  # threshold goals: "above" / "below" when decided

    @property
    def covered(self) -> bool:
        return bool(self.lower - 1e-12 <= self.truth <= self.upper + 1e-12)

    @property
    def halfwidth(self) -> float:
        return 0.5 * (self.upper - self.lower)

    def to_dict(self, *, with_curve: bool = False) -> dict[str, Any]:
        out = asdict(self)
        out["covered"] = self.covered
        out["halfwidth"] = self.halfwidth
        if not with_curve:
            out.pop("curve")
        else:
            out["curve"] = [list(c) for c in self.curve]
        return out


def bank_truth(spec: BankSpec, scores: np.ndarray) -> float:
    """The estimand of a bank-target method: the (mean-of-means weighted) bank mean, Arviv et al. 2026 eq. 1."""
    return float(spec.weights() @ np.asarray(scores, dtype=float))


def replay_one(replay: Replay, spec: BankSpec, scores: np.ndarray, rng: np.random.Generator, *,
               record_curve: bool = False) -> RepResult:
    """Run one method on one model's recorded scores until its goal decides (pure, no I/O).

    ``scores[i]`` is the recorded score of bank position ``i``. The loop is the single-model
    round protocol of docs/architecture.md §1 with inference replaced by a lookup,
    :func:`certeval.engine.replay_once`; with ``record_curve`` it also records
    (n_scored, mean, lower, upper) after every look (the report's interval curve).
    ``controller_s`` is the whole loop's time (a replay has no inference).
    """
    scores = np.asarray(scores, dtype=float)
    if scores.shape != (spec.n_items,):
        raise InputError(f"scores must hold one value per bank item ({spec.n_items}), got shape {scores.shape}")
    batch_size = check_positive_int(replay.batch_size, "batch_size")
    truth = bank_truth(spec, scores)

    curve: list[tuple[int, float, float, float]] = []

    def record(est: Any) -> None:
        curve.append((int(est.n_scored), float(est.mean), float(est.lower), float(est.upper)))

    t0 = time.perf_counter()
    est, decision = replay_once(replace(replay, batch_size=batch_size), spec, scores, rng,
                                on_look=record if record_curve else None)
    return RepResult(
        n_scored=int(est.n_scored), mean=float(est.mean), lower=float(est.lower), upper=float(est.upper),
        truth=truth, reached=bool(decision.reached), rule=decision.rule,
        looks=len(curve) if record_curve else math.ceil(est.n_scored / batch_size),
        anytime_valid=bool(est.anytime_valid), controller_s=time.perf_counter() - t0,
        curve=tuple(curve), n_distinct=_n_distinct(est), verdict=decision.verdict,
    )


def _n_distinct(est: Any) -> int | None:
    value = dict(est.extra).get("n_distinct")
    return None if value is None else int(value)


# --------------------------------------------------------------------------------------
# seeds
# --------------------------------------------------------------------------------------


def _stable_int(text: str) -> int:
    return zlib.crc32(text.encode("utf-8")) & 0xFFFFFFFF


def rep_seed(root_seed: int, dataset: str, model: str, method: str, rep: int) -> np.random.SeedSequence:
    """The seed of one rep, keyed by what the rep *is* (never by when or where it runs)."""
    key = (_stable_int(dataset), _stable_int(model), _stable_int(method), int(rep))
    return np.random.SeedSequence(int(root_seed), spawn_key=key)


# --------------------------------------------------------------------------------------
# cells and chunks
# --------------------------------------------------------------------------------------


CERTIFY = "certify"  # one model replayed until its goal decides (replay_one)
PAIRED = "paired"  # one paired run (compare / rank / select) of the models in Cell.rows
FAQ_BUDGET = "faq-budget"  # FAQ beside uniform sampling at fixed budgets (the FAQ paper's experiment)
CELL_KINDS = (CERTIFY, PAIRED, FAQ_BUDGET)


@dataclass(frozen=True)
class Cell:
    """One table cell of a backtest: a method at a goal on a dataset, over ``reps`` reps.

    Rep ``r`` evaluates model ``models[r % len(models)]`` with its own seed, so reps spread
    evenly over the evaluated models; a ``paired`` cell's rep runs the models ``rows`` (every
    model when None) together under ``request`` (a :class:`~certeval.estimators.groups.GroupRequest`).
    """

    dataset: str
    method: str
    goal: str
    reps: int
    batch_size: int
    params: tuple[tuple[str, Any], ...] = ()
    label: str = ""  # display name (defaults to method); lets one method appear with two settings
    max_items: int | None = None  # item budget per rep (faq: its own draw cap)
    kind: str = CERTIFY
    rows: tuple[int, ...] | None = None  # paired: the dataset's matrix rows run together (None: all)
    request: Any = None  # paired: the GroupRequest (its labels are filled in from rows)
    history_fraction: float | None = None  # paired: each rep's random share of the rows that is history, not run
    # paired: rep r draws its order as the live run with --seed (root seed + r) does (certeval backtest COMMAND),
    # instead of from rep_seed
    live_order: bool = False

    def __post_init__(self) -> None:
        if self.kind not in CELL_KINDS:
            raise InputError(f"cell kind must be one of {', '.join(CELL_KINDS)}; got {self.kind!r}")
        if (self.kind == PAIRED) != (self.request is not None):
            raise InputError(f"a paired cell needs a request and only a paired cell takes one; got kind "
                             f"{self.kind!r} with request {self.request!r}")
        if self.live_order and (self.kind != PAIRED or self.history_fraction is not None):
            raise InputError(f"live_order applies to a paired cell without a history share; got kind {self.kind!r} "
                             f"with history_fraction {self.history_fraction!r}")

    @property
    def name(self) -> str:
        return self.label or self.method


@dataclass
class DatasetArrays:
    """What a worker needs to replay one dataset: the bank spec and a models × items score matrix.

    ``faq`` holds FAQ's inputs from the history half when :func:`dataset_arrays` was asked for them:
    ``item_factors`` (N×K, bank order), ``prior_mean`` (K) and ``prior_cov`` (K×K).
    """

    name: str
    spec: BankSpec
    models: tuple[str, ...]
    matrix: np.ndarray  # (n_models, n_items)
    notes: dict[str, Any] = field(default_factory=dict)
    faq: dict[str, np.ndarray] | None = None
    history: Any = None  # HistoryPrior fitted on the history half (method 'history')
    specs: dict[str, BankSpec] | None = None  # per-model bank specs (per-model item features), else ``spec``
    # method 'history' with a history per rep: (model, the rep's history seed) -> HistoryPrior (in-process only)
    history_for: Callable[[str, np.random.SeedSequence], Any] | None = None


# --------------------------------------------------------------------------------------
# FAQ (Wu et al. 2026, arXiv:2601.20251) cells: arrays come from the dataset, never from Cell.params
# --------------------------------------------------------------------------------------

FAQ_METHOD = "faq"
# Cell.params key for FAQ cells, and the default label of each choice:
#   "history": the dataset's fitted factors (FAQ itself);
#   "mean":    one constant factor, so the posterior learns only the model's overall accuracy — the
#              same-guarantee baseline (FAQ's estimator and interval, nothing learnt about items);
#   "none":    zero factors, p̂ = 1/2 for ever (a constant plug-in; its interval's variance is then
#              pinned at the worst case 1/4 for 0/1 scores, a weaker baseline kept for comparison).
FAQ_FACTORS_KEY = "factors"
FAQ_LABELS = {"history": "faq", "mean": "faq-uniform", "none": "faq-uniform-half"}
FAQ_FACTORS = tuple(FAQ_LABELS)
# prior sd 2 on the logit of the overall accuracy: σ(±4) spans 0.02…0.98
MEAN_FACTOR_PRIOR_VAR = 4.0
# FAQ draws with replacement: a replay may draw up to this many times the bank size (a re-drawn item's
# score is cached, so the cost stays the distinct items; after 10·N draws all but e^-10 of them are scored)
FAQ_MAX_DRAWS_PER_ITEM = 10


def faq_cell(dataset: str, goal: str, reps: int, batch_size: int, *, factors: str = "history",
             label: str | None = None, **params: Any) -> Cell:
    """A FAQ cell; ``factors`` picks FAQ (``history``) or a baseline (``mean``, ``none``), see FAQ_LABELS."""
    if factors not in FAQ_FACTORS:
        raise InputError(f"factors must be one of {', '.join(FAQ_FACTORS)}; got {factors!r}")
    return Cell(dataset, FAQ_METHOD, goal, reps, batch_size,
                tuple(sorted({FAQ_FACTORS_KEY: factors, **params}.items())), label or FAQ_LABELS[factors])


def uninformative_factors(n_items: int, kind: str = "mean") -> dict[str, np.ndarray]:
    """FAQ inputs that say nothing about items: every item gets the same p̂, so the policy is
    q_j = (1−τ) w_j + τ/N (exactly 1/N when every w_j = 1/N, where φ_s = z_s: the plain sample mean).

    ``kind="mean"``: one factor equal to 1 for every item; p̂ = σ(μ) follows the model's overall
    accuracy as scores arrive (a predictable plug-in), so the interval's variance adapts to it.
    ``kind="none"``: zero factors; p̂ = σ(0) = 1/2 whatever is observed (v = 0 leaves the posterior
    unchanged), so the plug-in is the constant 1/2.
    """
    if kind == "mean":
        return {"item_factors": np.ones((int(n_items), 1)), "prior_mean": np.zeros(1),
                "prior_cov": np.full((1, 1), MEAN_FACTOR_PRIOR_VAR)}
    if kind == "none":
        return {"item_factors": np.zeros((int(n_items), 1)), "prior_mean": np.zeros(1), "prior_cov": np.ones((1, 1))}
    raise InputError(f"kind must be 'mean' or 'none'; got {kind!r}")


def faq_planned_draws(goal: Goal, spec: BankSpec, confidence: float = 0.95) -> int:
    """Where FAQ's anytime confidence sequence is tuned to be tightest, fixed before the run.

    The Gaussian-mixture CS (Waudby-Smith et al. 2024) is time-uniform only for a mixing parameter
    chosen in advance. For ``halfwidth:E`` we take the number of draws at which the CS, tuned there,
    reaches E under the worst-case variance of uniform sampling (FAQ's ``pseudo_var``) — at most the
    replay's cap of ``FAQ_MAX_DRAWS_PER_ITEM``·N draws; other goals use the bank size.
    """
    from certeval.estimators.faq.querying import anytime_radius

    n_items = spec.n_items
    if goal.kind != "halfwidth":
        return int(n_items)
    worst_var = 0.25 * n_items * float(np.sum(spec.weights() ** 2))
    # tuned at n, the radius is C·σ/√n with C = anytime_radius(n=1, var=1, planned_n=1)
    c = float(anytime_radius(np.array(1.0), np.array(1.0), 1.0 - float(confidence), 1.0))
    return int(min(FAQ_MAX_DRAWS_PER_ITEM * n_items, max(2, math.ceil(worst_var * (c / goal.value) ** 2))))


def faq_params(data: DatasetArrays, cell: Cell, goal: Goal) -> dict[str, Any]:
    """The keyword arguments of the ``faq`` method for one cell: the cell's own (small) params plus the arrays.

    Defaults for a stop-when-the-goal-is-met replay: ``ci="anytime"`` (it peeks at every look, so the
    fixed-budget intervals are not valid there) and ``budget`` = :func:`faq_planned_draws`.
    """
    params = dict(cell.params)
    factors = params.pop(FAQ_FACTORS_KEY, "history")
    if factors not in FAQ_FACTORS:
        raise InputError(f"{FAQ_FACTORS_KEY} must be one of {', '.join(FAQ_FACTORS)}; got {factors!r}")
    for key in ("item_factors", "prior_mean", "prior_cov"):
        if key in params:
            raise InputError(f"a faq cell must not carry {key!r} in its params: the arrays come from the "
                             f"dataset (dataset_arrays(..., faq=FaqFit()))")
    if factors != "history":
        arrays = uninformative_factors(data.spec.n_items, factors)
    elif data.faq is None:
        raise InputError(f"dataset {data.name!r} was loaded without FAQ inputs; load it with "
                         f"dataset_arrays({data.name!r}, faq=FaqFit())")
    else:
        arrays = data.faq
    params.setdefault("ci", "anytime")
    params.setdefault("budget", faq_planned_draws(goal, data.spec, params.get("confidence", 0.95)))
    return {**params, **arrays}


HISTORY_METHOD = "history"
HISTORY_PERMUTE_KEY = "permute"  # Cell.params: shuffle the history's items in every rep (useless history)


def history_cell(dataset: str, goal: str, reps: int, batch_size: int, *, permute: bool = False,
                 label: str | None = None) -> Cell:
    """A ``history`` cell: the dataset's history prior, or (``permute``) the same with its items shuffled."""
    params = ((HISTORY_PERMUTE_KEY, True),) if permute else ()
    # per-subset intervals are not what a cell measures: only the estimand's confidence sequence runs
    params = params + (("subset_intervals", False),)
    return Cell(dataset, HISTORY_METHOD, goal, reps, batch_size, params,
                label or ("history-permuted" if permute else "history"))


def history_spec(data: DatasetArrays, permute: bool, seed: np.random.SeedSequence) -> BankSpec:
    """The rep's bank spec with the dataset's history prior (items shuffled by ``seed`` when ``permute``)."""
    if data.history is None:
        raise InputError(f"dataset {data.name!r} was loaded without history; load it with "
                         f"dataset_arrays({data.name!r}, history=True)")
    prior = data.history.permuted(np.random.default_rng(seed)) if permute else data.history
    return replace(data.spec, history=prior)


def _chunks(cell: Cell, chunk_reps: int) -> list[tuple[int, int]]:
    return [(a, min(a + chunk_reps, cell.reps)) for a in range(0, cell.reps, chunk_reps)]


def certify_rows(data: DatasetArrays, cell: Cell, rep_lo: int, rep_hi: int, root_seed: int,
                 record_curve: bool = False, record_errors: bool = False) -> list[dict[str, Any]]:
    """Replay reps ``rep_lo..rep_hi-1`` of a ``certify`` cell.

    With ``record_errors`` an exception inside a method becomes a row with an ``error`` field
    (benchmarks report it) instead of aborting the whole run.
    """
    goal = parse_goal(cell.goal)
    params = faq_params(data, cell, goal) if cell.method == FAQ_METHOD else dict(cell.params)
    permute = bool(params.pop(HISTORY_PERMUTE_KEY, False))
    max_draws = FAQ_MAX_DRAWS_PER_ITEM * data.spec.n_items if cell.method == FAQ_METHOD else cell.max_items
    rows = []
    for rep in range(rep_lo, rep_hi):
        model_idx = rep % len(data.models)
        model = data.models[model_idx]
        seed = rep_seed(root_seed, data.name, model, cell.name, rep)
        rng = np.random.default_rng(seed)
        spec = data.spec if data.specs is None else data.specs[model]
        head = {"dataset": data.name, "method": cell.name, "goal": cell.goal, "rep": rep, "model": model,
                "n_items": data.spec.n_items}
        if cell.method == HISTORY_METHOD and data.history_for is not None:
            prior = data.history_for(model, seed.spawn(1)[0])
            spec = replace(spec, history=prior)
            head["history_models"] = int(prior.n_models)
        elif cell.method == HISTORY_METHOD:
            spec = history_spec(data, permute, seed.spawn(1)[0])
        try:
            res = replay_one(Replay(cell.method, params, goal, cell.batch_size, max_draws), spec,
                             data.matrix[model_idx], rng, record_curve=record_curve)
        except InputError:
            raise
        except Exception as exc:  # a method's own bug: recorded per rep so one cell cannot sink a benchmark
            if not record_errors:
                raise
            rows.append({**head, "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows.append({**head, **res.to_dict(with_curve=record_curve)})
    return rows
