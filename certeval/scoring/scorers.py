"""Scorers: how a bank item becomes model requests, and how the model's output becomes a score in [0, 1].

Two kinds, chosen by name (``--scorer`` / the model spec option ``?scorer=``):

``mc-loglik``       multiple choice by log-likelihood: the prompt is scored with each of
                    ``choices`` as continuation; score 1 when the choice with the largest
                    summed log-probability is ``answer`` (lm-eval-harness ``acc``).
``mc-loglik-norm``  the same with log-probability divided by the choice's length in bytes
                    (lm-eval-harness ``acc_norm``).
``greedy``          an lm-eval ``loglikelihood`` doc (LAMBADA): 1 when its continuation is the greedy one
                    (lm-eval's ``acc`` of such a task).
``byte-likelihood`` an lm-eval ``loglikelihood_rolling`` doc: exp(loglik / bytes), certeval's per-doc quantity
                    in (0, 1] (lm-eval's perplexities are corpus ratios: :mod:`certeval.harnesses.lm_eval_output_types`).
``lm-eval-task``    items of lm-eval tasks of several output types: each asked and judged as its own task's
                    first metric.
``exact``           greedy generation; 1 when the stripped answer equals an alias exactly.
``normalized``      greedy generation; 1 when the answer equals an alias after lower-casing and
                    removing punctuation, articles (a, an, the) and extra whitespace
                    (the SQuAD v1.1 ``normalize_answer``, Rajpurkar et al. 2016).
``numeric``         greedy generation; 1 when the last number in the answer equals a number in
                    an alias within a relative tolerance (GSM8K-style answer extraction).
``lm-eval``         an lm-eval task's generated answer judged by the task's own filters and metric, run by
                    lm-eval (items built from a task YAML; ``lm-eval:METRIC,FILTER`` picks one of its
                    metric/filter pairs, else the first): :mod:`certeval.scoring.lm_eval_generation`.
``pkg.module:func`` a custom generation scorer ``func(prediction: str, item: dict) -> float``; a
                    function with attribute ``certeval_kind = "loglik"`` instead receives
                    ``(logliks: list[float], item)`` for the item's ``choices``.

Item fields: ``question`` (or a ready ``prompt``), ``choices`` (list of str) and ``answer``
(index, letter or choice text) for multiple choice — an lm-eval task's item instead holds ``gold`` (lm-eval's gold
index or indices, never rebuilt from text) and ``continuations`` (the exact strings lm-eval scores: its
target_delimiter + each choice); ``answers`` (list of aliases) and/or ``answer`` for generation.
"""

from __future__ import annotations

import importlib
import math
import re
import string
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from certeval.errors import InputError

from . import lm_eval_generation as lm_eval_scoring

LOGLIK = "loglik"
GENERATE = "generate"
MIXED = "mixed"  # each item judged by its own lm-eval task's judge (a run over tasks of several output types)


@dataclass(frozen=True)
class Scorer:
    """A named scoring rule. ``required`` lists field groups; each group needs one of its fields."""

    name: str
    kind: str  # LOGLIK or GENERATE
    judge: Callable[..., float]
    required: tuple[tuple[str, ...], ...]
    resps: bool = False  # a log-likelihood judge given lm-eval's (loglik, is_greedy) per request, not the logliks

    def check_fields(self, columns: Iterable[str], source: str = "bank") -> None:
        """Raise :class:`InputError` naming the first missing field group."""
        have = set(map(str, columns))
        for group in self.required:
            if not have.intersection(group):
                wanted = " or ".join(repr(g) for g in group)
                raise InputError(f"scorer {self.name!r} needs field {wanted} in the {source}; "
                                 f"it has {', '.join(sorted(have)) or 'no fields'}")

    def check_item(self, item: dict[str, Any]) -> None:
        present = [k for k, v in item.items() if not _is_missing(v)]
        self.check_fields(present, source=f"item {item.get('item_id')!r}")


def _is_missing(value: Any) -> bool:
    if value is None:
        return True
    if isinstance(value, float) and math.isnan(value):
        return True
    return False


