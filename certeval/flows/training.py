"""Checkpoint selection from a training loop: each saved checkpoint certified as it is written, learning from the
earlier ones, and a valid statement when the newest is not better than the best so far.

:func:`certify_checkpoint` is the plain function any training loop calls after it saves a checkpoint (a
transformers-format folder, or a model spec); :class:`certeval.flows.trainer_callback.CheckpointCertifier` calls it
from ``transformers.Trainer``'s ``on_save``. For the k-th checkpoint it is given (in the order given):

1. **certify** (run ``ckpt-<name>``, :func:`certeval.flows.checkpoints.checkpoint_run`): the checkpoint's bank mean
   to ``goal`` (or until ``max_items``), with the certify runs of checkpoints 1..k−1 as ``--history`` (method
   ``history``: exact and anytime-valid whatever the history, so later checkpoints cost fewer items). Each interval
   is valid on its own at ``confidence``, not simultaneously over the checkpoints.
2. **compare** with the best so far (k ≥ 2; run ``vs-<name>-<best>``): a paired comparison on the bank's items,
   bank target (the exact without-replacement betting confidence sequence for the difference of the two bank
   means, with every certify run as history: ``compare --history``, docs/history.md), at confidence
   ``1 − α_j``, ``α = 1 − confidence`` and ``α_j = α / (j (j + 1))`` for the j-th comparison (j = k − 1).
   Verdict with ``margin`` D: ``a>b`` (the newest is better by more than D), ``b>a`` (worse by more than D) or
   ``equivalent`` (within D); the newest is **certifiably not better** than the best so far when the verdict is
   ``b>a`` or ``equivalent``: its difference is below D. ``undecided`` at ``max_items`` says nothing.
3. ``checkpoints.json`` in ``output`` (replaced atomically): :class:`CheckpointsRecord`, every checkpoint's interval,
   items scored, history used and comparison, and the best so far.

Why the verdicts hold together over the whole training run (the multiple looks across checkpoints): comparison j
runs at level α_j with Σ_j α_j = α (1 − 1/(J+1)) < α for any number J of checkpoints, so by the union bound every
comparison's confidence sequence covers its pair's true bank difference at once with probability ≥ confidence —
whatever rule picks the best so far, because that rule (below) uses only what happened before comparison j, and
comparison j draws its items with its own seed (``seed + j``): given the past, its sequence covers with probability
≥ 1 − α_j (Waudby-Smith & Ramdas 2024; within a comparison its early stop is covered by anytime validity). So all
"not better" (and "better") statements of a training run are simultaneously right with probability ≥ confidence,
at the bank target (the bank's own items, not a population of items). Comparing disjoint certify intervals
instead would need the intervals simultaneous (Bonferroni over checkpoints) and wastes the pairing.

The best so far is the first checkpoint, then after each comparison the newest when its estimated difference is
positive (certifiably so when the verdict is ``a>b``), else the earlier best.

The one call into certeval's run machinery is :func:`_run`: a validated request, run live (Prefect flow, Ray
actors), its results returned.
"""

from __future__ import annotations

import logging
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from certeval.errors import InputError
from certeval.estimators.validation import check_confidence, check_in_range
from certeval.inputs.model_fingerprint import MEMO_DIR, fingerprint_models
from certeval.inputs.model_spec import parse_model_spec, quote_location
from certeval.record.results import RunResults, read_record
from certeval.runs.plan import claim_run, make_plan
from certeval.runtime.options import runtime_options

from ..estimators import parse_goal
from ..requests import Certify, Compare
from ..storage import Folder, filesystem, safe_name
from .checkpoints import checkpoint_run
from .pipeline import run_plan

RECORD_FILE = "checkpoints.json"
RECORD_KIND = "training-checkpoints"
SCHEMA_VERSION = 1
NOT_BETTER = ("b>a", "equivalent")  # compare's verdicts (model a: the newest) that put the newest below best + D
SPENDING = "alpha_j = alpha / (j (j + 1)) for the j-th comparison with the best so far"
logger = logging.getLogger("certeval.training")


