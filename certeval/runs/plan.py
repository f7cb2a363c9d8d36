"""What a pipeline run was asked to do, validated before Ray or Prefect start.

:func:`make_plan` checks every input a run needs — model specs, bank, scorer,
goal, method, numbers, the output location and (on resume) the stored config —
and raises :class:`InputError` (one line, exit 2) before anything is written.
Only when everything is valid does :func:`claim_run` write ``config.json``.
Nothing here imports Ray or Prefect, so bad input fails in about a second.
"""

from __future__ import annotations

import datetime as _dt
import os
import uuid
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from certeval.errors import InputError
from certeval.estimators import make_method, parse_goal
from certeval.estimators.groups import GroupRequest
from certeval.estimators.protocol import TARGETS  # what compare/rank/select answer (docs/architecture.md §4)
from certeval.estimators.validation import check_confidence, check_in_range, check_positive
from certeval.harnesses.lm_eval_tasks import AGGREGATE as LM_EVAL_AGGREGATE
from certeval.harnesses.lm_eval_tasks import NAMES_PREFIX as LM_EVAL_NAMES
from certeval.inputs.model_fingerprint import MEMO_DIR, ModelFingerprint, fingerprint_models
from certeval.inputs.model_folders import check_model_folder
from certeval.inputs.model_spec import ModelSpec, parse_model_spec
from certeval.requests import AGGREGATES, IDENTITY, Paired, Request, Select, check_unread_fields
from certeval.runtime.options import RuntimeOptions, runtime_options
from certeval.storage import DEFAULT_OUTPUT, RunStore, cache_key, check_reachable

from .inputs import PreparedRun, _model_items, check_replay_coverage, load_run_bank, run_history_priors
from .plan_checks import check_choice_items, check_epsilon, leaderboard_goal, trial_start

KINDS = ("certify", "compare", "rank", "select")
# keys of config.json a resumed run must match exactly: the question and what the request says it is
COMPARED = ("kind", *IDENTITY)
HISTORY_METHOD = "history"
BACKTEST_ONLY_METHODS = {"faq": "method 'faq' needs a factor model fitted on history and runs in backtests only "
                                "(certeval backtest --method faq); for a live run that learns from history use "
                                "--history SOURCE (method 'history', exact and anytime-valid)"}
REPLAY_OPTIONS = {"latency"}
INTEGRITY = "manifest-v1"  # config.json: the run folder keeps manifest.json, checked on resume
PAIRED_METHOD = "uniform"  # per-model intervals on the shared item order (drawn ∝ weight on the bank target)
MAX_GPUS = 64  # GPUs one model actor may ask for


