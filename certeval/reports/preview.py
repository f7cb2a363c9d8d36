"""Cost preview: ``certeval rank|select --dry-run --history SOURCE`` predicts, before any model call, the fraction of
the model × item cells the ranking or selection will score.

The request is played on recorded models instead of the user's: each simulated run draws ``min(M, H)`` of the H
history models that have a score for every bank item (never one of the user's own models), a fresh shared item
order, and runs the same group estimator (statement, margin or ε, goal, confidence, look size, budget) through
the engine until it stops. The prediction is the median fraction over the simulated runs, with their range. It
is a prediction from other models, not a guarantee: a leaderboard whose models sit closer together than the
history's needs more cells, and fewer history models than M play a sparser board (said in the output).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from certeval.errors import InputError
from certeval.estimators.validation import check_positive_int

PREVIEW_KINDS = ("rank", "select")


@dataclass(frozen=True)
class CostPreview:
    """Fractions of the cells scored by ``reps`` simulated runs, and what they were simulated on."""

    kind: str
    statement: str
    n_models: int  # the user's models
    n_items: int
    history_models: int  # recorded models usable as stand-ins (complete on the bank, not the user's)
    simulated_models: int  # drawn per simulated run: min(n_models, history_models)
    fractions: tuple[float, ...]
    seed: int

    @property
    def fraction(self) -> float:
        """The prediction: the median over the simulated runs."""
        return float(np.median(self.fractions))

    @property
    def cells(self) -> int:
        """Predicted model calls: the fraction of the user's M × N cells."""
        return int(round(self.fraction * self.n_models * self.n_items))

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.update(fractions=list(self.fractions), fraction=self.fraction, fraction_low=min(self.fractions),
                   fraction_high=max(self.fractions), cells=self.cells, total_cells=self.n_models * self.n_items,
                   note=self.note())
        return out

    def note(self) -> str:
        text = ("a prediction from recorded models played in place of yours, not a guarantee; the run itself "
                "keeps its own statistical guarantee whatever it costs")
        if self.kind == "select":
            text += ("; a selection's cost hinges on the gap between your best models, which recorded models only "
                     "hint at (on four leaderboards the preview missed by up to 0.07, benchmarks/results/preview.json)")
        if self.simulated_models < self.n_models:
            text += (f"; only {self.history_models} recorded models were usable, so the runs were simulated with "
                     f"{self.simulated_models} models (a denser board of {self.n_models} usually needs more cells)")
        return text


def history_matrix(frame: Any, item_ids: Sequence[str], exclude: set[str]) -> tuple[np.ndarray, list[str]]:
    """Rows of the recorded models (long table ``model, item_id, score``) complete on ``item_ids``, but those named
    in ``exclude`` (the user's own models: a model never stands in for itself)."""
    frame = frame[frame["item_id"].isin(set(item_ids)) & ~frame["model"].isin(exclude)]
    pivot = frame.pivot(index="model", columns="item_id", values="score").reindex(columns=list(item_ids))
    complete = pivot.notna().all(axis=1)
    pivot = pivot[complete]
    return pivot.to_numpy(dtype=float), [str(m) for m in pivot.index]


def preview_cost(request: Any, spec: Any, matrix: np.ndarray, n_models: int, *, reps: int = 10,
                 seed: int = 0) -> CostPreview:
    """Play ``request`` (a :class:`~certeval.estimators.groups.GroupRequest` for the user's ``n_models`` models)
    ``reps`` times on recorded models (``matrix``: history models × the bank's items), through the one backtest
    driver: simulated run ``r`` is a paired cell of the models drawn for it, seeded by ``(seed, r)``."""
    from certeval.backtests.cells import PAIRED, Cell, DatasetArrays
    from certeval.backtests.ray_fanout import run_cells

    reps = check_positive_int(reps, "reps")
    h, n = matrix.shape
    if request.kind not in PREVIEW_KINDS:
        raise InputError(f"a cost preview is for {' and '.join(PREVIEW_KINDS)}; got {request.kind!r}")
    if h < 2:
        raise InputError(f"a cost preview needs at least 2 recorded models with a score for every one of the "
                         f"bank's {n} items (not your own models); the history has {h}")
    k = min(int(n_models), h)
    pick = np.random.default_rng(np.random.SeedSequence([int(seed), h, k]))
    models = tuple(f"history-{r}" for r in range(h))
    asked = replace(request, history={})
    datasets, cells = {}, []
    for rep in range(reps):  # each simulated run its own dataset name, so its own seed, whatever models it draws
        name = f"preview-{rep}"
        datasets[name] = DatasetArrays(name, spec, models, matrix)
        rows = tuple(int(r) for r in np.sort(pick.choice(h, size=k, replace=False)))
        cells.append(Cell(name, request.kind, request.kind, 1, request.look_size, max_items=request.max_items,
                          kind=PAIRED, rows=rows, request=asked))
    fractions = tuple(float(row["fraction_used"]) for row in run_cells(datasets, cells, int(seed)))
    return CostPreview(kind=request.kind, statement=_statement(request), n_models=int(n_models), n_items=n,
                       history_models=h, simulated_models=k, fractions=fractions, seed=int(seed))