@dataclass(frozen=True)
class CheckpointCertification:
    """How each checkpoint is certified; checked on construction (InputError naming the field, echoing the value).

    ``bank``: the items (a bank file, ``bundled:trivia``, an lm-eval task ``lm-eval:<task>``; None only when every
    checkpoint is a ``replay:`` spec); ``output``: the folder of the runs and ``checkpoints.json`` (the callback's
    default: ``<output_dir>/certeval``); ``goal``, ``confidence``, ``batch_size``, ``max_items``, ``seed``,
    ``scorer``, ``ray_address``, ``num_cpus``, ``num_gpus``: as ``certeval certify``'s flags; ``margin``: the D of
    the comparisons' verdicts; ``history``: further ``--history`` sources beside the earlier checkpoints;
    ``stop_after``: the callback stops training once this many checkpoints in a row were certifiably not better
    than the best so far (None: never); ``options``: :class:`~certeval.runtime.options.RuntimeOptions` fields.
    """

    bank: str | None
    output: str | None = None
    goal: str = "halfwidth:0.05"
    confidence: float = 0.95
    margin: float = 0.0
    batch_size: int = 50
    max_items: int | None = None
    seed: int = 0
    scorer: str | None = None
    history: tuple[str, ...] = ()
    ray_address: str | None = None
    num_cpus: int | None = None
    num_gpus: float = 0.0
    stop_after: int | None = None
    options: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.bank is not None and (not isinstance(self.bank, str) or not self.bank.strip()):
            raise InputError(f"bank must name a bank (a file, bundled:trivia, lm-eval:<task>), got {self.bank!r}")
        if self.output is not None and (not isinstance(self.output, (str, os.PathLike)) or not str(self.output)):
            raise InputError(f"output must name a folder, got {self.output!r}")
        object.__setattr__(self, "output", None if self.output is None else str(self.output))
        object.__setattr__(self, "goal", str(parse_goal(self.goal)))
        object.__setattr__(self, "confidence", check_confidence(self.confidence))
        margin = check_in_range(self.margin, "margin", 0.0, 1.0)
        if margin >= 1.0:
            raise InputError(f"margin must lie in [0, 1), got {self.margin!r}")
        object.__setattr__(self, "margin", margin)
        if self.stop_after is not None and (isinstance(self.stop_after, bool) or not isinstance(self.stop_after, int)
                                            or self.stop_after < 1):
            raise InputError(f"stop_after must be a positive integer or None, got {self.stop_after!r}")
        if isinstance(self.history, (str, os.PathLike)):
            raise InputError(f"history must be a list of sources, got the single string {self.history!r}")
        object.__setattr__(self, "history", tuple(str(h) for h in self.history))
        runtime_options(self.options)  # unknown or bad options: one line now, not at the first checkpoint


@dataclass(frozen=True)
class BestComparison:
    """The newest checkpoint (model a) against the best so far (model b): the paired difference of their bank
    means, its interval at ``confidence`` (α_j of the spending), the verdict and the items both scored."""

    best: str
    run_id: str
    confidence: float
    diff: float
    lower: float
    upper: float
    verdict: str
    n_items: int

    @property
    def not_better(self) -> bool:
        """Certifiably not better than the best so far (by more than the margin)."""
        return self.verdict in NOT_BETTER


@dataclass(frozen=True)
class CheckpointEntry:
    """One checkpoint: its certify run's interval (on its own at the record's confidence), the items it scored, the
    history models it learned from, its comparison with the best so far (None for the first), and the best so far
    once it was compared."""

    checkpoint: str
    spec: str
    step: int | None
    run_id: str
    mean: float
    lower: float
    upper: float
    n_scored: int
    method: str
    history_models: tuple[str, ...]
    comparison: BestComparison | None
    best: str

    @property
    def not_better(self) -> bool | None:
        """Whether it is certifiably not better than the best so far (None: the first checkpoint, nothing to beat)."""
        return None if self.comparison is None else self.comparison.not_better


