"""certeval as the statistics inside an Inspect AI eval: an ``EarlyStopping`` manager.

::

    from inspect_ai import Task
    from inspect_ai.scorer import accuracy, stderr
    from certeval.harnesses.inspect_early_stopping import CertevalStopping

    dataset.shuffle(seed=7)  # in place (it returns None: never inside Task(...))
    stopping = CertevalStopping(goal="halfwidth:0.05", confidence=0.95)
    Task(dataset=dataset, solver=..., scorer=..., early_stopping=stopping,
         metrics=[accuracy(), stderr(), stopping.interval()])  # the certified interval in Inspect's results

Inspect decides which sample runs next; an ``EarlyStopping`` manager can only skip the samples that have not
started. So certeval's interval must hold whatever the stopping time, and its target is the mean score over
the task's whole dataset (the bank): ``method`` is ``uniform`` (a without-replacement betting confidence
sequence, anytime-valid) or ``seq`` (Cer-Eval's Seq bound, i.i.d. view). Both assume the samples run in a
uniformly random order: **shuffling the dataset is the user's part** (``dataset.shuffle(seed=…)``). An eval in
the file's own order (sorted by difficulty, by source, …) gets an interval that does not mean what it says.

Scores are absorbed in the order samples were *scheduled*, not the order they finished: a sample that is
slow because it is hard (and wrong) cannot bias the interval. A finished sample waits until every sample
scheduled before it has finished. When the goal is met, every sample not yet started is skipped; samples
already running still finish and are absorbed (an anytime-valid interval may absorb more). At the end the
estimate, interval, guarantee and decision go into the log's ``results.early_stopping.metadata``, and
:meth:`CertevalStopping.interval` is an Inspect metric that puts the interval (``certeval_lower``,
``certeval_upper``, ``certeval_estimate``) in the eval's results and console beside accuracy ± stderr — the
± there is Inspect's classical standard error, not a certified interval. A dataset Inspect reports as not
shuffled gets a warning (and ``dataset_shuffled: false`` in the metadata).

A sample that ends in an error never reports a score (Inspect calls ``complete_sample`` for scored samples
only), and its score could have been anything: nothing scheduled after it is absorbed, so the eval then runs on
without stopping early, and ``not_absorbed`` in the metadata counts what was left out. (Inspect's default
``fail_on_error`` ends the eval at the first error anyway; with ``retry_on_error`` a retried sample reports.)

Scores are read from one scorer (``scorer``; default the first) and mapped to [0, 1] with Inspect's value
semantics (``C``/``I``/``P``/``N``, booleans, numbers; :func:`certeval.harnesses.readers.score_value`). One epoch only:
with several epochs the target would be a mean over epochs, which the betting sequence does not track here.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from certeval.errors import InputError
from certeval.estimators import BankSpec, method_for_goal, parse_goal
from certeval.estimators.validation import check_confidence

from .readers import score_value

STOPPING_METHODS = ("uniform", "seq")  # valid whatever order-independent stopping time Inspect imposes


class CertevalStopping:
    """Stop an Inspect eval once certeval's goal is met (see the module docstring).

    Parameters
    ----------
    goal : ``halfwidth:E`` (interval half-width at most E), ``above:T`` or ``below:T`` (interval clear of T).
    confidence : confidence level of the interval, fixed before any sample runs (default 0.95).
    method : ``uniform`` (default; exact for the dataset's mean) or ``seq``.
    scorer : name of the scorer whose value is tracked (default: the first scorer of each sample).
    min_samples : never stop before this many samples were absorbed (default 0).
    """

    def __init__(self, goal: str = "halfwidth:0.05", confidence: float = 0.95, method: str = "uniform",
                 scorer: str | None = None, min_samples: int = 0) -> None:
        self.goal = goal
        self.confidence = confidence
        self.method = method
        self.scorer = scorer
        self.min_samples = min_samples
        self.check()  # refused when made, before any Inspect eval starts

    # -- validation (before any sample runs) ------------------------------------------------
    def check(self) -> CertevalStopping:
        """Validate the parameters, each by its type and range (one-line errors naming the parameter and echoing
        its value); called when the manager is made and again by ``start_task``."""
        if not isinstance(self.goal, str):
            raise InputError(f"goal must be text such as 'halfwidth:0.05', got {self.goal!r}")
        parse_goal(self.goal)  # its refusals name the goal and echo it
        if isinstance(self.confidence, bool) or not isinstance(self.confidence, (int, float)):
            raise InputError(f"confidence must be a number in (0, 1), got {self.confidence!r} "
                             f"(a {type(self.confidence).__name__})")
        check_confidence(self.confidence)
        if not isinstance(self.method, str) or self.method not in STOPPING_METHODS:
            raise InputError(f"method must be one of {', '.join(STOPPING_METHODS)} inside Inspect (it decides "
                             f"the order); got {self.method!r}")
        if self.scorer is not None and (not isinstance(self.scorer, str) or not self.scorer):
            raise InputError(f"scorer must be a scorer's name (text) or None, got {self.scorer!r}")
        if isinstance(self.min_samples, bool) or not isinstance(self.min_samples, int) or self.min_samples < 0:
            raise InputError(f"min_samples must be a non-negative integer, got {self.min_samples!r}")
        return self

    # -- Inspect's EarlyStopping protocol ---------------------------------------------------
    async def start_task(self, task: Any, samples: list, epochs: int) -> str:
        self.check()
        if epochs != 1:
            raise InputError(f"certeval's early stopping tracks one epoch per sample; got epochs={epochs!r}")
        if not samples:
            raise InputError("the task has no samples")
        ids = [s.id if s.id is not None else i + 1 for i, s in enumerate(samples)]
        self.position_ = {str(sid): i for i, sid in enumerate(ids)}
        if len(self.position_) != len(ids):
            raise InputError("the task's samples have duplicate ids")
        self.goal_ = parse_goal(self.goal)
        self.method_ = method_for_goal(self.method, self.goal_, confidence=self.confidence, target="bank")
        self.method_.start(BankSpec(n_items=len(ids), mean_of_means=False))
        self.task_name_ = str(getattr(task, "task", "task"))
        self.scheduled_: list[int] = []  # positions in scheduling order
        self.finished_: dict[int, float] = {}  # position -> score, waiting for its turn
        self.absorbed_ = 0  # how many of scheduled_ are absorbed
        self.skipped_ = 0
        self.stopped_at_: int | None = None  # items absorbed when the goal was first met
        self.decision_ = self.goal_.decide(self.method_.result())
        self.shuffled_ = getattr(getattr(task, "dataset", None), "shuffled", None)
        if self.shuffled_ is False:
            warnings.warn(f"certeval early stopping on task {self.task_name_!r}: Inspect reports the dataset as not "
                          "shuffled; the interval assumes a uniformly random order (dataset.shuffle(seed=...) "
                          "before Task(...))", UserWarning, stacklevel=2)
        return f"certeval {self.method} {self.goal_}"

    async def schedule_sample(self, id: str | int, epoch: int):
        from inspect_ai.util import EarlyStop

        if self.stopped_at_ is not None:
            self.skipped_ += 1
            if self.skipped_ > 1:  # the interval is in the first skip and in the task's summary, not in every one
                return EarlyStop(id=id, epoch=epoch, reason="certeval: goal met")
            est = self.method_.result()
            return EarlyStop(id=id, epoch=epoch, reason=f"certeval: {self.decision_.detail}",
                             metadata={"estimate": est.mean, "lower": est.lower, "upper": est.upper,
                                       "n_scored": est.n_scored})
        self.scheduled_.append(self._position(id))
        return None

    async def complete_sample(self, id: str | int, epoch: int, scores: dict) -> None:
        where = f"sample {id!r}"
        if not scores:
            raise InputError(f"{where} has no score; certeval's early stopping needs a scorer")
        name = self.scorer or next(iter(scores))
        if name not in scores:
            raise InputError(f"{where} has no scorer {name!r}; scorers there: {', '.join(scores)}")
        self.finished_[self._position(id)] = score_value(scores[name].score.value, f"{where}, scorer {name!r}")
        self._absorb_ready()

    async def complete_task(self) -> dict[str, Any]:
        self._absorb_ready()
        return self.summary()

    def interval(self) -> Any:
        """An Inspect metric (for ``Task(metrics=[...])`` or a scorer's metrics) reporting this manager's
        certified interval and estimate over the samples it absorbed, so they show in Inspect's results."""
        from inspect_ai.scorer import metric

        manager = self

        @metric(name="certeval")
        def certeval_interval() -> Any:
            def compute(scores: list) -> dict[str, float]:
                manager._absorb_ready()
                est = manager.method_.result()
                return {"certeval_estimate": float(est.mean), "certeval_lower": float(est.lower),
                        "certeval_upper": float(est.upper)}

            return compute

        return certeval_interval()

    # -- internals ----------------------------------------------------------------------------
    def _position(self, id: str | int) -> int:
        try:
            return self.position_[str(id)]
        except KeyError:
            raise InputError(f"sample id {id!r} was not in the task's dataset") from None

    def _absorb_ready(self) -> None:
        """Absorb finished samples in scheduling order, up to the first one still running."""
        ready = []
        while self.absorbed_ < len(self.scheduled_) and self.scheduled_[self.absorbed_] in self.finished_:
            pos = self.scheduled_[self.absorbed_]
            ready.append((pos, self.finished_.pop(pos)))
            self.absorbed_ += 1
        if not ready:
            return
        items, values = map(np.asarray, zip(*ready))
        self.method_.update(items.astype(np.int64), values.astype(float))
        est = self.method_.result()
        self.decision_ = self.goal_.decide(est)
        if self.stopped_at_ is None and self.decision_.reached and est.n_scored >= self.min_samples:
            self.stopped_at_ = est.n_scored

    def summary(self) -> dict[str, Any]:
        """What goes into the log's early-stopping metadata (JSON values only)."""
        est = self.method_.result()
        out = {
            "certeval": True, "task": self.task_name_, "goal": str(self.goal_), "method": self.method,
            "confidence": self.confidence, "target": "mean score over the task's whole dataset",
            "estimate": est.mean, "lower": est.lower, "upper": est.upper, "halfwidth": est.halfwidth,
            "n_scored": est.n_scored, "n_total": self.method_.bank_.n_items, "anytime_valid": est.anytime_valid,
            "guarantee": est.guarantee, "reached": bool(self.decision_.reached), "verdict": self.decision_.verdict,
            "rule": self.decision_.rule, "detail": self.decision_.detail, "stopped_at": self.stopped_at_,
            "skipped": self.skipped_, "scorer": self.scorer,
            "not_absorbed": len(self.scheduled_) - self.absorbed_,
            "order": "valid when the dataset runs in a uniformly random order (shuffle it); absorbed in "
                     "scheduling order", "dataset_shuffled": self.shuffled_,
        }
        return {k: (None if isinstance(v, float) and not np.isfinite(v) else v) for k, v in out.items()}