def check_sources(kind: str, sources: Sequence[str]) -> None:
    """A preview plays a rank or select request on the recorded models its history names: it needs some."""
    if kind not in PREVIEW_KINDS:
        raise InputError(f"a cost preview is for {' and '.join(PREVIEW_KINDS)}; got {kind!r}")
    if not sources:
        raise InputError(f"{kind} --dry-run predicts the cells from recorded models: give --history SOURCE "
                         "(a scores file, bundled:<name>, run folders)")


def preview_request(request: Any, *, reps: int = 10) -> CostPreview:
    """The cost preview of a rank or select request (:mod:`certeval.requests`): validated like the run without its
    history (:func:`~certeval.runs.plan.make_plan`), then played on the recorded models its history names."""
    from certeval.runs.plan import make_plan

    sources = list(request.history or ())
    check_sources(request.kind, sources)
    plan, prepared = make_plan(replace(request, history=()))
    return preview_plan(plan, prepared, sources, reps=reps)


def preview_plan(plan: Any, prepared: Any, sources: Sequence[str], *, reps: int = 10) -> CostPreview:
    """A validated plan (:func:`~certeval.runs.plan.make_plan`, without history) played on the recorded models of
    ``sources``; a history that shares no item or no complete model with the bank is refused naming --history."""
    from certeval.inputs.history import load_history
    from certeval.inputs.model_spec import parse_model_spec

    history = load_history(list(sources))
    named = ", ".join(repr(s) for s in sources)
    bank_ids = set(prepared.bank.item_ids)
    if not history.frame["item_id"].isin(bank_ids).any():
        raise InputError(f"--history {named} shares no item with the bank ({len(bank_ids)} items, e.g. "
                         f"{next(iter(prepared.bank.item_ids))!r}): nothing to preview on")
    own = {spec.name for spec in map(parse_model_spec, plan.models) if spec.kind == "replay" and spec.name}
    matrix, _ = history_matrix(history.frame, prepared.bank.item_ids, set(plan.labels) | own)
    try:
        return preview_cost(plan.group_request(), prepared.bank.spec(mean_of_means=plan.mean_of_means), matrix,
                            len(plan.labels), reps=reps, seed=plan.seed)
    except InputError as exc:
        raise InputError(f"--history {named}: {exc}") from None


def _statement(request: Any) -> str:
    if request.kind == "select" and request.target == "distribution":
        who = "every model" if request.mode == "precision" else "the best model"
        what = f"{who} above {request.threshold or 0:g}, to ±{request.halfwidth or 0:g}"
    elif request.kind == "select":
        what = f"top-{request.top or 1} within {request.halfwidth or 0:g}"
    elif request.epsilon is not None:
        what = f"epsilon-correct order (epsilon {request.epsilon:g})"
    elif request.precision is not None:
        what = f"every model within ±{request.precision:g}"
    else:
        what = f"strict verdicts at margin {request.margin:g}"
    return f"{what}, {request.target} target"


def describe(preview: CostPreview) -> str:
    """The console lines of a preview."""
    p = preview
    return "\n".join([
        f"cost preview ({p.kind}, {p.statement}; no model was called, nothing was written):",
        f"  {p.fraction:.2f} of the cells (range {min(p.fractions):.2f}–{max(p.fractions):.2f} over "
        f"{len(p.fractions)} simulated runs) ≈ {p.cells:,} of {p.n_models * p.n_items:,} model calls",
        f"  simulated with {p.simulated_models} of {p.history_models} recorded models complete on the bank's "
        f"{p.n_items} items",
        f"  {p.note()}",
    ])