@dataclass(frozen=True)
class CheckpointsRecord:
    """``checkpoints.json``: what the checkpoints were certified on and each checkpoint's entry, oldest first."""

    bank: str | None
    goal: str
    confidence: float
    margin: float
    checkpoints: tuple[CheckpointEntry, ...] = ()
    kind: str = RECORD_KIND
    schema_version: int = SCHEMA_VERSION

    @property
    def best(self) -> str | None:
        return self.checkpoints[-1].best if self.checkpoints else None

    def not_better_streak(self) -> int:
        """How many checkpoints in a row, up to the newest, were certifiably not better than the best so far."""
        streak = 0
        for entry in reversed(self.checkpoints):
            if not entry.not_better:
                break
            streak += 1
        return streak

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        for entry, obj in zip(out["checkpoints"], self.checkpoints):
            entry["not_better"] = obj.not_better
            entry["history_models"] = list(obj.history_models)
        out.update(best=self.best, spending=SPENDING,
                   note="each interval is valid on its own at the confidence; the comparisons are valid together")
        return out

    @classmethod
    def from_json(cls, data: Any, where: str) -> CheckpointsRecord:
        """A stored record; anything else (another kind, a newer schema, missing fields) refused in one line."""
        if not isinstance(data, dict) or data.get("kind") != RECORD_KIND:
            kind = data.get("kind") if isinstance(data, dict) else type(data).__name__
            raise InputError(f"{where} is not a certeval training-checkpoints record (kind {kind!r})")
        if data.get("schema_version") != SCHEMA_VERSION:
            raise InputError(f"{where} has schema_version {data.get('schema_version')!r}; this certeval reads "
                             f"{SCHEMA_VERSION}")
        try:
            entries = tuple(_entry(e) for e in data["checkpoints"])
            return cls(bank=data["bank"], goal=data["goal"], confidence=data["confidence"], margin=data["margin"],
                       checkpoints=entries)
        except (AttributeError, KeyError, TypeError) as exc:
            raise InputError(f"{where} is damaged (missing or bad field {exc}); certify into another output") from None


def _entry(data: dict[str, Any]) -> CheckpointEntry:
    known = {f.name for f in fields(CheckpointEntry)}
    values = {k: v for k, v in data.items() if k in known}
    comparison = values.get("comparison")
    values["comparison"] = None if comparison is None else BestComparison(
        **{k: v for k, v in comparison.items() if k in {f.name for f in fields(BestComparison)}})
    values["history_models"] = tuple(values["history_models"])
    return CheckpointEntry(**values)


def read_checkpoints(output: str) -> CheckpointsRecord | None:
    """The ``checkpoints.json`` of ``output`` (None when there is none yet)."""
    folder = Folder(*filesystem(output))
    data = folder.read_json(RECORD_FILE)
    return None if data is None else CheckpointsRecord.from_json(data, folder.url(RECORD_FILE))


def checkpoint_spec(checkpoint: str | os.PathLike) -> str:
    """A checkpoint as a model spec: a local folder is ``hf:<absolute path>``, or the spec its ``model.spec``
    holds (one line, as in a checkpoint folder of :func:`certeval.flows.checkpoints.find_checkpoints`); a spec
    (``hf:``, ``vllm:``, ``replay:``...) is kept as given."""
    text = os.fspath(checkpoint)
    if os.path.isdir(text):
        written = os.path.join(text, "model.spec")
        if os.path.isfile(written):
            with open(written, encoding="utf-8") as handle:
                return parse_model_spec(handle.read().strip()).text
        return f"hf:{quote_location(os.path.abspath(text))}"
    if ":" not in text:
        raise InputError(f"checkpoint {text!r} is neither a folder nor a model spec (kind:location)")
    return parse_model_spec(text).text


def certify_checkpoint(checkpoint: str | os.PathLike, settings: CheckpointCertification,
                       step: int | None = None) -> CheckpointEntry:
    """Certify a newly saved checkpoint with the earlier ones as history, compare it with the best so far, and
    record it in ``checkpoints.json`` (see the module docstring for what each number claims). A checkpoint already
    recorded on the same files returns its entry again (nothing is scored); the same name on other files (an earlier
    training run writing into the same output) is refused in one line."""
    if settings.output is None:
        raise InputError("certify_checkpoint needs settings.output: the folder of the runs and checkpoints.json")
    spec = checkpoint_spec(checkpoint)
    label = parse_model_spec(spec).label
    output = settings.output
    record = read_checkpoints(output) or CheckpointsRecord(settings.bank, settings.goal, settings.confidence,
                                                           settings.margin)
    _check_same_question(record, settings, output)
    [fingerprint] = fingerprint_models([parse_model_spec(spec)], runtime_options(settings.options).cache_path()
                                       / MEMO_DIR)
    run_id, changed = checkpoint_run(output, spec, fingerprint)
    earlier = next((e for e in record.checkpoints if e.checkpoint == label), None)
    if earlier is not None:
        if earlier.run_id == run_id and changed is None:
            return earlier
        raise InputError(f"checkpoint {label!r} is already in {output}/{RECORD_FILE} with other files (an earlier "
                         "training run?); certify this run's checkpoints into another output")
    if changed is not None:  # a run of this name on other files (no entry): certified anew, said why
        logger.info("certeval: %s", changed)
    sources = list(settings.history) + [_run_folder(output, e.run_id) for e in record.checkpoints]
    certified = _run(_request(settings, Certify, [spec], run_id, sources))
    [model] = certified.models
    comparison, best = None, label
    if record.checkpoints:
        best_entry = next(e for e in record.checkpoints if e.checkpoint == record.best)
        comparison = _compare(settings, spec, best_entry, len(record.checkpoints), sources + [_run_folder(output, run_id)])
        best = label if comparison.diff > 0 else best_entry.checkpoint
    entry = CheckpointEntry(
        checkpoint=label, spec=spec, step=step, run_id=run_id, mean=model.mean, lower=model.lower,
        upper=model.upper, n_scored=model.n_scored, method=model.method,
        history_models=tuple((model.history or {}).get("models", [])), comparison=comparison, best=best)
    record = replace(record, checkpoints=record.checkpoints + (entry,))
    Folder(*filesystem(output)).write_json(RECORD_FILE, record.to_json())
    logger.info("certeval: %s", describe(entry, settings.confidence))
    return entry


