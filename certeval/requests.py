"""What a user asks certeval: one typed request per question (certify, compare, rank, select).

A request is a frozen dataclass whose fields are the question's inputs; each field is written here once, with its
default, its help text and its command-line flags in ``dataclasses.field(metadata=...)``. The command line
generates ``certeval certify|compare|rank|select`` and ``certeval backtest COMMAND`` from these fields
(:mod:`certeval.cli.request_flags`), and the Python API (:mod:`certeval.api`) takes the same objects. Nothing is
checked on construction (no logic in ``__init__``, as in scikit-learn): :func:`certeval.runs.plan.make_plan` is
the one validation step, before Ray or Prefect start.

Field metadata: ``flags`` (the command-line spellings, the first one named in messages; none: no flag),
``help`` (a text, or a mapping kind → text where the kinds read the field differently), ``kinds`` (the kinds that
read a field shared by their base class; absent: every kind of the class), ``live`` (a field only a live run reads:
where it writes, where the models run; a backtest takes none), ``identity`` (False: how or where the run runs, not
what it asks — a resumed run may change it; the others are compared with config.json on resume), ``cli`` (argparse's ``action``, ``type``,
``choices``, ``metavar``).

Cheap to import (no pandas, Ray or Prefect): ``import certeval`` and the command line's parser load it.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any, ClassVar

from certeval.errors import InputError
from certeval.runtime.options import RuntimeOptions

from .estimators.protocol import TARGETS

# how a bank with sub-datasets is summed up (lm-eval's groups offer both): each sub-dataset counts once (the default,
# Arviv et al.'s estimand), or each item counts once (the plain accuracy)
AGGREGATES = ("subset-mean", "mean")

__all__ = ["AGGREGATES", "BacktestOptions", "Certify", "Compare", "IDENTITY", "Paired", "Rank", "Request", "Select", "REQUESTS", "check_unread_fields",
           "field_default", "field_help", "flag_of", "reads", "request_for"]


def _field(default: Any, *flags: str, help: Any, kinds: tuple[str, ...] | None = None, live: bool = False,
           identity: bool = True, **cli: Any) -> Any:
    metadata = {"flags": flags, "help": help, "cli": cli, "live": live, "identity": identity}
    if kinds is not None:
        metadata["kinds"] = kinds
    return field(default=default, metadata=metadata)


@dataclass(frozen=True, kw_only=True)
class Request:
    """The inputs every question shares: the models, the bank, the statement's confidence and budget, where the
    run folder goes, and where the models run. ``models`` are spec strings (``replay:<scores>#<model>``,
    ``hf:<folder>``, ``vllm:<folder>``, ``openai:<base_url>#<model>``)."""

    kind: ClassVar[str] = ""

    models: tuple[str, ...] = _field(
        (), "--model", action="append", metavar="SPEC",
        help="model spec (repeatable): replay:<scores>#<model>, hf:<dir|bundled:smollm2>, vllm:<dir>, "
             "openai:<base_url>#<model>")
    bank: str | None = _field(
        None, "--bank", "--tasks",
        help="item bank (Parquet/JSONL/CSV, an lm-eval samples file or Inspect log, any fsspec URL, bundled:<name>, "
             "bundled:trivia); optional with replay models only. --tasks: lm-eval's name for it, which also takes "
             "an lm-eval task or group: a YAML file, or NAME[,NAME...] from lm-eval's index (or --include_path)")
    goal: str | None = _field(
        None, "--goal", kinds=("certify", "rank"),
        help={"certify": "halfwidth:E, above:T or below:T (required); add +diminishing:G to also stop a model whose "
                         "half-width shrinks by less than G a look (goal then not reached)",
              "rank": "halfwidth:E: leaderboard precision — every model's bank mean within ±E simultaneously (bank "
                      "target), ordered where the intervals do not overlap; with --history each model's interval "
                      "learns from the recorded models"})
    history: tuple[str, ...] = _field(
        (), "--history", action="append", metavar="SOURCE",
        help={"certify": "other models' recorded scores on the bank's items (scores file, bundled:<name>, a run "
                         "folder or a folder of runs; repeatable): the run learns from them and its interval stays "
                         "exact",
              "paired": "other models' recorded scores (repeatable), bank target: compare/rank get an exact, "
                        "anytime-valid interval for each difference with the predicted paired difference as control "
                        "variate; select gets each model's exact interval with its predicted score as control "
                        "variate; select --history auto: earlier select runs on this bank under --output"})
    aggregate: str | None = _field(
        None, "--aggregate", choices=AGGREGATES,
        help="a bank with sub-datasets (a 'subset' column): subset-mean (default) makes each sub-dataset count "
             "once (the mean of their means), mean each item once (the plain accuracy); named in every output")
    confidence: float = _field(0.95, "--confidence", type=float, help="confidence level in (0, 1)")
    seed: int = _field(0, "--seed", type=int, help="root seed (stored with every result)")
    batch_size: int = _field(50, "--batch-size", type=int, help="items per round and model")
    max_items: int | None = _field(
        None, "--max-items", "--limit",
        help="item budget per model (--limit: lm-eval's name for it; with --tasks a fraction below 1 is that "
             "fraction of each task's docs, as in lm-eval)")
    scorer: str | None = _field(
        None, "--scorer", live=True, help="mc-loglik, mc-loglik-norm, exact, normalized, numeric or pkg.mod:func")
    output: str | None = _field(
        None, "--output", "--output_path", "--output-path", live=True, identity=False,
        help="root of run folders: a folder or any fsspec URL (s3://...); default ./certeval-runs")
    run_id: str | None = _field(None, "--run-id", live=True, identity=False,
                                help="name of the run folder; the same id resumes a stopped run")
    log_samples: bool = _field(
        False, "--log_samples", "--log-samples", live=True, identity=False, action="store_true",
        help="also write samples/<model>/samples_<task>_<time>.jsonl (lm-eval's format) in the run folder")
    ray_address: str | None = _field(
        None, "--ray-address", live=True, identity=False,
        help="connect to a running Ray cluster (default: $RAY_ADDRESS if set, else start a local one)")
    num_cpus: int | None = _field(None, "--num-cpus", live=True, identity=False, type=int,
                                  help="CPUs of the local Ray (default: this machine's)")
    replicas: int = _field(1, "--replicas", live=True, identity=False, type=int, help="actors per model")
    num_gpus: float = _field(0.0, "--num-gpus", live=True, identity=False, type=float,
                             help="GPUs per actor (vLLM / CUDA hosts)")
    in_flight: int = _field(2, "--in-flight", live=True, identity=False, type=int, help="batches queued per actor")
    chunk_size: int | None = _field(
        None, identity=False,
        help="items per actor call (default: the round's items split over replicas x in-flight batches)")
    # how the run runs (timeouts, logs, start-up, cache): never its identity; the command line's runtime flags
    options: RuntimeOptions = field(default_factory=RuntimeOptions, metadata={
        "flags": (), "help": "runtime options (certeval.runtime.options)", "identity": False})


@dataclass(frozen=True, kw_only=True)
class Certify(Request):
    """Certify each model's bank mean to a goal: ``halfwidth:E``, ``above:T`` or ``below:T``."""

    kind: ClassVar[str] = "certify"

    method: str | None = _field(
        None, "--method",
        help="history (default with --history), adaptive (default otherwise), uniform, seq, cer-eval, static")


@dataclass(frozen=True, kw_only=True)
class Paired(Request):
    """What the paired questions (compare, rank, select) share: every model scores the same items. A field only
    some of them read names them in ``kinds`` (the others keep its default)."""

    target: str | None = _field(
        None, "--target", choices=TARGETS,
        help="bank (default): the bank's own means and differences, exact once every item is scored "
             "(without-replacement confidence sequences); distribution: items as a sample of a population "
             "(group-sequential tests)")
    margin: float = _field(
        0.0, "--margin", type=float, kinds=("compare", "rank"),
        help="margin D: a>b needs the difference above D, equivalent inside (-D, D)")
    epsilon: float | None = _field(
        None, "--epsilon", type=float, kinds=("rank",),
        help="epsilon-correct ranking (bank target): instead of strict verdicts, list the models so that every "
             "model above another has a bank mean at least the other's minus E, jointly with probability >= "
             "confidence; models within E of each other need not be separated, so dense leaderboards stop early "
             "(docs/ranking.md)")


@dataclass(frozen=True, kw_only=True)
class Compare(Paired):
    """Compare two models on the same items."""

    kind: ClassVar[str] = "compare"


@dataclass(frozen=True, kw_only=True)
class Rank(Paired):
    """Rank models by sequential pairwise comparisons, with tie groups."""

    kind: ClassVar[str] = "rank"


@dataclass(frozen=True, kw_only=True)
class Select(Paired):
    """Select models: discard those below a threshold, keep the best (or every model to a precision)."""

    kind: ClassVar[str] = "select"

    threshold: float | None = _field(
        None, "--threshold", type=float,
        help="discard models whose score is surely below T (required with --target distribution and --mode best; "
             "--mode precision: default 0, none discarded)")
    halfwidth: float | None = _field(
        None, "--halfwidth", type=float,
        help="bank target: epsilon of the best-model identification (default 0); distribution target (required): "
             "stop when intervals are this precise")
    top: int | None = _field(None, "--top", type=int, help="bank target: identify the K best models (default 1)")
    mode: str = _field("best", "--mode", choices=("best", "precision"),
                       help="best: keep the best model(s); precision: every model to --halfwidth (the distribution "
                            "target, implied)")


REQUESTS: dict[str, type[Request]] = {cls.kind: cls for cls in (Certify, Compare, Rank, Select)}


@dataclass(frozen=True, kw_only=True)
class BacktestOptions:
    """How ``certeval backtest COMMAND`` (:func:`certeval.api.backtest`) plays a request on recorded scores: no live
    run reads these (a live run has no reps, no sampled pairs, no random history share, and always runs the paired
    statistic with Pocock spending and the neighbour epsilon-ranking). ``kinds``: the commands that read a field."""

    scores: str | None = _field(
        None, "--scores", required=True,
        help="recorded scores (model, item_id, score[, subset]); bundled:<name> works")
    reps: int = _field(20, "--reps", type=int, help="repetitions; rep r is the live run with --seed (seed + r)")
    pairs: int | None = _field(
        None, "--pairs", type=int, kinds=("compare",),
        help="play this many random pairs of the models (every recorded model, or the --model list), each a live "
             "compare of its own at the request's level (default: the two models)")
    history_fraction: float | None = _field(
        None, "--history-fraction", type=float, kinds=("rank", "select"),
        help="bank target: in each rep a random share F in (0, 1) of the models is the history (one factor model, "
             "the prior of every other model) and the rest are ranked or selected with it; a rep is then no "
             "longer a live run's order")
    statistic: str = _field("paired", "--statistic", kinds=("compare", "rank", "select"),
                            help="distribution target: the test statistic, paired or unpaired")
    spending: str = _field("pocock", "--spending", kinds=("compare", "rank", "select"),
                           help="distribution target: the boundary / alpha-spending function")
    ranking: str = _field(
        "auto", "--ranking", kinds=("rank",),
        help="with --epsilon (bank target): neighbours (auto: per-model confidence sequences settle the pairs far "
             "apart, pair tests only for the neighbours they leave unsettled, as the live rank --epsilon) or "
             "all-pairs (two tests for every pair at alpha/P, the earlier construction)")

    @classmethod
    def reads(cls, name: str, kind: str) -> bool:
        """Whether ``certeval backtest KIND`` reads the option ``name``."""
        found = {f.name: f for f in fields(cls)}[name]
        return kind in found.metadata.get("kinds", (kind,))


# what a run is: the fields a resumed run must ask again exactly (config.json keeps them), each named once
IDENTITY: tuple[str, ...] = tuple(dict.fromkeys(f.name for cls in REQUESTS.values() for f in fields(cls)
                                                 if f.metadata.get("identity", True)))


def reads(cls: type[Request], name: str) -> bool:
    """Whether a question of class ``cls`` reads its field ``name`` (a shared field may be for some kinds only)."""
    found = {f.name: f for f in fields(cls)}.get(name)
    return found is not None and cls.kind in found.metadata.get("kinds", (cls.kind,))


def flag_of(name: str) -> str:
    """The flag messages name a request field by (``--max-items`` for ``max_items``)."""
    for cls in REQUESTS.values():
        for f in fields(cls):
            if f.name == name and f.metadata.get("flags"):
                return f.metadata["flags"][0]
    return name


def field_help(f: Any, kind: str) -> str:
    """A field's help for ``kind`` (``paired``: compare, rank and select's shared text), with its default."""
    text = f.metadata.get("help", "")
    if isinstance(text, dict):
        text = text.get(kind, text.get("paired", ""))
    default = field_default(f)
    if not (default is None or default is False or default == () or isinstance(default, RuntimeOptions)) \
            and "default" not in text:
        text += f" (default {default:g})" if isinstance(default, float) else f" (default {default})"
    return text


def field_default(f: Any) -> Any:
    """A request field's default (its factory's value for ``options``)."""
    return f.default_factory() if f.default is MISSING else f.default


def _owners(name: str) -> str:
    owners = [k for k, cls in REQUESTS.items() if reads(cls, name)]
    return ", ".join(owners[:-1]) + " and " + owners[-1] if len(owners) > 1 else "".join(owners)


def check_unread_fields(request: Request) -> None:
    """A field the request's class shares but its kind does not read (``goal`` of a compare, ``margin`` of a
    select) must keep its default: a value there would be silently ignored. Part of the validation step."""
    cls = type(request)
    for f in fields(cls):
        if not reads(cls, f.name) and getattr(request, f.name) != field_default(f):
            raise InputError(f"{flag_of(f.name)} applies to {_owners(f.name)}, not {cls.kind}")


def request_for(kind: str, **values: Any) -> Request:
    """The request of ``kind`` with ``values`` (a flow's or a deployment's parameters); a value for a field the kind
    does not have is refused in one line naming its flag."""
    cls = REQUESTS.get(kind)
    if cls is None:
        raise InputError(f"unknown pipeline kind {kind!r}; kinds: {', '.join(REQUESTS)}")
    for name in values:
        if not reads(cls, name) and name not in {f.name for f in fields(cls)}:
            if not _owners(name):
                raise InputError(f"{kind}: unknown request field {name!r}")
            raise InputError(f"{flag_of(name)} applies to {_owners(name)}, not {kind}")
    return cls(**values)