@dataclass(frozen=True)
class RunPlan:
    """A validated request. ``models`` are spec strings; ``labels`` their unique display names."""

    kind: str
    models: tuple[str, ...]
    labels: tuple[str, ...]
    bank: str | None
    output: str = DEFAULT_OUTPUT
    run_id: str = ""
    goal: str | None = None
    method: str = "adaptive"
    confidence: float = Request.confidence  # a request's defaults, written once (certeval.requests)
    batch_size: int = Request.batch_size
    max_items: int | None = None
    seed: int = Request.seed
    scorer: str | None = None
    margin: float = Paired.margin
    threshold: float | None = None
    halfwidth: float | None = None
    mode: str = Select.mode
    ray_address: str | None = None
    replicas: int = Request.replicas
    num_gpus: float = Request.num_gpus
    num_cpus: int | None = None  # CPUs of a local Ray (default: this machine's); ignored with ray_address
    in_flight: int = Request.in_flight
    chunk_size: int | None = None  # items per actor call (default: batch_size split over replicas x in_flight)
    history: tuple[str, ...] = ()  # --history sources (other models' recorded scores, earlier runs)
    target: str | None = None  # compare/rank/select: "bank" (default) or "distribution"; None for certify
    top: int | None = None  # select, bank target: how many best models to identify (default 1)
    epsilon: float | None = None  # rank, bank target: ε-statements instead of the margin's strict verdicts
    aggregate: str | None = None  # "mean": every item counts once; None / "subset-mean": each sub-dataset once
    # which command made this plan: config.json keeps the first one's, so a later claim by another command is a
    # resume and the same command claiming twice (CLI, then the flow) is not; never compared on resume
    invocation: str = field(default_factory=lambda: uuid.uuid4().hex)
    # how this command runs (timeouts, logs, start-up, cache): not the run's identity, not in config.json
    options: RuntimeOptions = field(default_factory=RuntimeOptions)
    # per model, what its scores come from (its files' digests, or its address), read by make_plan before
    # anything starts: the score cache's key (cache_keys); () for a plan made otherwise (read when needed)
    fingerprints: tuple[ModelFingerprint, ...] = ()

    @property
    def paired(self) -> bool:
        return self.kind != "certify"

    @property
    def mean_of_means(self) -> bool:
        """Whether the estimand is the mean of sub-dataset means (``--aggregate subset-mean``, the default)."""
        return self.aggregate != "mean"

    @property
    def task_name(self) -> str:
        """The lm-eval-style task name: the bank's (or scores file's) short name."""
        source = self.bank or self.models[0].split(":", 1)[1].split("#")[0]
        name = source.split("?")[0].replace("bundled:", "").replace(LM_EVAL_NAMES, "").rstrip("/").split("/")[-1]
        from certeval.harnesses.readers import SAMPLES_NAME

        if SAMPLES_NAME.match(name):  # an lm-eval samples file names its task
            return SAMPLES_NAME.match(name).group("task")
        for suffix in (".scores.parquet", ".items.parquet", ".parquet", ".jsonl", ".json", ".csv", ".items", ".scores",
                       ".yaml", ".yml"):
            if name.endswith(suffix):
                return name[: -len(suffix)]
        return name

    def config(self) -> dict[str, Any]:
        out = asdict(self)
        del out["options"]
        out["versions"] = _versions()
        out["created"] = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        out["models"] = list(self.models)
        out["labels"] = list(self.labels)
        out["history"] = list(self.history) or None  # None: runs stored before --history resume unchanged
        out["integrity"] = INTEGRITY  # runs stored before the manifest resume without its check
        # what each model's scores came from (the files' digests are the score cache's business, not the run's)
        out["fingerprints"] = [{"covers": fp.covers, "digest": fp.digest} for fp in self.fingerprints] or None
        # relative local paths (bank, scores, history) are relative to it: rescore reads them from anywhere
        out["workdir"] = os.getcwd()
        return out

    def generation(self) -> dict[str, Any]:
        """Settings that change a model's score for an item (part of the score-cache key)."""
        return {"scorer": self.scorer or "auto"}

    def model_fingerprints(self) -> tuple[ModelFingerprint, ...]:
        if len(self.fingerprints) == len(self.models):
            return self.fingerprints
        return fingerprint_models([parse_model_spec(m) for m in self.models], self.options.cache_path() / MEMO_DIR)

    def model_digests(self) -> dict[str, str]:
        """Per label, the digest of what its model is read from (:class:`ModelFingerprint`)."""
        return {label: fp.digest for label, fp in zip(self.labels, self.model_fingerprints())}

    def cache_keys(self) -> dict[str, str]:
        """Per label, the score cache's key: what was scored (docs/architecture.md, "Score cache key")."""
        return {label: cache_key(cache_identity(spec, fp), self.scorer or "auto", self.generation())
                for label, spec, fp in zip(self.labels, self.models, self.model_fingerprints())}

    def model_paths(self) -> dict[str, str]:
        """Per label, a digest of the model as named (its path, options, scorer and settings; never its files):
        where the files its scores were last cached for are kept, so a run can say why it scores anew."""
        import hashlib
        import json

        return {label: hashlib.sha256(json.dumps([_cache_spec(spec), self.scorer or "auto", self.generation()],
                                                 sort_keys=True).encode()).hexdigest()[:24]
                for label, spec in zip(self.labels, self.models)}

    def store(self) -> RunStore:
        return RunStore(self.output, self.run_id)

    def group_request(self, labels: tuple[str, ...] | None = None, history: dict[str, Any] | None = None) -> GroupRequest:
        """What a paired run's group estimator is asked (:mod:`certeval.estimators.groups`): for this plan's models
        (or ``labels``: the recorded models a cost preview plays them with), with ``history`` priors per label."""
        return GroupRequest(kind=self.kind, labels=tuple(self.labels if labels is None else labels),
                            target=self.target or "bank", confidence=self.confidence, margin=self.margin,
                            threshold=self.threshold, halfwidth=self.halfwidth, top=self.top, mode=self.mode,
                            look_size=self.batch_size, max_items=self.max_items, history=history or {},
                            epsilon=self.epsilon,
                            precision=parse_goal(self.goal).value if self.paired and self.goal else None)


