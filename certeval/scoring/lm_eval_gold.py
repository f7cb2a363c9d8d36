"""lm-eval's gold rule for a multiple-choice doc: which choice indices are right, as its ``ConfigurableTask``
resolves ``doc_to_target`` in ``process_results``, never rebuilt from text afterwards.

* an int (or an integral number) is the gold's index; it must name one of the doc's choices (lm-eval turns an index
  past the last choice into -100, which no prediction equals, and a negative one is never predicted either:
  certeval refuses both rather than certify a doc nobody can get right);
* a text is the index of the first choice equal to it, character for character (``choices.index``: no stripping,
  so ``" Paris"`` is not ``"Paris"``, and of two equal choices the first is the gold);
* a list, in a task whose first doc's target is a list (lm-eval's ``multiple_target``), is several golds: a
  prediction is right when it is one of them (acc, acc_norm ``pred in gold``; exact_match when any gold is greedy).

A target lm-eval cannot resolve this way (a text that is no choice, an index out of range, a list in a one-gold
task or a single gold in a several-golds task, which lm-eval fails on) is an :class:`InputError` naming the doc.
"""

from __future__ import annotations

import ast
from typing import Any

from certeval.errors import InputError


def _index(value: Any, choices: list[str], where: str, target: Any) -> int:
    if isinstance(value, str):
        if value in choices:
            return choices.index(value)
        raise InputError(f"{where}: target {target!r} is none of its {len(choices)} choices (lm-eval matches a text "
                         "gold to a choice exactly)")
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = float("nan")
    if not number.is_integer() or isinstance(value, (list, tuple, dict)):
        raise InputError(f"{where}: target {target!r} is neither a choice index nor a choice's text")
    if not 0 <= number < len(choices):
        raise InputError(f"{where}: target {target!r} is no index among its {len(choices)} choices (0 to "
                         f"{len(choices) - 1})")
    return int(number)


def gold_indices(target: Any, choices: list[str], several: bool, where: str) -> list[int]:
    """The gold choice indices of one doc whose ``doc_to_target`` gave ``target``; ``several``: the task reads a
    list of golds per doc (lm-eval's ``multiple_target``)."""
    if len(choices) < 2:
        raise InputError(f"{where}: multiple choice needs at least 2 choices, got {len(choices)}")
    if several:
        if not isinstance(target, (list, tuple)) or not target:
            raise InputError(f"{where}: target {target!r} is not a list of golds, but the task's first doc has a "
                             "list (lm-eval reads every doc's target as several golds)")
        if any(isinstance(value, str) for value in target):
            raise InputError(f"{where}: target {target!r} lists a text; lm-eval's several golds are choice indices")
        return [_index(value, choices, where, target) for value in target]
    if isinstance(target, (list, tuple)):
        raise InputError(f"{where}: target {target!r} is a list of golds, but the task's first doc has one gold "
                         "(lm-eval reads every doc's target as one)")
    return [_index(target, choices, where, target)]


def samples_target(value: Any) -> Any:
    """A samples file's ``target`` (lm-eval writes ``str(target)``) as lm-eval's ``doc_to_target`` gave it: digits
    are an index, ``[…]`` a list of golds, anything else a choice's text. (A text gold made of digits reads as an
    index here; a task built from its YAML keeps the target itself.)"""
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        if len(text) >= 2 and text[0] == "[" and text[-1] == "]":
            try:
                parsed = ast.literal_eval(text)
            except (SyntaxError, ValueError):
                return value
            return list(parsed) if isinstance(parsed, (list, tuple)) else value
    return value
