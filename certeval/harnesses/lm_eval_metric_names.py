"""The metric names an lm-eval task may list: what lm-eval computes for its output type.

lm-eval's ``ConfigurableTask.process_results`` (0.4.13) returns, for a log-likelihood output type, only the metrics
it knows by name from the same responses; a listed name it does not know (``acc_nrom``) is logged and then missing
from the results, and certeval would have certified the task's other metric in its place. A ``generate_until``
task's metrics are lm-eval's registered metric functions (anything else lm-eval looks up in HF evaluate, a
download). A misspelled name is refused when the bank is built, before anything starts, naming the metrics the
task can give.
"""

from __future__ import annotations

from certeval.errors import InputError

# ConfigurableTask.process_results, per output type: the names it computes from one doc's responses
COMPUTED = {
    "multiple_choice": ("acc", "acc_norm", "acc_bytes", "acc_mutual_info", "exact_match", "f1", "mcc",
                        "brier_score", "likelihood"),
    "loglikelihood": ("perplexity", "acc"),
    "loglikelihood_rolling": ("word_perplexity", "byte_perplexity", "bits_per_byte"),
}


def known_metrics(output_type: str) -> tuple[str, ...]:
    """The names lm-eval computes for ``output_type`` (a ``generate_until`` task: its registered metrics)."""
    if output_type in COMPUTED:
        return COMPUTED[output_type]
    try:
        import lm_eval.api.metrics  # noqa: F401  (registers lm-eval's metric functions)
        from lm_eval.api.registry import metric_registry
    except ImportError:  # no lm-eval: --tasks says so in one line when it loads the task
        return ()

    return tuple(sorted(name for name in metric_registry.keys() if name != "bypass"))


def check_metric_names(config: dict, flag: str, value: str) -> None:
    """Every metric a task YAML (``config``, includes merged) lists by name is one lm-eval computes for its output
    type (lm-eval's default: ``generate_until``); a task with its own ``process_results`` names its own metrics,
    and a metric that is code or HF evaluate's is judged when the bank is built."""
    if config.get("process_results") is not None:
        return
    output_type = str(config.get("output_type") or "generate_until")
    known = known_metrics(output_type)
    if not known:
        return
    for entry in config.get("metric_list") or []:
        metric = entry.get("metric") if isinstance(entry, dict) else None
        if isinstance(metric, str) and not entry.get("hf_evaluate") and metric not in known:
            raise InputError(f"{flag} {value!r}: task {config.get('task')!r} lists metric {metric!r}, which lm-eval "
                             f"does not compute for a {output_type} task; it can give {', '.join(known)}")