# ---------------------------------------------------------------- answers

def as_list(value: Any) -> list[Any]:
    """A list from a list, tuple, numpy array (Parquet round-trip) or scalar."""
    if _is_missing(value):
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    return [value]


def answer_aliases(item: dict[str, Any]) -> list[str]:
    """Accepted answers: ``answers`` (or ``aliases``) then ``answer``, as strings, without duplicates."""
    out: list[str] = []
    for key in ("answers", "aliases", "answer"):
        for value in as_list(item.get(key)):
            text = str(value)
            if text not in out:
                out.append(text)
    return out


GOLD = "gold"  # item field: lm-eval's gold choice index(es), as its Task resolved doc_to_target (a list)


def answer_index(item: dict[str, Any]) -> int:
    """Index of the right choice from ``answer``: an int, a digit string, a letter A–Z or the choice text (the one
    choice equal to it, else the one equal to it without surrounding spaces; a text two choices share is refused,
    it names no one choice)."""
    choices = [str(c) for c in as_list(item.get("choices"))]
    answer = item.get("answer")
    iid = item.get("item_id")
    if isinstance(answer, (bool, np.bool_)):
        raise InputError(f"item {iid!r}: answer must be a choice index or text, got {answer!r}")
    if isinstance(answer, (int, np.integer)) or (isinstance(answer, float) and float(answer).is_integer()):
        index = int(answer)
    elif isinstance(answer, str) and (answer in choices or answer.strip() in [c.strip() for c in choices]):
        exact = [i for i, c in enumerate(choices) if c == answer]
        same = exact or [i for i, c in enumerate(choices) if c.strip() == answer.strip()]
        if len(same) > 1:
            raise InputError(f"item {iid!r}: answer {answer!r} is the text of choices {same}; give the gold's index")
        index = same[0]
    elif isinstance(answer, str) and answer.strip().isdigit():
        index = int(answer.strip())
    elif isinstance(answer, str) and len(answer.strip()) == 1 and answer.strip().upper() in string.ascii_uppercase:
        index = string.ascii_uppercase.index(answer.strip().upper())
    else:
        raise InputError(f"item {iid!r}: answer {answer!r} is neither a choice index, a letter nor one of its choices")
    if not 0 <= index < len(choices):
        raise InputError(f"item {iid!r}: answer index {index} is outside its {len(choices)} choices")
    return index


def gold_indices(item: dict[str, Any]) -> list[int]:
    """The right choices' indices: the item's ``gold`` (lm-eval's gold index or indices, never rebuilt from text)
    when it has one, else :func:`answer_index`. A choice is right when the prediction is one of them (lm-eval's
    ``pred in gold`` for a task of several golds)."""
    golds = as_list(item.get(GOLD))
    if not golds:
        return [answer_index(item)]
    n = len(as_list(item.get("choices")))
    out = []
    for gold in golds:
        if isinstance(gold, (bool, np.bool_)) or not isinstance(gold, (int, np.integer)) or not 0 <= gold < n:
            raise InputError(f"item {item.get('item_id')!r}: gold {gold!r} is not a choice index among its {n} "
                             "choices")
        out.append(int(gold))
    return out