def describe(entry: CheckpointEntry, confidence: float) -> str:
    """One line: the checkpoint's interval and, from the second on, its comparison with the best so far."""
    line = (f"checkpoint {entry.checkpoint}: mean {entry.mean:.4f} in [{entry.lower:.4f}, {entry.upper:.4f}] "
            f"({confidence:.0%}, {entry.n_scored} items, method {entry.method})")
    c = entry.comparison
    if c is not None:
        said = ("certifiably not better than" if c.not_better else "certifiably better than" if c.verdict == "a>b"
                else "not yet separated from")
        line += (f"; {said} the best so far {c.best} (difference {c.diff:+.4f} in [{c.lower:.4f}, {c.upper:.4f}] at "
                 f"{c.confidence:.4g}, {c.n_items} items); best so far: {entry.best}")
    return line


def comparison_confidence(confidence: float, j: int) -> float:
    """The level of the j-th comparison with the best so far: 1 − α / (j (j + 1)) (the α_j sum to less than α)."""
    if isinstance(j, bool) or not isinstance(j, int) or j < 1:
        raise InputError(f"the comparison's number must be a positive integer, got {j!r}")
    return 1.0 - (1.0 - confidence) / (j * (j + 1))


def _compare(settings: CheckpointCertification, spec: str, best: CheckpointEntry, j: int,
             sources: list[str]) -> BestComparison:
    run_id = f"vs-{safe_name(parse_model_spec(spec).label)}-{safe_name(best.checkpoint)}"
    request = replace(_request(settings, Compare, [spec, best.spec], run_id, sources),
                      margin=settings.margin, confidence=comparison_confidence(settings.confidence, j),
                      seed=settings.seed + j)
    pair = _run(request).pairs[0]
    return BestComparison(best=best.checkpoint, run_id=run_id, confidence=request.confidence, diff=pair.diff,
                          lower=pair.lower, upper=pair.upper, verdict=pair.verdict, n_items=pair.n_items)


def _request(settings: CheckpointCertification, kind: type[Certify] | type[Compare], models: list[str], run_id: str,
             history: list[str]) -> Certify | Compare:
    goal = {"goal": settings.goal} if kind is Certify else {}  # a comparison's goal is its verdict
    return kind(models=models, bank=settings.bank, output=settings.output, run_id=run_id,
                confidence=settings.confidence, batch_size=settings.batch_size,
                max_items=settings.max_items, seed=settings.seed, scorer=settings.scorer,
                history=history or None, ray_address=settings.ray_address, num_cpus=settings.num_cpus,
                num_gpus=settings.num_gpus, options=settings.options, **goal)


def _run(request: Certify | Compare) -> RunResults:
    """The one call into certeval's runs: validate the request, claim its folder, run the flow; its record."""
    plan, prepared = make_plan(request)
    return read_record(run_plan(plan, prepared=prepared.claimed(claim_run(plan))), f"run {plan.run_id!r}")


def _run_folder(output: str, run_id: str) -> str:
    return f"{output.rstrip('/')}/{run_id}"


def _check_same_question(record: CheckpointsRecord, settings: CheckpointCertification, output: str) -> None:
    """The record's checkpoints were certified and compared on this bank, goal, level and margin (the spending
    holds for one question only)."""
    for name in ("bank", "goal", "confidence", "margin"):
        if getattr(record, name) != getattr(settings, name):
            raise InputError(f"{output}/{RECORD_FILE} was written with {name} {getattr(record, name)!r}, now "
                             f"{getattr(settings, name)!r}; certify into another output")
