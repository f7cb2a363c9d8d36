"""What a report says first: the question, the statement made (margin, ε, top-K, half-width) and the answer in
words, read from the typed results.json (:class:`certeval.record.results.RunResults`; split from
:mod:`certeval.reports.run_report`; the same wording as the console's)."""

from __future__ import annotations

import math
from typing import Any

from certeval.estimators.distribution.ranking import rank_numbers
from certeval.record.results import ABSENT, ModelResult, RunResults
from certeval.runs.progress import SELECTION_WORDS as STATUS_TEXT  # a selection's statuses: one wording on every screen

from .plots import VERDICT_TEXT, spell_verdict

RunData = Any  # certeval.reports.run_report.RunData (a run folder's results, rounds and config); not imported: no cycle


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        if not math.isfinite(value):
            return "–"
        return f"{value:.{digits}f}"
    return str(value).replace("|", "\\|")


def _statement(results: RunResults) -> str | None:
    """A rank run's statements: ``strict``, ``epsilon`` or ``precision`` (None for the other kinds)."""
    return results.ranking.statement if results.kind == "rank" else None


def statement_keys(run: RunData) -> tuple[str, ...]:
    """The settings that state what the run claims, for the report's facts line: the margin only where the statement
    is one at a margin (compare, a strict ranking), ε for ε-statements, the selection's top-K, half-width and
    threshold; never a ``margin 0.0`` beside a statement that has none."""
    kind = run.results.kind
    if kind == "compare":
        return ("margin",)
    if kind == "rank":
        return {"strict": ("margin",), "epsilon": ("epsilon",), "precision": ()}[_statement(run.results) or "strict"]
    if kind == "select":
        return ("top", "halfwidth", "threshold")
    return ()


def model_verdicts(results: RunResults) -> dict[str, str]:
    """Each model's verdict in words, the same on the console (``certeval.cli.pipeline.summary``) and in report.md:
    its rank in the final ranking (ties share a rank), its selection status, the pair's verdict spelled with the
    models' names, or its single-model verdict (precise, above, below) or rule."""
    rank_of = {}
    tie_groups = results.ranking.tie_groups if results.ranking else ()
    for group, rank in zip(tie_groups, rank_numbers(tie_groups)):
        rank_of.update({m: rank for m in group})
    pairs = results.pairs or ()
    out = {}
    for m in results.models:
        d = m.decision
        note = str((d.verdict or d.rule or "") if d else "")
        if m.model in rank_of:
            note = f"rank {rank_of[m.model]}" + (f" ({d.rule})" if d and not d.reached else "")
        elif results.kind == "select" and m.selection_status:
            note = STATUS_TEXT.get(m.selection_status, m.selection_status)
        elif note in VERDICT_TEXT and pairs:  # a pair's verdict, spelled with the models' names
            note = spell_verdict(pairs[0])
        out[m.model] = note
    return out


def _num(value: Any, digits: int = 4) -> str:
    return _fmt(value, digits)


def _listing(results: RunResults) -> str:
    groups = results.ranking.tie_groups if results.ranking else ()
    return "; ".join(f"{rank}. {' = '.join(map(str, group))}" for group, rank in zip(groups, rank_numbers(groups)))