# ---------------------------------------------------------------- text matching

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCT = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower case, drop punctuation and articles, collapse whitespace."""
    text = str(text).lower().translate(_PUNCT)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, aliases: Sequence[str]) -> float:
    pred = str(prediction).strip()
    return float(any(pred == str(a).strip() for a in aliases))


def normalized_match(prediction: str, aliases: Sequence[str]) -> float:
    pred = normalize_answer(prediction)
    if not pred:  # an empty answer matches nothing, not even an alias that normalises to ""
        return 0.0
    return float(any(pred == normalize_answer(a) for a in aliases))


_NUMBER = re.compile(
    r"(?<![\d.])([-+]?\d+)\s*/\s*(\d+)(?![\d.])"            # a simple fraction a/b
    r"|[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"  # 1,234.5 / 42 / 1e3
    r"|[-+]?\.\d+"                                                  # .5
)


def parse_numbers(text: str) -> list[float]:
    """Every number in ``text``, in order (thousands separators, decimals, exponents, fractions a/b)."""
    out: list[float] = []
    for match in _NUMBER.finditer(str(text)):
        if match.group(1) is not None:
            denominator = int(match.group(2))
            if denominator != 0:
                out.append(int(match.group(1)) / denominator)
        else:
            out.append(float(match.group(0).replace(",", "")))
    return out


def numeric_match(prediction: str, aliases: Sequence[str], rel_tol: float = 1e-4, abs_tol: float = 1e-9) -> float:
    """1 when the last number of the prediction equals a number given by an alias (within tolerance)."""
    numbers = parse_numbers(prediction)
    if not numbers:
        return 0.0
    guess = numbers[-1]
    for alias in aliases:
        targets = parse_numbers(alias)
        if any(math.isclose(guess, t, rel_tol=rel_tol, abs_tol=abs_tol) for t in targets):
            return 1.0
    return 0.0


def extract_answer(generated: str) -> str:
    """The short answer in a completion: its first non-empty line, without an ``A:``/``Answer:`` prefix."""
    for line in str(generated).splitlines():
        line = line.strip()
        if line:
            return re.sub(r"^(answer|a)\s*:\s*", "", line, flags=re.IGNORECASE).strip()
    return ""


# ---------------------------------------------------------------- prompts

FEWSHOT_QA = (
    "Answer each trivia question with a short answer.\n\n"
    "Q: What is the capital city of France?\nA: Paris\n\n"
    "Q: Which planet is known as the Red Planet?\nA: Mars\n\n"
    "Q: How many legs does a spider have?\nA: 8\n\n"
    "Q: Who wrote the play Romeo and Juliet?\nA: William Shakespeare\n\n"
)


def generation_prompt(item: dict[str, Any], fewshot: str = FEWSHOT_QA) -> str:
    """The item's ``prompt`` if it has one, else a few-shot short-answer prompt ending in ``A:``."""
    if not _is_missing(item.get("prompt")):
        return str(item["prompt"])
    question = " ".join(str(item["question"]).split())
    return f"{fewshot}Q: {question}\nA:"


def generation_requests(items: Sequence[dict[str, Any]], max_new_tokens: int) -> list[lm_eval_scoring.GenerationRequest]:
    """Each item's greedy generation: an lm-eval item's own stop strings and budget, else a newline and
    ``max_new_tokens``."""
    return [lm_eval_scoring.generation_request(item, generation_prompt(item), max_new_tokens) for item in items]


CONTINUATIONS = "continuations"  # item field: the exact continuation of each choice (an lm-eval task's delimiter)


def mc_request(item: dict[str, Any]) -> tuple[str, list[str]]:
    """(context, continuations) for log-likelihood multiple choice: an lm-eval item's own (its context and
    ``continuations``: the task's target_delimiter + each choice), else lm-eval's `Question: … Answer:` format and
    " " + each choice."""
    choices = [str(c) for c in as_list(item.get("choices"))]
    if len(choices) < 2:
        raise InputError(f"item {item.get('item_id')!r}: multiple choice needs at least 2 choices, got {len(choices)}")
    if not _is_missing(item.get("prompt")):
        context = str(item["prompt"])
    else:
        context = f"Question: {' '.join(str(item['question']).split())}\nAnswer:"
    continuations = [str(c) for c in as_list(item.get(CONTINUATIONS))]
    if continuations:
        if len(continuations) != len(choices):
            raise InputError(f"item {item.get('item_id')!r}: {len(continuations)} continuations for {len(choices)} "
                             "choices")
        return context, continuations
    return context, [" " + c for c in choices]


def loglik_requests(item: dict[str, Any]) -> list[tuple[str, str]] | str:
    """What a log-likelihood item asks: an lm-eval task's own (context, continuation) pairs (a loglikelihood or
    Winogrande-style doc, :mod:`certeval.harnesses.lm_eval_output_types`), the text of a rolling doc (a str), else
    :func:`mc_request`'s pairs."""
    from certeval.harnesses import lm_eval_output_types

    pairs = lm_eval_output_types.string_pairs(item)
    if pairs is not None:
        return pairs
    text = lm_eval_output_types.rolling_text(item)
    if text is not None:
        return text
    context, continuations = mc_request(item)
    return [(context, c) for c in continuations]