def task_scorer(frame: Any) -> str | None:
    """The scorer an lm-eval task bank stops on by default: its task's judge of the task's first metric (acc, or
    acc_norm, of multiple choice; acc of a LAMBADA-style task; certeval's byte likelihood of a perplexity task; the
    first metric and filter of a generation task); ``lm-eval-task`` for tasks whose judges differ (each item judged
    by its own task's); None (certeval's default) for a bank of no task."""
    from certeval.harnesses.lm_eval_output_types import MIXED_SCORER, meta_scorer
    from certeval.scoring.lm_eval_metrics import task_metas

    metas = task_metas(frame)
    names = [meta_scorer(meta) for meta in metas]
    if len({meta["output_type"] for meta in metas}) > 1 and len(set(names)) > 1:
        return MIXED_SCORER
    return names[0] if names else None


# options that change how a model is run, not what it answers (kept out of the cache key)
_RUNTIME_OPTIONS = {"latency", "device", "batch", "replicas", "trust_remote_code"}


def _cache_spec(spec_text: str, location: str | None = None) -> str:
    spec = parse_model_spec(spec_text)
    kept = sorted((k, v) for k, v in spec.options if k not in _RUNTIME_OPTIONS)
    query = "&".join(f"{k}={v}" for k, v in kept)
    return (f"{spec.kind}:{spec.location if location is None else location}" + (f"#{spec.name}" if spec.name else "")
            + (f"?{query}" if query else ""))


