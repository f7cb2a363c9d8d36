"""certeval's Python API: one request (:mod:`certeval.requests`), three verbs.

* :func:`run` asks the models live — the Prefect flow with the models hosted by Ray actors, what
  ``certeval certify|compare|rank|select`` does — and returns the run's record (:class:`RunResults`, results.json);
* :func:`backtest` plays the same request on recorded scores, ``reps`` times (rep ``r`` is the live run with seed
  ``seed + r``, so rep 0 makes the live run's decisions), each rep checked against the exact answer on the whole
  bank, as ``certeval backtest COMMAND`` does;
* :func:`preview` predicts what a ranking or selection will cost before any model is called, from recorded models
  (``--history``), as ``--dry-run`` does.

Every verb validates its request in the one step the command line uses (:func:`certeval.runs.plan.make_plan`):
bad input raises :class:`~certeval.errors.InputError` naming the field's flag and its value, before anything
starts or is written. The command line is a thin shell over these verbs; nothing here imports it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from certeval.backtests.reps import REP_TYPES, CertifyRep, ComparePair, RankRep, SelectRep
from certeval.record.results import RunResults
from certeval.reports.preview import CostPreview

from .requests import BacktestOptions, Request

__all__ = ["BacktestAnswer", "BacktestResult", "CertifyRep", "ComparePair", "CostPreview", "RankRep", "RunResults",
           "SelectRep", "backtest", "preview", "run", "run_plan_live"]

# what a live run adds to its results.json record for the command line (not part of the record)
LIVE_EXTRAS = ("report", "samples_files")


@dataclass(frozen=True)
class BacktestAnswer:
    """The headline of a backtest: the fraction of the model x item cells scored (mean over reps) and the share
    of reps whose statement the exact bank answer contradicts, with what counts as an error."""

    fraction_used: float
    error_rate: float
    errors: str
    reps: int
    alpha: float


@dataclass(frozen=True)
class BacktestResult:
    """A request played on recorded scores. ``reps``: one typed entry per rep (:mod:`certeval.backtests.reps`;
    certify: :class:`CertifyRep`, per model its interval and items scored; rank: :class:`RankRep`, its tie groups,
    and rep 0's models, means and items used; select: :class:`SelectRep`, its selection and rep 0's per-model
    status) or, for compare, one :class:`ComparePair` per sampled pair of models; ``summary``: the means over reps;
    ``config``: what was played."""

    kind: str
    answer: BacktestAnswer
    reps: tuple[CertifyRep, ...] | tuple[ComparePair, ...] | tuple[RankRep, ...] | tuple[SelectRep, ...]
    summary: Mapping[str, Any]
    config: Mapping[str, Any]

    @classmethod
    def from_json(cls, out: Mapping[str, Any]) -> BacktestResult:
        """The typed result of ``certeval backtest COMMAND --json``'s object."""
        kind = out["config"]["command"]
        rows, entry = REP_TYPES[kind]
        return cls(kind=kind, answer=BacktestAnswer(**out["answer"]), reps=tuple(map(entry.from_dict, out[rows])),
                   summary=out["summary"], config=out["config"])

    def to_dict(self) -> dict[str, Any]:
        """The JSON object ``certeval backtest COMMAND --json`` prints (the inverse of :meth:`from_json`)."""
        return {REP_TYPES[self.kind][0]: [r.to_dict() for r in self.reps], "summary": dict(self.summary),
                "answer": asdict(self.answer), "config": dict(self.config)}


def run(request: Request, *, progress: str | None = None) -> RunResults:
    """Run ``request`` live and return its record (the run folder's results.json, also written there with
    report.md). ``progress``: ``"bars"`` or ``"lines"`` on stderr, None (default) for none. A run id that exists
    resumes its run."""
    from certeval.runs.plan import make_plan
    from certeval.runtime.envsetup import prepare_env, user_prefect_configured
    from certeval.runtime.options import runtime_options
    from certeval.runtime.startup import configure
    from certeval.services.up_down import shared_ray_address

    configure(runtime_options(request.options).startup_log)  # options: RuntimeOptions or a mapping of its fields
    request = replace(request, ray_address=shared_ray_address(request.ray_address))
    user_prefect = user_prefect_configured()  # before prepare_env picks the project-local Prefect home
    prepare_env()
    plan, prepared = make_plan(request)
    results = run_plan_live(plan, prepared, user_prefect=user_prefect, progress=progress,
                            log_samples=request.log_samples)
    return RunResults.from_json({k: v for k, v in results.items() if k not in LIVE_EXTRAS})