# ---------------------------------------------------------------- judges

def _judge_mc(logliks: Sequence[float], item: dict[str, Any]) -> float:
    # lm-eval's acc: the first choice of largest log-likelihood is a gold one
    return float(int(np.argmax(np.asarray(logliks, dtype=float))) in gold_indices(item))


def _judge_mc_norm(logliks: Sequence[float], item: dict[str, Any]) -> float:
    # lm-eval's acc_norm: each choice's log-likelihood over the choice's length in characters (its
    # process_results for multiple_choice: completion_len = len(choice), the delimiter not counted)
    lengths = np.array([max(1, len(str(c))) for c in as_list(item.get("choices"))], dtype=float)
    return float(int(np.argmax(np.asarray(logliks, dtype=float) / lengths)) in gold_indices(item))


def _judge_exact(prediction: str, item: dict[str, Any]) -> float:
    return exact_match(extract_answer(prediction), answer_aliases(item))


def _judge_normalized(prediction: str, item: dict[str, Any]) -> float:
    return normalized_match(extract_answer(prediction), answer_aliases(item))


def _judge_numeric(prediction: str, item: dict[str, Any]) -> float:
    return numeric_match(extract_answer(prediction), answer_aliases(item))


def _judge_greedy(resps: Sequence[Sequence[Any]], item: dict[str, Any]) -> float:
    # lm-eval's acc of a loglikelihood doc (LAMBADA): the continuation is the greedy one
    return float(bool(resps[0][1]))


def _judge_byte_likelihood(resps: Sequence[Sequence[Any]], item: dict[str, Any]) -> float:
    from certeval.harnesses.lm_eval_output_types import per_doc_value

    return float(per_doc_value("byte_likelihood", [list(r) for r in resps], item))


def item_scorer(item: dict[str, Any]) -> Scorer:
    """The judge of one item of a run over lm-eval tasks of several output types: its own task's
    (:func:`certeval.harnesses.lm_eval_output_types.item_scorer_name`)."""
    from certeval.harnesses.lm_eval_output_types import item_scorer_name

    return get_scorer(item_scorer_name(item), allow_import=False)


def _judge_by_task(output: Any, item: dict[str, Any]) -> float:
    # ``output`` is what the item's own judge takes (the host asks each item as its own task does)
    return item_scorer(item).judge(output, item)


_TEXT = ("question", "prompt")
_ANSWERS = ("answers", "aliases", "answer")
BUILTIN: dict[str, Scorer] = {
    "mc-loglik": Scorer("mc-loglik", LOGLIK, _judge_mc, (_TEXT, ("choices",), ("answer", GOLD))),
    "mc-loglik-norm": Scorer("mc-loglik-norm", LOGLIK, _judge_mc_norm, (_TEXT, ("choices",), ("answer", GOLD))),
    "greedy": Scorer("greedy", LOGLIK, _judge_greedy, (("lm_eval_requests",),), resps=True),
    "byte-likelihood": Scorer("byte-likelihood", LOGLIK, _judge_byte_likelihood, (("lm_eval_requests",),),
                              resps=True),
    "exact": Scorer("exact", GENERATE, _judge_exact, (_TEXT, _ANSWERS)),
    "normalized": Scorer("normalized", GENERATE, _judge_normalized, (_TEXT, _ANSWERS)),
    "numeric": Scorer("numeric", GENERATE, _judge_numeric, (_TEXT, _ANSWERS)),
}