def cache_identity(spec_text: str, fingerprint: ModelFingerprint) -> str:
    """What names a model's scores in the cache key: a model folder (hf, vllm, the bundled GGUF) by its files'
    digest in place of its path (a folder copied elsewhere keeps its scores; weights copied over it do not),
    with the options that change its answers; a replay scores file by its path, model name and content; a
    server (openai) or remote file by its spec (address, model name, options): its weights cannot be read."""
    spec = parse_model_spec(spec_text)
    if fingerprint.covers != "files":
        return _cache_spec(spec_text)
    if spec.kind in ("hf", "vllm"):
        return _cache_spec(spec_text, location=f"files:{fingerprint.digest}")
    return f"{_cache_spec(spec_text)}@files:{fingerprint.digest}"


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    # the installed distributions, certeval's too: its package root imports the API, which imports this module
    out = {}
    for dist in ("certeval", "numpy", "prefect", "ray"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            pass
    return out


def trusts_code(spec: ModelSpec) -> bool:
    """Whether the user let this model run its folder's own code (``--trust-remote-code``)."""
    return str(spec.option("trust_remote_code", "false")).strip().lower() in ("true", "1", "yes")


def check_model(spec: ModelSpec) -> None:
    """Cheap existence checks per backend kind (no model is loaded here)."""
    if spec.kind == "replay":
        unknown = [k for k, _ in spec.options if k not in REPLAY_OPTIONS]
        if unknown:
            raise InputError(f"unknown replay option {unknown[0]!r} in {spec.text!r}; options: "
                             f"{', '.join(sorted(REPLAY_OPTIONS))}")
        spec.number_option("latency", 0.0, float, 0.0)
        if spec.name not in _model_items(spec.location):
            models = sorted(_model_items(spec.location))
            raise InputError(f"unknown model {spec.name!r} in {spec.location!r}; it has {len(models)} models, "
                             f"e.g. {', '.join(models[:5])}")
    elif spec.kind == "vllm":
        import importlib.util

        from certeval.hosting.vllm_host import NOT_INSTALLED, parse_options

        parse_options(spec)
        if importlib.util.find_spec("vllm") is None:
            raise InputError(f"model {spec.text!r}: {NOT_INSTALLED}")
        if not spec.location.startswith("bundled:"):
            check_model_folder(spec.location, "--model", spec.text, trust_remote_code=trusts_code(spec))
    elif spec.kind == "hf":
        if spec.location.startswith("bundled:"):
            from certeval.inputs.smollm import gguf_path, resolve_model_dir

            if spec.location not in ("bundled:smollm2", "bundled:smollm2-135m", "bundled:SmolLM2-135M-Instruct"):
                resolve_model_dir(spec.location)  # raises the backend's own message
            gguf_path()
        else:
            check_model_folder(spec.location, "--model", spec.text, trust_remote_code=trusts_code(spec))
        from certeval.hosting.hf import parse_options

        parse_options(spec)
    elif spec.kind == "openai":
        from certeval.hosting.openai_host import parse_options as parse_openai_options

        parse_openai_options(spec)


def default_run_id(kind: str) -> str:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{kind}-{stamp}-{uuid.uuid4().hex[:4]}"


def make_plan(request: Request, *, check_output: bool = True, probe: bool = True) -> tuple[RunPlan, PreparedRun]:
    """Validate a request (:mod:`certeval.requests`): the one validation step of every question, before Ray or
    Prefect start. Return the plan and what validation loaded (the bank, the history priors), so the flow loads and
    fits nothing again. Raises InputError on any bad input. ``check_output``: the output location must be
    reachable; ``probe``: read $RAY_ADDRESS, the models' files and servers (False where nothing will start:
    ``certeval backtest COMMAND`` plays the plan on recorded scores)."""
    if not isinstance(request, Request):
        raise TypeError(f"make_plan takes a certeval request (Certify, Compare, Rank, Select), "
                        f"got {type(request).__name__}")
    r = request
    kind, models, bank, output, run_id, goal = r.kind, list(r.models), r.bank, r.output, r.run_id, r.goal
    confidence, batch_size, max_items, seed, scorer = r.confidence, r.batch_size, r.max_items, r.seed, r.scorer
    # a field the question does not have is not asked: the plan keeps its neutral value (certify has no margin)
    asked = {f.name: getattr(r, f.name) for f in fields(r)}
    method, target, top, epsilon_asked, threshold, halfwidth = (
        asked.get(name) for name in ("method", "target", "top", "epsilon", "threshold", "halfwidth"))
    margin, mode = asked.get("margin", RunPlan.margin), asked.get("mode", RunPlan.mode)
    ray_address, num_cpus, num_gpus, replicas = r.ray_address, r.num_cpus, r.num_gpus, r.replicas
    in_flight, chunk_size, history = r.in_flight, r.chunk_size, r.history
    check_unread_fields(r)
    epsilon = check_epsilon(r) if epsilon_asked is not None else None
    if r.aggregate is not None and r.aggregate not in AGGREGATES:
        raise InputError(f"--aggregate must be one of {', '.join(AGGREGATES)}; got {r.aggregate!r}")
    aggregate = None if r.aggregate in (None, AGGREGATES[0]) else r.aggregate  # stored runs without it: default
    options = runtime_options(r.options)
    if kind not in KINDS:
        raise InputError(f"unknown pipeline kind {kind!r}; kinds: {', '.join(KINDS)}")
    if not models:
        raise InputError("at least one --model is required")
    specs = [parse_model_spec(m) for m in models]
    from certeval.runtime.redact import register_secret_names

    # the variables openai specs read their keys from: secrets in every message from here on, whatever their names
    register_secret_names(str(s.option("api_key_env", "OPENAI_API_KEY")) for s in specs if s.kind == "openai")
    if len({s.text for s in specs}) != len(specs):
        raise InputError("the same --model was given twice")
    counts = {"compare": (2, 2), "rank": (2, None), "select": (1, None), "certify": (1, None)}[kind]
    if len(specs) < counts[0] or (counts[1] is not None and len(specs) > counts[1]):
        want = f"exactly {counts[0]}" if counts[0] == counts[1] else f"at least {counts[0]}"
        raise InputError(f"{kind} needs {want} --model, got {len(specs)}")
    labels = _labels(specs)
    confidence = check_confidence(confidence)
    batch_size = _positive_int(batch_size, "--batch-size")
    max_items = None if max_items is None else _positive_int(max_items, "--max-items")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InputError(f"--seed must be a non-negative integer, got {seed!r}")
    margin = check_in_range(margin, "--margin", 0.0, 1.0)
    if margin >= 1.0:  # no difference of means in [0, 1] lies beyond 1: one range for both targets
        raise InputError(f"--margin must lie in [0, 1), got {margin!r}")
    history = tuple(str(h) for h in (history or ()))
    if kind == "certify":
        if goal is None:
            raise InputError("certify needs --goal halfwidth:E, above:T or below:T")
        goal = str(parse_goal(goal))
        method = method or (HISTORY_METHOD if history else "adaptive")
        if method in BACKTEST_ONLY_METHODS:
            raise InputError(BACKTEST_ONLY_METHODS[method])
        if history and method != HISTORY_METHOD:
            raise InputError(f"--history is used by method {HISTORY_METHOD!r}; got --method {method} (drop --method)")
        if method == HISTORY_METHOD and not history:
            raise InputError(f"method {HISTORY_METHOD!r} needs --history SOURCE: other models' recorded scores on "
                             "the bank's items (a scores file, bundled:<name>, or earlier run folders)")
        method_obj = make_method(method, confidence=confidence)
    else:
        if method not in (None, PAIRED_METHOD):
            raise InputError(f"{kind} samples the same uniform item order for every model; --method must be "
                             f"{PAIRED_METHOD!r}, got {method!r}")
        method, goal, method_obj = PAIRED_METHOD, leaderboard_goal(r), None
    if kind == "certify":
        if target is not None:
            raise InputError("--target applies to compare, rank and select (certify's methods state their own target)")
        if top is not None:
            raise InputError("--top applies to select")
    else:
        if target is None:  # select --mode precision: only the distribution target answers it
            target = "distribution" if kind == "select" and mode == "precision" else "bank"
        if target not in TARGETS:
            raise InputError(f"--target must be one of {', '.join(TARGETS)}, got {target!r}")
        if history and target != "bank":
            raise InputError("--history answers the bank target (an exact interval for the bank's difference); "
                             f"drop --target {target}")
    if top is not None and kind != "select":
        raise InputError("--top applies to select")
    if kind == "select":
        if mode not in ("best", "precision"):
            raise InputError(f"--mode must be best or precision, got {mode!r}")
        if target == "distribution":
            if mode == "precision" and halfwidth is None:
                raise InputError("select --mode precision needs --halfwidth E (every model's interval within ±E)")
            threshold = 0.0 if mode == "precision" and threshold is None else threshold  # none discarded
            if threshold is None or halfwidth is None:
                raise InputError("select --target distribution needs --threshold T and --halfwidth E")
            if top is not None:
                raise InputError("--top is the bank target's best-arm identification; drop --target distribution")
        else:
            if mode != "best":
                raise InputError("--mode precision is answered with --target distribution; the bank target "
                                 "identifies the best model(s) (--top K, within --halfwidth E)")
            threshold = 0.0 if threshold is None else threshold
            halfwidth = 0.0 if halfwidth is None else halfwidth
            top = 1 if top is None else top
            if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= len(specs):
                raise InputError(f"--top must be an integer in [1, number of models = {len(specs)}], got {top!r}")
        threshold = check_in_range(threshold, "--threshold", 0.0, 1.0)
        halfwidth = check_in_range(halfwidth, "--halfwidth", 0.0, 1.0) if target == "bank" else \
            check_positive(halfwidth, "--halfwidth")
        if halfwidth >= 1.0:  # the best-arm tolerance (bank) and the interval's half-width (distribution) lie below 1
            raise InputError(f"--halfwidth must lie in [0, 1) on the bank target and (0, 1) on the distribution "
                             f"target, got {halfwidth!r}")
    for spec in specs:
        check_model(spec)
    loaded = load_run_bank(bank, tuple(s.text for s in specs))
    if r.aggregate is None and loaded.frame is not None and LM_EVAL_AGGREGATE in loaded.frame.columns:
        # an lm-eval group's own aggregation (weight_by_size) is the estimand unless the user names another
        aggregate = None if loaded.frame[LM_EVAL_AGGREGATE].iloc[0] == AGGREGATES[0] else "mean"
    if bank is not None:
        check_replay_coverage(specs, loaded)
    if any(s.kind != "replay" for s in specs):
        from certeval.harnesses.lm_eval_output_types import MIXED_SCORER, check_hosts, check_mixed_scorer
        from certeval.scoring.lm_eval_generation import SCORING, check_scoring_column, is_lm_eval_scorer, qualified
        from certeval.scoring.lm_eval_metrics import task_metas
        from certeval.scoring.scorers import resolve_scorer

        columns = [c for c in loaded.frame.columns if loaded.frame[c].notna().any()] if loaded.frame is not None else ["item_id"]
        if scorer in (None, "", "auto"):
            scorer = task_scorer(loaded.frame)
        check_mixed_scorer(task_metas(loaded.frame), scorer, bank)
        check_hosts(loaded.frame, scorer, specs)
        if scorer == MIXED_SCORER and SCORING in columns:  # generation items among other tasks': registered names
            check_scoring_column(loaded.frame, f"--scorer {scorer}: bank {bank!r}")
        scorer = resolve_scorer(scorer, columns, source=f"bank {bank!r}").name
        if is_lm_eval_scorer(scorer):  # named by the metric and filter it judges, as lm-eval's results name it
            check_scoring_column(loaded.frame, f"--scorer {scorer}: bank {bank!r}")  # registered names only
            scorer = qualified(scorer, str(loaded.frame[SCORING].dropna().iloc[0]))
        check_choice_items(loaded.frame, scorer, f"bank {bank!r}")
    # fitted here, so unreadable sources or unmatched items are found before any write, and once
    priors = run_history_priors(history, loaded, labels) if history else {}
    if method_obj is not None and getattr(method_obj, "needs_features", False):
        if loaded.features is None and loaded.texts() is None:
            raise InputError(f"method {method!r} needs item features, but the bank has neither an 'embedding' "
                             "column nor item text ('question')")
    plan = RunPlan(
        kind=kind, models=tuple(s.text for s in specs), labels=labels, bank=bank,
        output=output or DEFAULT_OUTPUT, run_id=run_id or default_run_id(kind), goal=goal, method=method,
        confidence=confidence, batch_size=batch_size, max_items=max_items, seed=seed, scorer=scorer,
        margin=margin, threshold=threshold, halfwidth=halfwidth, mode=mode, ray_address=ray_address,
        replicas=_positive_int(replicas, "--replicas"), num_gpus=float(num_gpus),
        in_flight=_positive_int(in_flight, "--in-flight"),
        chunk_size=None if chunk_size is None else _positive_int(chunk_size, "--chunk-size"), history=history,
        target=target, top=top, epsilon=epsilon, aggregate=aggregate, options=options,
    )
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, (int, float)) or not 0 <= num_gpus <= MAX_GPUS:
        raise InputError(f"--num-gpus must be a number in [0, {MAX_GPUS}], got {num_gpus!r}")
    ray_address = ray_address or (os.environ.get("RAY_ADDRESS") if probe else None) or None  # the user's cluster
    if num_cpus is not None:
        num_cpus = _positive_int(num_cpus, "--num-cpus")
    if ray_address is None and probe:  # the local Ray's token folder: this user's own, checked before any start
        from certeval.runtime.envsetup import private_folder, ray_state_folder

        private_folder(ray_state_folder(), create=False)
    if num_gpus > 0 and ray_address is None:
        found = local_gpu_count()
        if found < min(num_gpus, 1.0) or (num_gpus >= 1 and found < num_gpus):
            raise InputError(f"--num-gpus {num_gpus:g} asks each model actor for GPUs, but the local Ray would see "
                             f"{found} GPU(s) on this machine; drop --num-gpus or pass --ray-address of a cluster "
                             "with GPUs")
    plan = replace(plan, ray_address=ray_address, num_cpus=num_cpus)
    trial_start(plan, loaded, priors)
    plan.store()  # validates the run id
    if check_output:
        check_reachable(plan.output)
    if probe:  # the models' files read (bounded; a content hash once per file version): the score cache's key
        plan = replace(plan, fingerprints=fingerprint_models(specs, options.cache_path() / MEMO_DIR))
    if ray_address and probe:  # network probes last, after every cheap check: bounded, one line on failure
        from certeval.runtime.envsetup import check_ray_address

        check_ray_address(ray_address)
    for spec in specs:  # bounded (≤ 10 s), one line on failure
        if spec.kind == "openai" and probe:
            from certeval.hosting.openai_host import build_host

            build_host(spec).close()  # options parsed and GET {base_url}/models answered, or InputError
    return plan, PreparedRun(loaded, priors)