def run_plan_live(plan: Any, prepared: Any, *, user_prefect: bool, progress: str | None, log_samples: bool = False,
                  on_claimed: Callable[[Any], None] | None = None) -> dict[str, Any]:
    """A validated plan run live: the run folder claimed (its lock held throughout), Prefect, Ray and the model
    actors started side by side, the flow run, report.md written beside results.json. Returns results.json's
    object plus ``report`` (and ``samples_files`` with ``log_samples``). ``on_claimed(store)``: called once the
    run folder is claimed (the command line keeps a runtime failure's traceback there)."""
    import time

    from certeval.reports.run_report import write_report
    from certeval.runs.plan import claim_run
    from certeval.runs.progress import BARS, say
    from certeval.runs.results import record_report_phase
    from certeval.runtime.watchdog import start_watchdog
    from certeval.services.fast_start import prestart

    if not plan.options.parallel_start:  # --sequential-start (benchmarks/startup.py's "before")
        import certeval.flows.pipeline  # noqa: F401
    start_watchdog(plan.options)
    store = plan.store()
    store.acquire_lock()  # a run id in use stops here; held until the run ends (the flow reuses it)
    warm = None
    try:
        # a changed config of an existing run id stops here; nothing overwritten
        prepared = prepared.claimed(claim_run(plan))
        if on_claimed is not None:
            on_claimed(store)
        if progress == BARS:  # a terminal's first seconds can be silent otherwise (Prefect's server, Ray, models)
            say(f"certeval: {plan.kind} run {plan.run_id}: starting Prefect's server, Ray and the model hosts...")
        # Prefect's server, Ray and the actors start side by side (certeval.services.fast_start), then the flow adopts them
        warm = prestart(plan, user_prefect)
        from certeval.runtime.startup import mark

        from .flows.pipeline import run_plan

        warm.ready()
        mark("flow_calling")
        results = run_plan(plan, progress=progress, prepared=prepared)
        if log_samples:
            results["samples_files"] = _log_samples(plan, prepared.bank, results)
        # docs/architecture.md §5: report.md (+ PNG) beside results.json in the run folder
        began = time.perf_counter()
        results["report"] = write_report(results["run_folder"]).files.get("report.md")
        record_report_phase(store, results, time.perf_counter() - began)
    finally:
        if warm is not None:
            warm.close()
        store.release_lock()
    return results


def _log_samples(plan: Any, bank: Any, results: dict[str, Any]) -> list[str]:
    """``log_samples``: every scored item of the run, in lm-eval's samples format (certeval.harnesses.lm_eval_output)."""
    import time

    from certeval.harnesses.lm_eval_output import write_samples

    store = plan.store()
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S.000000", time.gmtime())
    record = RunResults.from_json({k: v for k, v in results.items() if k not in LIVE_EXTRAS})
    return write_samples(store.folder, record, store.read_rounds(), bank.frame, stamp)


def backtest(request: Request, *, scores: str, reps: int | None = None, seed: int | None = None,
             options: BacktestOptions | None = None) -> BacktestResult:
    """Play ``request`` on the recorded scores ``scores`` (a scores file or ``bundled:<name>``) ``reps`` times
    (default: :class:`~certeval.requests.BacktestOptions`'s); ``seed`` (default: the request's) is rep 0's, rep
    ``r`` plays ``seed + r``. The request's models are names of recorded models or ``replay:`` specs (none: every
    recorded model; compare: the first two by name). ``options``: what only a backtest asks (compare's sampled
    ``pairs``, rank and select's ``history_fraction``, the distribution target's ``statistic`` and ``spending``,
    rank's ``ranking``); its ``scores`` and ``reps`` are replaced by the arguments given here."""
    from certeval.backtests.commands import request_backtest

    if seed is not None:
        request = replace(request, seed=seed)
    options = replace(options or BacktestOptions(), scores=scores)
    if reps is not None:
        options = replace(options, reps=reps)
    return BacktestResult.from_json(request_backtest(request, options))


def preview(request: Request, *, reps: int = 10) -> CostPreview:
    """Predict the fraction of the model x item cells a rank or select request will score, by playing it ``reps``
    times on the recorded models its ``history`` names (never its own models); calls no model, writes nothing."""
    from certeval.reports.preview import preview_request

    return preview_request(request, reps=reps)