def get_scorer(name: str, *, allow_import: bool = True) -> Scorer:
    """A built-in scorer by name, or a custom one by import path ``package.module:function``.

    ``allow_import=False`` for names read from stored artifacts (a run folder someone hands over): a custom scorer
    is then refused, never imported, since importing a module runs its code; only a name the user passes on the
    command line is imported.
    """
    if not isinstance(name, str) or not name:
        raise InputError(f"scorer must be a name ({', '.join(BUILTIN)}) or package.module:function, got {name!r}")
    if name in BUILTIN:
        return BUILTIN[name]
    if name == "lm-eval-task":
        return Scorer(name, MIXED, _judge_by_task, (("lm_eval_judge",),))
    if lm_eval_scoring.is_lm_eval_scorer(name):
        judge_fn, required = lm_eval_scoring.scorer_parts(name)
        return Scorer(name, GENERATE, judge_fn, required)
    if ":" not in name:
        raise InputError(f"unknown scorer {name!r}; scorers: {', '.join(BUILTIN)}, or package.module:function")
    if not allow_import:
        raise InputError(f"scorer {name!r} is named by a stored artifact; custom scorers are imported only when "
                         "given on the command line")
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"scorer {name!r}: cannot import module {module_name!r} ({exc})") from None
    func = getattr(module, attr, None)
    if not callable(func):
        raise InputError(f"scorer {name!r}: module {module_name!r} has no function {attr!r}")
    kind = getattr(func, "certeval_kind", GENERATE)
    if kind not in (LOGLIK, GENERATE):
        raise InputError(f"scorer {name!r}: certeval_kind must be 'loglik' or 'generate', got {kind!r}")
    required = tuple(tuple(g) if isinstance(g, (list, tuple)) else (g,) for g in getattr(func, "required_fields", ()))
    if not required:
        required = (_TEXT, ("choices",)) if kind == LOGLIK else (_TEXT,)
    return Scorer(name, kind, func, required)


def default_scorer_name(columns: Iterable[str]) -> str:
    """``lm-eval`` for generation items of an lm-eval task (its filters and metric), ``mc-loglik`` for banks with
    ``choices``, else ``normalized``."""
    columns = set(columns)
    if lm_eval_scoring.SCORING in columns:
        return lm_eval_scoring.SCORER
    return "mc-loglik" if "choices" in columns else "normalized"


def resolve_scorer(name: str | None, columns: Iterable[str], source: str = "bank") -> Scorer:
    """The scorer to use (``None``/``auto`` picks by the bank's fields), checked against the bank's fields. Items
    imported from lm-eval ``generate_until`` requests need a named scorer: lm-eval's filters and metric are not
    in its samples file, and certeval never judges silently in another way."""
    columns = list(columns)
    if name in (None, "", "auto") and "lm_eval_generate_until" in columns and lm_eval_scoring.SCORING not in columns:
        raise InputError(f"{source} holds lm-eval generate_until items, whose filters and metric are not in lm-eval's "
                         "samples file: pass --scorer NAME (e.g. exact, contains, numeric) to choose certeval's "
                         "judge explicitly")
    scorer = get_scorer(default_scorer_name(columns) if name in (None, "", "auto") else name)
    scorer.check_fields(columns, source)
    return scorer


def output_text(output: Any, item: dict[str, Any]) -> str:
    """What the model answered, as text: the generated answer, or the top choice for log-likelihood."""
    if isinstance(output, str):  # an lm-eval item's answer is kept whole, as lm-eval records it
        return output if lm_eval_scoring.GENERATION in item else extract_answer(output)
    choices = as_list(item.get("choices"))
    try:
        return str(choices[int(np.argmax(np.asarray(output, dtype=float)))])
    except (IndexError, ValueError):
        return ""


def judge(scorer: Scorer, output: Any, item: dict[str, Any]) -> float:
    """Apply a scorer's judge and check the result is a number in [0, 1]."""
    value = scorer.judge(output, item)
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise InputError(f"scorer {scorer.name!r} returned {value!r} for item {item.get('item_id')!r}; "
                         "expected a number in [0, 1]") from None
    if not 0.0 <= score <= 1.0:
        raise InputError(f"scorer {scorer.name!r} returned {score!r} for item {item.get('item_id')!r}; "
                         "expected a number in [0, 1]")
    return score