def local_gpu_count(timeout_s: float = 10.0) -> int:
    """NVIDIA GPUs a local Ray would see: ``nvidia-smi -L`` (bounded), limited by ``CUDA_VISIBLE_DEVICES``."""
    import shutil
    import subprocess

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return 0
    try:
        out = subprocess.run([exe, "-L"], capture_output=True, text=True, timeout=timeout_s, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    count = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


# what config.json holds besides the plan's fields (RunPlan.config)
CONFIG_EXTRAS = ("versions", "created", "integrity", "workdir")


def read_run_config(config: Any, where: str) -> dict[str, Any]:
    """A stored config.json read through its type: a JSON object of a run kind this version knows, with no field a
    plan does not write and its ``models`` (and ``labels``) non-empty lists of text; InputError naming ``where``."""
    from certeval.messages import shown

    if not isinstance(config, dict):
        raise InputError(f"{where} is not a JSON object")
    if config.get("kind") not in KINDS:
        raise InputError(f"{where} has kind {shown(config.get('kind'))}, not one of {', '.join(KINDS)}")
    known = {f.name for f in fields(RunPlan)} - {"options"} | set(CONFIG_EXTRAS)
    unknown = sorted(set(config) - known)
    if unknown:
        raise InputError(f"{where} has unknown field {shown(unknown[0])}; it was not written by this version of "
                         "certeval")
    for key in ("models", "labels"):
        value = config.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise InputError(f"{where}: {key} must be a non-empty list of text, got {shown(value)}")
    if len(config["labels"]) != len(config["models"]):
        raise InputError(f"{where}: {len(config['labels'])} labels for {len(config['models'])} models")
    return config


def claim_run(plan: RunPlan) -> bool:
    """Write config.json for a new run or check it matches (resume); True when another command started the run
    (a claim by the command that wrote config.json, e.g. the CLI and then its flow, is not a resume)."""
    store = plan.store()
    stored = store.read_config()
    if stored is not None:
        check_same_files(stored, plan)
    return store.claim(plan.config(), COMPARED)


def check_same_files(stored: dict[str, Any], plan: RunPlan) -> None:
    """A resumed run scores each model from the files it started with: rounds scored on two versions of a
    checkpoint folder would be one interval over two models. Runs stored before fingerprints are not checked."""
    recorded = stored.get("fingerprints")
    if not isinstance(recorded, list) or not plan.fingerprints or list(stored.get("models") or []) != list(plan.models):
        return
    for label, then, now in zip(plan.labels, recorded, plan.fingerprints):
        if isinstance(then, dict) and then.get("covers") == now.covers and then.get("digest") != now.digest:
            raise InputError(f"run id {plan.run_id!r} in {plan.output!r} scored model {label!r} from other files "
                             f"(fingerprint {then.get('digest')} then, {now.digest} now: its weights or tokenizer "
                             "changed); resuming would mix two models in one interval — use another --run-id")


def _labels(specs: list[ModelSpec]) -> tuple[str, ...]:
    labels: list[str] = []
    for spec in specs:
        label = spec.label
        if label in labels:
            label = f"{label}-{len(labels)}"
        labels.append(label)
    return tuple(labels)


def _positive_int(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)
