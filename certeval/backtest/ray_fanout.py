"""Backtests at cluster scale: reps × models × methods fanned out over Ray (issue 6, item 1).

A backtest replays recorded scores: for each (model, method, rep) a method is run on one
model's score vector with the round protocol (``propose → update → result → goal.decide``)
until its goal is met or the bank is exhausted, and the stopping point is compared with the
bank's true mean. One pure function, :func:`replay_one`, does one rep; the in-process path
and the Ray path both call it, so they return identical numbers.

Seeds: every rep draws from ``np.random.SeedSequence(root_seed, spawn_key=key)`` with
``key`` derived from ``(dataset, model, method, rep)`` only — never from the order in which
tasks run — so a result does not depend on scheduling, chunking or the number of workers.

Ray: local by default (``ray.init(address="local", num_cpus=2, include_dashboard=False)``
with the loopback environment of :mod:`certeval.envsetup`); pass ``ray_address`` for any
cluster. Tasks are chunks of reps of one (dataset, method, goal) cell; the score matrix goes
to the object store once per dataset.

FAQ (seed 002) needs arrays — item factors and a prior fitted on the history half — that do not
belong in a cell's small JSON-able params: they travel with the dataset (``DatasetArrays.faq``,
``dataset_arrays(..., faq=True)``) and :func:`faq_params` joins them to a ``faq`` cell at replay time.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import numpy as np

from ..estimators import BankSpec, make_method, parse_goal
from ..estimators._validation import InputError, check_positive_int
from ..estimators.goals import Goal

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
    """The estimand of a bank-target method: the (mean-of-means weighted) bank mean, seed 004 eq. 1."""
    return float(spec.weights() @ np.asarray(scores, dtype=float))


def replay_one(
    method: str,
    params: dict[str, Any],
    spec: BankSpec,
    scores: np.ndarray,
    goal: Goal,
    batch_size: int,
    rng: np.random.Generator,
    *,
    max_items: int | None = None,
    record_curve: bool = False,
) -> RepResult:
    """Run one method on one model's recorded scores until its goal decides (pure, no I/O).

    ``scores[i]`` is the recorded score of bank position ``i``. The loop is the single-model
    round protocol of DESIGN §1 with inference replaced by a lookup,
    :func:`certeval.engine.replay_once`; with ``record_curve`` it also records
    (n_scored, mean, lower, upper) after every look (the report's interval curve).
    ``controller_s`` is the whole loop's time (a replay has no inference).
    """
    scores = np.asarray(scores, dtype=float)
    if scores.shape != (spec.n_items,):
        raise InputError(f"scores must hold one value per bank item ({spec.n_items}), got shape {scores.shape}")
    batch_size = check_positive_int(batch_size, "batch_size")
    truth = bank_truth(spec, scores)
    from ..engine import replay_once  # the pipeline's own round engine, inference by lookup

    curve: list[tuple[int, float, float, float]] = []

    def record(est: Any) -> None:
        curve.append((int(est.n_scored), float(est.mean), float(est.lower), float(est.upper)))

    t0 = time.perf_counter()
    est, decision = replay_once(method, params, spec, scores, goal, batch_size, max_items, rng,
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


@dataclass(frozen=True)
class Cell:
    """One table cell of a backtest: a method at a goal on a dataset, over ``reps`` reps.

    Rep ``r`` evaluates model ``models[r % len(models)]`` with its own seed, so reps spread
    evenly over the evaluated models.
    """

    dataset: str
    method: str
    goal: str
    reps: int
    batch_size: int
    params: tuple[tuple[str, Any], ...] = ()
    label: str = ""  # display name (defaults to method); lets one method appear with two settings
    max_items: int | None = None  # item budget per rep (faq: its own draw cap)

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
# FAQ (seed 002) cells: arrays come from the dataset, never from Cell.params
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
    from ..estimators.faq import anytime_radius

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
                             f"dataset (dataset_arrays(..., faq=True))")
    if factors != "history":
        arrays = uninformative_factors(data.spec.n_items, factors)
    elif data.faq is None:
        raise InputError(f"dataset {data.name!r} was loaded without FAQ inputs; load it with "
                         f"dataset_arrays({data.name!r}, faq=True)")
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


def run_chunk(data: DatasetArrays, cell: Cell, rep_lo: int, rep_hi: int, root_seed: int,
              record_curve: bool = False, record_errors: bool = False) -> list[dict[str, Any]]:
    """Replay reps ``rep_lo..rep_hi-1`` of a cell; rows are JSON-able dicts (one per rep).

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
            res = replay_one(cell.method, params, spec, data.matrix[model_idx], goal, cell.batch_size, rng,
                             record_curve=record_curve, max_items=max_draws)
        except InputError:
            raise
        except Exception as exc:  # a method's own bug: recorded per rep so one cell cannot sink a benchmark
            if not record_errors:
                raise
            rows.append({**head, "error": f"{type(exc).__name__}: {exc}"})
            continue
        rows.append({**head, **res.to_dict(with_curve=record_curve)})
    return rows


# --------------------------------------------------------------------------------------
# Ray
# --------------------------------------------------------------------------------------


@contextlib.contextmanager
def ray_session(address: str | None = None, num_cpus: int = 2, state_dir: str | Path | None = None) -> Iterator[Any]:
    """Start (or join) Ray on loopback and shut it down afterwards if we started it.

    ``address=None`` starts a private local instance (``address="local"``); any other
    address joins that cluster. While ``ray.init`` runs, HOME points at a folder holding
    ``ray_bootstrap_config.yaml`` so Ray's usage-stats module never probes cloud metadata
    (NOTES.md).
    """
    from ..envsetup import configure_offline_env, ray_bootstrap_home

    configure_offline_env()
    import ray

    if ray.is_initialized():
        yield ray
        return
    try:  # the pipeline's own start-up (auth token pinning, worker HOME) when present
        from ..backends.pool import init_ray
    except ImportError:
        init_ray = None
    if init_ray is not None:
        init_ray(address, num_cpus=num_cpus, state_dir=state_dir)
    else:
        base = Path(state_dir) if state_dir is not None else Path(tempfile.gettempdir()) / "certeval-ray"
        home = ray_bootstrap_home(base)
        old_home = os.environ.get("HOME")
        os.environ["HOME"] = str(home)
        try:
            if address is None:
                ray.init(address="local", num_cpus=num_cpus, include_dashboard=False,
                         object_store_memory=200 * 1024 * 1024, log_to_driver=False)
            else:
                ray.init(address=address, log_to_driver=False)
        finally:
            if old_home is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = old_home
    try:
        yield ray
    finally:
        ray.shutdown()


def _ray_chunk(data: DatasetArrays, cell: Cell, lo: int, hi: int, root_seed: int, record_curve: bool,
               record_errors: bool):
    import os

    # one BLAS thread per task: Ray already runs one task per core
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    return run_chunk(data, cell, lo, hi, root_seed, record_curve, record_errors)


ProgressFn = Callable[[int, int, str], None]


def print_progress(done: int, total: int, what: str) -> None:
    """Default progress: one line on stderr per finished chunk."""
    print(f"[backtest] {done}/{total} chunks ({what})", file=sys.stderr, flush=True)


def run_cells(
    datasets: dict[str, DatasetArrays],
    cells: Sequence[Cell],
    root_seed: int,
    *,
    use_ray: bool = False,
    ray_address: str | None = None,
    num_cpus: int = 2,
    chunk_reps: int = 25,
    record_curve: bool = False,
    record_errors: bool = False,
    progress: ProgressFn | None = None,
    on_rows: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """Run every cell's reps in-process or on Ray; rows come back sorted by (cell order, rep). ``on_rows``
    sees each finished chunk's rows as they come (progress lines)."""
    chunk_reps = check_positive_int(chunk_reps, "chunk_reps")
    jobs = [(ci, lo, hi) for ci, cell in enumerate(cells) for lo, hi in _chunks(cell, chunk_reps)]
    total = len(jobs)
    results: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for cell in cells:
        if cell.dataset not in datasets:
            raise InputError(f"cell names dataset {cell.dataset!r}, not among {sorted(datasets)}")
    if not use_ray:
        for done, (ci, lo, hi) in enumerate(jobs, 1):
            cell = cells[ci]
            results[(ci, lo)] = run_chunk(datasets[cell.dataset], cell, lo, hi, root_seed, record_curve, record_errors)
            if on_rows:
                on_rows(results[(ci, lo)])
            if progress:
                progress(done, total, f"{cell.dataset}/{cell.name}/{cell.goal}")
    else:
        with ray_session(ray_address, num_cpus=num_cpus) as ray:
            remote = ray.remote(num_cpus=1, max_retries=1)(_ray_chunk)
            refs_data = {name: ray.put(d) for name, d in datasets.items()}
            pending = {}
            for ci, lo, hi in jobs:
                cell = cells[ci]
                ref = remote.remote(refs_data[cell.dataset], cell, lo, hi, root_seed, record_curve, record_errors)
                pending[ref] = (ci, lo)
            done = 0
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    ci, lo = pending.pop(ref)
                    results[(ci, lo)] = ray.get(ref)
                    done += 1
                    if on_rows:
                        on_rows(results[(ci, lo)])
                    if progress:
                        cell = cells[ci]
                        progress(done, total, f"{cell.dataset}/{cell.name}/{cell.goal}")
    rows: list[dict[str, Any]] = []
    for key in sorted(results):
        rows.extend(results[key])
    return rows


# --------------------------------------------------------------------------------------
# summaries and storage
# --------------------------------------------------------------------------------------


def _wilson(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for a coverage proportion (Wilson 1927)."""
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


# The uniform-sampling method with the same kind of guarantee as each method: Cer-Eval is
# compared with Seq (both adaptive-Hoeffding, seed 000 §6), adaptive with uniform (same betting CS).
# FAQ is compared with itself on uninformative factors (same PAI estimator, same asymptotic anytime CS).
SAME_GUARANTEE_BASELINE = {"adaptive": "uniform", "uniform": "uniform", "cer-eval": "seq", "seq": "seq",
                           "static": "static", "faq": "faq-uniform", "faq-uniform": "faq-uniform",
                           "faq-uniform-half": "faq-uniform", "history": "uniform", "history-permuted": "uniform"}


def _cost(g: Any) -> np.ndarray:
    """Model calls per rep: distinct items scored. Equal to ``n_scored`` for methods drawing without
    replacement; a with-replacement method (faq) re-draws items whose score is already cached."""
    draws = g["n_scored"].to_numpy(float)
    if "n_distinct" not in g:
        return draws
    distinct = g["n_distinct"].to_numpy(float)
    return np.where(np.isnan(distinct), draws, distinct)


def summarise(rows: Iterable[dict[str, Any]], baseline: str = "uniform",
              same_guarantee: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Per (dataset, method, goal): mean items, ratios to baselines on the same reps, coverage.

    A ratio is mean items of the method over mean items of the baseline at the same goal on
    the same dataset (same models and reps); ``saving = 1 - ratio``. ``items_ratio_vs_uniform``
    uses ``baseline``; ``items_ratio_same_guarantee`` uses the uniform-order method with the same
    guarantee type (:data:`SAME_GUARANTEE_BASELINE`).

    Items are model calls (:func:`_cost`): distinct items scored; ``mean_draws`` counts draws. A rep
    that stopped without meeting its goal (bank exhausted, or a with-replacement method at its cap on
    draws) counts what it scored — a lower bound on what it needed — and not in ``reached_rate``;
    ``rules`` counts how reps stopped.
    """
    same_guarantee = SAME_GUARANTEE_BASELINE if same_guarantee is None else same_guarantee
    import pandas as pd

    frame = pd.DataFrame(list(rows))
    if frame.empty:
        return []
    if "error" not in frame.columns:
        frame["error"] = None
    out = []
    for (dataset, method, goal), g_all in frame.groupby(["dataset", "method", "goal"], sort=False):
        errors = g_all[g_all["error"].notna()]
        g = g_all[g_all["error"].isna()]
        n = len(g)
        if n == 0:
            out.append({"dataset": dataset, "method": method, "goal": goal, "reps": 0, "errors": len(errors),
                        "first_error": str(errors["error"].iloc[0])})
            continue
        covered = int(g["covered"].sum())
        n_items = _cost(g)
        base = frame[(frame["dataset"] == dataset) & (frame["method"] == baseline) & (frame["goal"] == goal)
                     & frame["error"].isna()]
        ratio = float(n_items.mean() / _cost(base).mean()) if len(base) else None
        sg_name = same_guarantee.get(str(method).split("@")[0], baseline)
        sg = frame[(frame["dataset"] == dataset) & (frame["method"] == sg_name) & (frame["goal"] == goal)
                   & frame["error"].isna()]
        ratio_sg = float(n_items.mean() / _cost(sg).mean()) if len(sg) else None
        lo, hi = _wilson(covered, n)
        out.append({
            "dataset": dataset, "method": method, "goal": goal, "reps": n,
            "mean_items": float(n_items.mean()), "median_items": float(np.median(n_items)),
            "mean_draws": float(g["n_scored"].mean()),
            "sd_items": float(n_items.std(ddof=1)) if n > 1 else 0.0,
            "n_items": int(g["n_items"].iloc[0]) if "n_items" in g else None,
            "fraction_of_bank": float((n_items / g["n_items"].to_numpy(float)).mean()) if "n_items" in g else None,
            "items_ratio_vs_uniform": ratio, "saving_vs_uniform": None if ratio is None else 1.0 - ratio,
            "same_guarantee_baseline": sg_name, "items_ratio_same_guarantee": ratio_sg,
            # a baseline that ran out of bank before its goal makes the ratio censored, not a saving
            "same_guarantee_reached_rate": float(sg["reached"].mean()) if len(sg) else None,
            "coverage": covered / n, "coverage_ci95": [lo, hi],
            "reached_rate": float(g["reached"].mean()),
            "mean_abs_error": float((g["mean"] - g["truth"]).abs().mean()),
            "mean_halfwidth": float(g["halfwidth"].mean()),
            "anytime_valid": bool(g["anytime_valid"].all()),
            "controller_s_per_rep": float(g["controller_s"].mean()),
            "rules": {str(k): int(v) for k, v in g["rule"].fillna("none").value_counts().items()},
            "errors": len(errors),
        })
    return out


def store_backtest(output: str | Path, config: dict[str, Any], rows: list[dict[str, Any]],
                   summary: list[dict[str, Any]]) -> str:
    """Store a backtest like any run (DESIGN §5) with :mod:`certeval.storage` (atomic writes).

    ``<output>/config.json`` (what was asked), ``<output>/reps.parquet`` (one row per rep),
    ``<output>/results.json`` (``kind: backtest`` and the per-cell summary). ``output`` is a
    local folder or any fsspec URL. Returns the folder's URL.
    """
    import pandas as pd

    from ..storage import Folder, filesystem

    fs, path = filesystem(str(output))
    folder = Folder(fs, path)
    table = pd.DataFrame([{k: v for k, v in r.items() if k != "curve"} for r in rows])
    folder.write_json("config.json", config)
    folder.write_parquet("reps.parquet", table)
    folder.write_json("results.json", {"kind": "backtest", "cells": summary, "n_reps_total": len(rows)})
    return folder.url()


# --------------------------------------------------------------------------------------
# datasets: recorded scores → arrays, with leak-free item features from "history" models
# --------------------------------------------------------------------------------------


def history_features(history: np.ndarray, n_features: int = 8) -> np.ndarray:
    """Item features from other models' recorded scores (a stand-in for text embeddings).

    Columns: each item's mean score over the history models, then the leading right-singular
    vectors (scaled by their singular values) of the centred history matrix — the item side of
    a low-rank factor model, as in FAQ (seed 002) — standardised to unit variance. Items whose
    history is all-correct or all-wrong land together, which is what Cer-Eval's 1-NN partition
    needs to separate easy from hard items.
    """
    hist = np.asarray(history, dtype=float)
    item_mean = hist.mean(axis=0)
    centred = hist - hist.mean(axis=1, keepdims=True)
    k = max(0, min(n_features - 1, min(centred.shape) - 1))
    cols = [item_mean[:, None]]
    if k > 0:
        # SVD through the smaller Gram matrix (eigh): cheap for 2k × 500 and 6 × 42k alike
        if centred.shape[0] <= centred.shape[1]:
            evals, u = np.linalg.eigh(centred @ centred.T)
            top = np.argsort(evals)[::-1][:k]
            sing = np.sqrt(np.clip(evals[top], 0, None))
            item_side = centred.T @ u[:, top]  # = V_k * S_k
        else:
            evals, v = np.linalg.eigh(centred.T @ centred)
            top = np.argsort(evals)[::-1][:k]
            sing = np.sqrt(np.clip(evals[top], 0, None))
            item_side = v[:, top] * sing
        cols.append(item_side)
    feats = np.hstack(cols)
    sd = feats.std(axis=0)
    sd[sd == 0] = 1.0
    return (feats - feats.mean(axis=0)) / sd


def fit_faq_inputs(history: np.ndarray, item_ids: Sequence[str], *, seed: int = 0,
                   cache: str | Path | None = None, tag: str = "history",
                   fit_params: dict[str, Any] | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """FAQ's inputs from a history matrix: the logistic factor model of seed 002, its item factors and prior.

    ``fit_params`` are :class:`~certeval.estimators.factor_model.FactorModel` arguments (default: K and λ
    by 3-fold cross-validation with the 1-SE rule, as ``benchmarks/faq.py`` fits them); the fit starts
    from ``np.random.default_rng(seed)``. With ``cache`` (a folder) the fit is stored there as
    ``<tag>_<digest>.npz`` (arrays only, never pickled) with a ``.json`` of its fit info; the digest
    hashes the history, the item ids, the seed and ``fit_params``, so only an identical fit is reused.
    Returns ``(arrays, info)``: ``item_factors``, ``prior_mean``, ``prior_cov`` and a JSON-able summary.
    """
    import hashlib
    import json

    from ..estimators.factor_model import FactorModel, factor_prior
    from ..storage import dumps
    from .faq import load_factor_model, save_factor_model

    hist = np.asarray(history, dtype=float)
    ids = [str(i) for i in item_ids]
    if hist.ndim != 2 or hist.shape[1] != len(ids):
        raise InputError(f"history must be a models × items matrix with {len(ids)} items, got shape {hist.shape}")
    fit_params = dict(fit_params or {})
    try:
        template = FactorModel(**fit_params)
    except TypeError as exc:
        raise InputError(f"fit_params are FactorModel arguments: {exc}") from None
    path = None
    if cache is not None:
        digest = hashlib.sha256()
        digest.update(np.ascontiguousarray(hist).tobytes())
        digest.update("\x1f".join(ids).encode("utf-8"))
        digest.update(json.dumps({"seed": int(seed), "shape": list(hist.shape), **fit_params}, sort_keys=True,
                                 default=str).encode("utf-8"))
        path = Path(cache) / f"{tag}_{digest.hexdigest()[:16]}.npz"
    info: dict[str, Any]
    if path is not None and path.is_file():
        fm, cached_ids, _ = load_factor_model(path)
        side = path.with_suffix(".json")
        info = {**(json.loads(side.read_text()) if side.is_file() else {}), "cached": path.name}
        if cached_ids != ids:  # same digest, different items: cannot happen unless the file was replaced
            raise InputError(f"cached factor model {str(path)!r} does not match the bank's items; delete it")
    else:
        t0 = time.perf_counter()
        fm = template.fit(hist, rng=np.random.default_rng(int(seed)))
        cv = fm.cv_.to_dict() if fm.cv_ is not None else None
        info = {"fit_s": time.perf_counter() - t0, "fit_params": fit_params or "K, λ by 3-fold CV (1-SE rule)",
                "cv_factor_grid": cv and cv["factor_grid"], "cv_penalty_grid": cv and cv["penalty_grid"],
                "cv_mean_loss": cv and cv["mean_loss"], "cv_se_loss": cv and cv["se_loss"], "final_fit": fm.fit_info_, "seed": int(seed),
                "history_shape": list(hist.shape), "cached": False}
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            save_factor_model(path, fm, ids)
            tmp = path.with_suffix(".json.tmp")
            tmp.write_bytes(dumps(info))
            tmp.replace(path.with_suffix(".json"))
    mean, cov = factor_prior(fm.model_factors_)
    info = {**info, "n_factors": int(fm.item_factors_.shape[1]), "penalty": float(fm.penalty_)}
    return {"item_factors": np.asarray(fm.item_factors_, dtype=float), "prior_mean": mean, "prior_cov": cov}, info


def dataset_arrays(name: str, *, n_features: int = 8, split_seed: int = 0,
                   max_eval_models: int | None = None, mean_of_means: bool = True,
                   models: Sequence[str] | None = None, features: bool = True, faq: bool = False,
                   faq_cache: str | Path | None = None, faq_fit: dict[str, Any] | None = None,
                   history: bool = False) -> DatasetArrays:
    """Load ``bundled:<name>``; split models into history (features) and evaluated halves.

    The evaluated models never contribute to the features their own reps use. With
    ``features=False`` (methods that need none) no split is made: every model, or those named
    in ``models``, is evaluated — unless ``faq`` asks for FAQ's inputs, which also come from
    the history half (:func:`fit_faq_inputs` with ``faq_cache`` and ``faq_fit``; it costs a
    factor-model fit, seconds to minutes, hence opt-in).
    ``mean_of_means`` picks the estimand: the mean of sub-dataset means (seed 004, eq. 1) or
    the plain bank mean (every item weighs 1/N, as in seed 000's experiments).
    """
    from ..banks import bank_from_scores, load_scores, score_matrix

    frame = load_scores(f"bundled:{name}" if ":" not in name and "/" not in name else name)
    bank = bank_from_scores(frame)
    all_models = sorted(frame["model"].unique())
    if models is not None:
        missing = [m for m in models if m not in set(all_models)]
        if missing:
            raise InputError(f"unknown model {missing[0]!r} in {name!r}; it has {len(all_models)} models")
    if not features and not faq and not history:
        eval_models = list(models) if models is not None else all_models
        if max_eval_models is not None:
            eval_models = eval_models[:max_eval_models]
        label = name.split(":")[-1]
        return DatasetArrays(
            name=label, spec=bank.spec(mean_of_means=mean_of_means), models=tuple(eval_models),
            matrix=score_matrix(frame, eval_models, bank),
            notes={"n_models": len(all_models), "n_eval_models": len(eval_models), "n_items": bank.n_items,
                   "n_subsets": int(bank.spec().n_subsets), "features": "none",
                   "estimand": "mean of sub-dataset means" if mean_of_means else "bank mean"})
    order = np.random.default_rng(split_seed).permutation(len(all_models))
    n_hist = max(1, len(all_models) // 2)
    hist_models = [all_models[i] for i in order[:n_hist]]
    eval_models = [all_models[i] for i in sorted(order[n_hist:])]
    if models is not None:  # named models: evaluate those, features from every other model
        wanted = set(models)
        hist_models = [m for m in all_models if m not in wanted]
        eval_models = list(models)
        if not hist_models:
            raise InputError("item features come from models not being evaluated; name fewer models")
    if max_eval_models is not None:
        eval_models = eval_models[:max_eval_models]
    hist = score_matrix(frame, hist_models, bank)
    feats = history_features(hist, n_features) if features else None
    matrix = score_matrix(frame, eval_models, bank)
    label = name.split(":")[-1]
    notes = {"n_models": len(all_models), "n_history_models": len(hist_models), "n_eval_models": len(eval_models),
             "n_items": bank.n_items, "n_subsets": int(bank.spec().n_subsets),
             "estimand": "mean of sub-dataset means" if mean_of_means else "bank mean",
             "features": "none" if feats is None else
             f"history item factors: mean score + {feats.shape[1] - 1} SVD components over "
             f"{len(hist_models)} held-out models (no text embeddings)"}
    faq_arrays = None
    if faq:
        tag = f"{label}_split{split_seed}" + ("" if models is None else "_named")
        faq_arrays, info = fit_faq_inputs(hist, bank.item_ids, seed=split_seed, cache=faq_cache, tag=tag,
                                          fit_params=faq_fit)
        notes["faq"] = {"factor_model": f"logistic factor model (seed 002) on {len(hist_models)} history models "
                                        f"× {bank.n_items} items", **info}
    prior = None
    if history:
        from ..history import matrix_prior

        prior = matrix_prior(hist, hist_models, sources=(f"bundled:{label}",))
        notes["history"] = {"models": len(hist_models), "n_factors": prior.n_factors,
                            "prior": "history item means + ridge on SVD item factors (certeval.estimators.history)"}
    return DatasetArrays(
        name=label,
        spec=bank.spec(features=feats, mean_of_means=mean_of_means),
        models=tuple(eval_models),
        matrix=matrix,
        notes=notes,
        faq=faq_arrays,
        history=prior,
    )


def backtest(
    scores: str,
    method: str,
    goal: str,
    reps: int,
    seed: int,
    *,
    params: dict[str, Any] | None = None,
    batch_size: int = 20,
    baseline: str | None = "uniform",
    use_ray: bool = True,
    ray_address: str | None = None,
    output: str | None = None,
    models: Sequence[str] | None = None,
    mean_of_means: bool = True,
    progress: ProgressFn | None = print_progress,
) -> dict[str, Any]:
    """One-call backtest of ``method`` (and the ``baseline`` at the same goal) on a scores file.

    Reps cycle over ``models`` (default: every model; for a method that needs item features,
    the half of the models not used to build them — see :func:`dataset_arrays`).

    This is what ``certeval backtest --ray`` should call. Returns ``{"cells": summary, "url": ...}``.
    """
    parse_goal(goal)
    reps = check_positive_int(reps, "reps")
    needs = bool(getattr(make_method(method, **(params or {})), "needs_features", False))
    data = dataset_arrays(scores, models=models, features=needs, mean_of_means=mean_of_means)
    methods = [method] + ([baseline] if baseline and baseline != method else [])
    cells = [Cell(data.name, m, goal, reps, batch_size, tuple(sorted((params or {}).items())) if m == method else ())
             for m in methods]
    rows = run_cells({data.name: data}, cells, seed, use_ray=use_ray, ray_address=ray_address, progress=progress)
    summary = summarise(rows, baseline=baseline or method)
    url = None
    if output:
        config = {"kind": "backtest", "scores": scores, "method": method, "params": params or {}, "goal": goal,
                  "reps": reps, "seed": seed, "batch_size": batch_size, "baseline": baseline,
                  "ray": bool(use_ray), "ray_address": ray_address, "dataset": data.notes}
        url = store_backtest(output, config, rows, summary)
    return {"cells": summary, "url": url}