def question_and_statement(results: RunResults) -> tuple[str, str]:
    """What the run asked and the statement it makes (with its margin, ε, top-K or half-width), in words."""
    kind = results.kind
    cfg = results.config
    level = f"{float(results.confidence):g}"
    target = ("the expected score on the items' distribution" if results.target == "distribution"
              else f"the bank mean, {results.aggregate.text},")
    names = [m.model for m in results.models]
    if kind == "certify":
        goal = str(cfg.goal or "")
        what, _, raw = goal.partition("+")[0].partition(":")
        if what == "halfwidth":
            return (f"What is {target} of {', '.join(names)}, to within ±{raw}?".replace(", of", " of"),
                    f"each model's interval holds its bank mean with probability >= {level} and has half-width "
                    f"<= {raw} (goal {goal})")
        return (f"Is {target} of {', '.join(names)} {what} {raw}?".replace(", of", " of"),
                f"each model's interval, holding its bank mean with probability >= {level}, lies entirely above or "
                f"below {raw} (goal {goal})")
    if kind == "compare":
        a, b = (names + ["A", "B"])[:2]
        margin = float(cfg.margin or 0.0)
        return (f"Which of {a} and {b} scores higher on {target}?".replace(",?", "?"),
                f"the difference {a} − {b} has an interval at confidence {level}: one model is better when it clears "
                f"the margin ±{margin:g}, the two are equivalent when it lies inside (−{margin:g}, {margin:g})")
    if kind == "rank":
        statement = _statement(results)
        question = f"How do the {len(names)} models rank by {target}?".replace(",?", "?")
        if statement == "epsilon":
            eps = float(cfg.epsilon or results.ranking.epsilon or 0.0)
            return question, (f"ε-statements with ε = {eps:g}: a model listed in a higher tie group has a bank mean at "
                              f"least that of every model in a lower group minus {eps:g}, all jointly with probability "
                              f">= {level} (no margin)")
        if statement == "precision":
            goal = str(cfg.goal or "")
            return question, (f"every model's bank mean within its interval of half-width <= {goal.partition(':')[2]} "
                              f"(goal {goal}), all jointly with probability >= {level}; a model is ranked above another "
                              "where their intervals do not overlap (no margin)")
        margin = float(cfg.margin or 0.0)
        return question, (f"strict ordering statements at margin {margin:g}: a model is ranked above another where "
                          f"the pair's difference clears {margin:g}, all jointly with probability >= {level}; models not "
                          "separated share a tie group")
    if kind == "select":
        sel = results.selection
        top = int(sel.top or cfg.top or 1)
        eps = cfg.halfwidth if sel.epsilon is ABSENT else sel.epsilon
        threshold = sel.threshold
        which = "the best model" if top == 1 else f"the best {top} models"
        parts = [f"the selection is {which} to within {float(eps or 0.0):g} (an ε-top-{top} with ε = "
                 f"{float(eps or 0.0):g}) with probability >= {level}"]
        if threshold:
            parts.append(f"models surely below {float(threshold):g} are dropped")
        return f"Which is {which} among the {len(names)} models, by {target}?".replace(",?", "?"), "; ".join(parts)
    return f"{kind}", ""


def answer_text(results: RunResults) -> list[str]:
    """The run's answer in words: each model's interval and verdict (certify), the pair's verdict (compare), the
    listing (rank), the selected models (select); whether the goal was reached."""
    kind = results.kind
    verdicts = model_verdicts(results)

    def interval(m: ModelResult) -> str:
        return f"{_num(m.mean)} [{_num(m.lower)}, {_num(m.upper)}]"

    if kind == "compare" and results.pairs:
        p = results.pairs[0]
        return [f"{spell_verdict(p)}: {p.model_a} − {p.model_b} = {_num(p.diff)} [{_num(p.lower)}, {_num(p.upper)}] "
                f"on {p.n_items} items each"]
    if kind == "rank" and results.ranking:
        return [f"{_listing(results)} (best first; models in one group share a rank)"]
    if kind == "select" and results.selection:
        selected = results.selection.selected
        by_name = {m.model: m for m in results.models}
        words = ", ".join(f"{s} {interval(by_name[s])}" if s in by_name else s for s in selected)
        return [f"selected: {words}" if selected else "no model selected (the run ended undecided)"]
    out = []
    for m in results.models:
        d = m.decision
        words = verdicts.get(m.model, "") + (f" ({d.detail})" if d and d.detail else "")
        out.append(f"{m.model}: {interval(m)}, {words}" + ("" if d and d.reached else " (goal not reached)"))
    return out


def answer_section(run: RunData) -> list[str]:
    """The top of every report: the question, the statement made and the answer in words."""
    results = run.results
    question, statement = question_and_statement(results)
    answer = answer_text(results)
    reached = "" if results.reached else (" The run stopped before its goal was reached (the bank or the item "
                                                 "budget ran out): the answer is what it could state.")
    lines = [f"**Question.** {question}", ""]
    if statement:
        lines += [f"**Statement made.** {statement}.", ""]
    if len(answer) == 1:
        lines += [f"**Answer.** {answer[0]}.{reached}", ""]
    else:
        lines += ["**Answer.**" + reached, ""] + [f"- {a}" for a in answer] + [""]
    return lines


