"""Human report of a run folder: ``report.md`` (+ optional ``report.html``) and PNG plots.

Reads the run layout of docs/architecture.md §5 from a local path or any fsspec URL (results.json through its
type, :class:`certeval.record.results.RunResults`)::

    config.json  rounds/<n>.parquet  state/<model>.json  results.json

and writes, into the same folder:

* ``interval_curve.png`` — the interval vs items scored, per model (like Arviv et al. 2026, Fig. 1), drawn as
  steps at the looks (one panel, or one small panel per model beyond four), read from the look log in
  ``rounds/*.parquet`` (the estimate recorded at every look; a ranking or
  selection: each model's simultaneous interval). Nothing here re-runs an estimator: a run written before the
  look log existed simply has no curve.
* ``ranking.png`` — every model's interval, best first, coloured by tie group.
* ``differences.png`` — compare/rank: each pair's paired difference with its interval, coloured decided /
  equivalent / undecided for the statement the run made, with its boundaries: 0 and the equivalence-margin band,
  or −ε and +ε for an ε-ranking (a compare run adds the running difference per look).
* ``savings.png`` — items saved vs the goal (like Cer-Eval's Fig. 2, Wang et al. 2025, arXiv:2505.03814), when a
  benchmark JSON with ``cells`` is given (``--savings``).
* ``report.md`` — the tables: estimates and decisions (which rule fired), ranking with tie
  groups, pairs, savings; links to the plots.

Inside a Prefect flow or task, :func:`publish_artifacts` also publishes the markdown and the
model table as Prefect artifacts (``create_markdown_artifact`` / ``create_table_artifact``).
"""

from __future__ import annotations

import html as _html
import json
import math
import os
import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from certeval.errors import InputError
from certeval.estimators.distribution.comparison import Comparison
from certeval.estimators.distribution.ranking import rank_numbers
from certeval.estimators.results import Decision
from certeval.record.results import ModelResult, RunResults, read_record
from certeval.storage import (
    MAX_RECORD_BYTES,
    Folder,
    bounded,
    check_folder,
    filesystem,
    is_local,
    read_file,
    verify_record,
)

from .answer import _fmt, answer_section, model_verdicts, statement_keys
from .plots import differences_caption as pairs_caption
from .plots import (
    model_colours,
    plot_differences,
    plot_interval_curves,
    plot_ranking,
    plot_savings,
    savings_frame,
    spell_verdict,
)

# --------------------------------------------------------------------------------------
# reading a run
# --------------------------------------------------------------------------------------


@dataclass
class RunData:
    url: str
    folder: Folder
    config: dict[str, Any]
    results: RunResults
    rounds: pd.DataFrame

    @property
    def models(self) -> tuple[ModelResult, ...]:
        return self.results.models


def load_run(run: str) -> RunData:
    """Read a run folder; raise :class:`InputError` naming the folder when it is not one."""
    fs, path = filesystem(str(run))
    folder = Folder(fs, path)
    if is_local(fs) and os.path.lexists(path):  # a pipe, a file or a link loop in its place: one line
        check_folder(str(run), "run folder")
    if bounded(fs, "isfile", path):
        raise InputError(f"{run!r} is a file, not a run folder")
    try:
        results = folder.read_json("results.json")
        config = folder.read_json("config.json") or {}
    except json.JSONDecodeError as exc:
        raise InputError(f"run folder {run!r} has an unreadable JSON file: {exc}") from None
    if results is None:
        raise InputError(f"{run!r} is not a run folder: it has no results.json")
    # the typed record: not a newer schema, an unknown kind, field or part
    results = read_record(results, f"run folder {run!r} is damaged: results.json")
    if not isinstance(config, dict):
        raise InputError(f"run folder {run!r} is damaged: config.json is not a JSON object")
    if config.get("integrity"):  # an edited, deleted or stray round is refused, never drawn (older runs: no manifest)
        verify_record(folder)
    frames = []
    for name in folder.list("rounds"):
        if not name.endswith(".parquet"):
            continue
        frame = folder.read_parquet(f"rounds/{name}")
        if frame is not None:
            missing = [c for c in ROUND_COLUMNS if c not in frame.columns]
            if missing:
                raise InputError(f"run folder {run!r} is damaged: rounds/{name} has no {missing[0]!r} column")
            frames.append(frame)
    rounds = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return RunData(folder.url(), folder, config, results, rounds)


ROUND_COLUMNS = ("model", "item_id", "score")


# --------------------------------------------------------------------------------------
# interval curves
# --------------------------------------------------------------------------------------


LOOK_COLUMNS = ("look_n_scored", "look_mean", "look_lower", "look_upper")


GROUP_COLUMNS = ("look_n_scored", "look_group_mean", "look_group_lower", "look_group_upper")
PAIR_COLUMNS = ("look_n_scored", "look_pair_diff", "look_pair_lower", "look_pair_upper")


def _logged(rounds: pd.DataFrame, model: str, columns: tuple[str, ...]) -> list[tuple] | None:
    """``columns`` at every look of ``model`` as recorded with the rounds (the look log); None if not recorded."""
    if rounds.empty or not set(columns) <= set(rounds.columns) or "round" not in rounds.columns:
        return None
    sub = rounds[rounds["model"].astype(str) == str(model)]
    if sub.empty or sub[list(columns[1:])].isna().all(axis=None):
        return None
    looks = sub.sort_values("round").groupby("round", sort=True)[list(columns)].first()  # a look's rows agree
    return [(int(n), *(float(v) for v in rest)) for n, *rest in looks.itertuples(index=False)]


def look_log_curve(rounds: pd.DataFrame, model: str) -> list[tuple[int, float, float, float]] | None:
    """(n_scored, mean, lower, upper) per look as recorded in the rounds (the look log); None if not recorded.

    A ranking or selection records each model's simultaneous interval (the one its verdicts use) beside the
    model's own; the curve shows that one, so the plot answers the same question as the ranking."""
    return _logged(rounds, model, GROUP_COLUMNS) or _logged(rounds, model, LOOK_COLUMNS)


def model_curves(run: RunData) -> dict[str, list[tuple[int, float, float, float]]]:
    """The interval curve of every model in ``results.json`` that has one (see module docstring).

    Runs that record a look log (``look_*`` columns in ``rounds/``) are drawn from it: the curve then
    shows exactly the estimates the run computed; a run from before the look log has no curve.
    """
    curves: dict[str, list[tuple[int, float, float, float]]] = {}
    for entry in run.models:
        logged = look_log_curve(run.rounds, entry.model)
        if logged is not None:  # runs from before the look log have no curve: nothing is re-run to make one
            curves[entry.model] = logged
    return curves


# --------------------------------------------------------------------------------------
# tables
# --------------------------------------------------------------------------------------


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    """A GitHub-flavoured markdown table (tabulate's ``pipe`` format) of values formatted by :func:`_fmt`."""
    from tabulate import tabulate

    return tabulate([[_fmt(v) for v in row] for row in rows], headers=headers, tablefmt="pipe",
                    disable_numparse=True)


NO_DECISION = Decision(done=False)


def model_rows(run: RunData) -> list[dict[str, Any]]:
    """One flat row per model: estimate, interval, items, the rule that fired."""
    rows = []
    for e in run.models:
        d = e.decision or NO_DECISION
        rows.append({"model": e.model, "mean": e.mean, "lower": e.lower, "upper": e.upper, "n_scored": e.n_scored,
                     "n_total": e.n_total, "rule": d.rule, "reached": d.reached, "verdict": d.verdict,
                     "detail": d.detail})
    return rows


def paired_difference_curve(run: RunData, pair: Comparison) -> list[tuple[int, float, float, float]]:
    """(items per model, difference, lower, upper) of the pair at every look, as the run recorded it (the look
    log's ``look_pair_*`` columns); empty for runs from before the look log."""
    return _logged(run.rounds, pair.model_a, PAIR_COLUMNS) or []


def ranking_rows(run: RunData) -> list[dict[str, Any]]:
    """Models best first with rank and tie group (1 = best group), from the record's ranking: each with the
    model's one interval (the Estimates table's, the console's)."""
    ranking = run.results.ranking
    if not ranking:
        return []
    by_model = {r["model"]: r for r in model_rows(run)}
    return [{**by_model.get(name, {"model": name}), "group": gi, "rank": rank}
            for gi, (group, rank) in enumerate(zip(ranking.tie_groups, rank_numbers(ranking.tie_groups)), 1)
            for name in group]


# --------------------------------------------------------------------------------------
# the report
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# the question, the statement made and the answer (the top of every report)
# --------------------------------------------------------------------------------------


@dataclass
class Report:
    url: str
    markdown: str
    files: dict[str, str]  # name -> URL
    table: list[dict[str, Any]]


def build_markdown(run: RunData, *, curves_png: bool, ranking: list[dict[str, Any]], savings_cells: list[dict],
                   savings_png: bool, differences_png: bool = False, curves_caption: str | None = None,
                   differences_caption: str | None = None) -> str:
    cfg = run.config
    title = cfg.get("run_id") or run.url.rstrip("/").rsplit("/", 1)[-1]
    lines = [f"# certeval report: {title}", ""]
    facts = []
    for key in ("kind", "command", "target", "goal", *statement_keys(run), "method", "confidence", "bank", "scores",
                "seed"):
        if cfg.get(key) is not None:
            facts.append(f"**{key}** `{cfg[key]}`")
    facts.append(f"**estimand** {run.results.aggregate.text}")
    lines += answer_section(run)
    if facts:
        lines += [" · ".join(facts), ""]
    rows = model_rows(run)
    if rows:
        verdicts = model_verdicts(run.results)
        lines += ["## Estimates and decisions", "",
                  markdown_table(["model", "mean", "lower", "upper", "items scored", "bank", "verdict", "rule fired",
                                  "reached", "detail"],
                                 [[r["model"], r["mean"], r["lower"], r["upper"], r["n_scored"], r["n_total"],
                                   verdicts.get(r["model"], ""), r["rule"], r["reached"], r["detail"]] for r in rows]),
                  ""]
    if curves_png:
        lines += ["## Interval vs items scored", "",
                  curves_caption or ("Each band is the confidence interval after each round; the line is the "
                                     "estimate (compare Arviv et al. 2026, Fig. 1)."),
                  "", "![interval vs items scored](interval_curve.png)", ""]
    if ranking:
        epsilon = run.results.ranking.epsilon if run.results.ranking else None
        meaning = ("Models in one tie group could not be separated at the run's confidence." if epsilon is None else
                   f"Epsilon-statements (ε = {epsilon:g}): every model in a higher group has a bank mean at least "
                   f"that of every model in a lower group minus {epsilon:g}, jointly at the run's confidence; "
                   "within a group no order is claimed.")
        lines += ["## Ranking", "", meaning, "",
                  markdown_table(["rank", "group", "model", "mean", "lower", "upper"],
                                 [[r["rank"], r["group"], r["model"], r.get("mean"), r.get("lower"), r.get("upper")]
                                  for r in ranking]), "", "![ranking](ranking.png)", ""]
    pairs = run.results.pairs or ()
    if pairs:
        keys = ("model_a", "model_b", "diff", "lower", "upper", "rule", "n_items", "look")
        lines += ["## Pairs", "", markdown_table(["verdict", *keys], [[spell_verdict(p)] + [getattr(p, k) for k in keys]
                                                                      for p in pairs]), ""]
        if run.results.kind == "compare":
            lines += ["The verdict comes from the pair's difference on the items both models scored, not from the "
                      "two models' own intervals in the table above: the paired difference cancels what the items "
                      "share (their difficulty), so its interval is far narrower than either model's, and a decided "
                      "pair can have overlapping per-model bands.", ""]
        if differences_png:
            lines += [differences_caption or pairs_caption(pairs, run.results.ranking.epsilon
                                                           if run.results.ranking else None),
                      "",
                      "![paired differences](differences.png)", ""]
    if savings_cells:
        frame = savings_frame(savings_cells)
        if not frame.empty:
            cols = [c for c in ("method", "goal", "datasets", "saving_vs_uniform", "saving_vs_full_bank", "coverage")
                    if c in frame.columns]
            lines += ["## Savings vs goal", "",
                      "Mean over datasets of 1 − items/items(uniform) (and of 1 − items/bank size); coverage is the "
                      "lowest measured over datasets (compare Cer-Eval's Fig. 2, Wang et al. 2025).", "",
                      markdown_table(cols, frame[cols].values.tolist()), ""]
            if savings_png:
                lines += ["![savings vs goal](savings.png)", ""]
    return "\n".join(lines).rstrip() + "\n"


def markdown_to_html(markdown: str, title: str = "certeval report") -> str:
    """The report's markdown rendered by a Markdown library (markdown-it-py, CommonMark + tables; raw HTML in the
    text is escaped, not passed through)."""
    from markdown_it import MarkdownIt

    body = MarkdownIt("commonmark", {"html": False}).enable("table").render(markdown)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>{_html.escape(title)}</title>"
            "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}table{border-collapse:collapse}"
            "td,th{border:1px solid #ccc;padding:2px 6px;font-size:90%}img{max-width:100%}</style></head><body>\n"
            f"{body}</body></html>\n")


def _savings_cells(savings: str | None) -> list[dict[str, Any]]:
    """The ``cells`` of a benchmark JSON (``--savings``): items saved against the goal."""
    cells: list[dict[str, Any]] = []
    if savings:
        try:
            doc = json.loads(read_file(str(savings), "--savings", MAX_RECORD_BYTES))
        except json.JSONDecodeError as exc:
            raise InputError(f"--savings {savings!r} is not JSON: {exc}") from None
        extra = doc.get("cells") if isinstance(doc, dict) else None
        if not isinstance(extra, list):
            raise InputError(f"--savings {savings!r} has no 'cells' list (a backtest or efficiency benchmark JSON)")
        cells = extra
    return cells


def write_report(run: str, *, html: bool = False, savings: str | None = None) -> Report:
    """Write report.md (+ report.html) and the PNG plots into the run folder; return what was written."""
    data = load_run(run)
    folder = data.folder
    files: dict[str, str] = {}
    colours = model_colours([m.model for m in data.models])  # one colour per model in every plot
    curves = model_curves(data)
    captions: dict[str, str] = {}  # each plot's caption, made with the plot from the same facts
    if curves:
        drawn = plot_interval_curves(curves, data.config.get("goal"), colours)
        folder.write_bytes("interval_curve.png", drawn.png)
        files["interval_curve.png"] = folder.url("interval_curve.png")
        captions["curves_caption"] = drawn.caption
    ranking = ranking_rows(data)
    if ranking:
        folder.write_bytes("ranking.png", plot_ranking(ranking, colours))
        files["ranking.png"] = folder.url("ranking.png")
    pairs = list(data.results.pairs or ())
    if pairs:
        curve = paired_difference_curve(data, pairs[0]) if len(pairs) == 1 else None
        drawn = plot_differences(pairs, curve, data.results.ranking.epsilon if data.results.ranking else None)
        folder.write_bytes("differences.png", drawn.png)
        files["differences.png"] = folder.url("differences.png")
        captions["differences_caption"] = drawn.caption
    cells = _savings_cells(savings)
    savings_ok = bool(cells) and not savings_frame(cells).empty
    if savings_ok:
        folder.write_bytes("savings.png", plot_savings(cells))
        files["savings.png"] = folder.url("savings.png")
    text = build_markdown(data, curves_png=bool(curves), ranking=ranking, savings_cells=cells, savings_png=savings_ok,
                          differences_png=bool(pairs), **captions)
    folder.write_bytes("report.md", text.encode())
    files["report.md"] = folder.url("report.md")
    if html:
        folder.write_bytes("report.html", markdown_to_html(text).encode())
        files["report.html"] = folder.url("report.html")
    return Report(data.url, text, files, model_rows(data))


def _artifact_key(text: str) -> str:
    key = re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")
    return (key or "run")[:60]


def publish_artifacts(report: Report, key: str | None = None) -> bool:
    """Publish the report as Prefect artifacts when called inside a flow or task run.

    Markdown artifact: the whole report.md; table artifact: one row per model (estimate,
    interval, items, rule). Returns False (and does nothing) outside a Prefect run.
    """
    try:
        from prefect.artifacts import create_markdown_artifact, create_table_artifact
        from prefect.context import get_run_context
        from prefect.exceptions import MissingContextError
    except ImportError:
        return False
    try:
        get_run_context()
    except MissingContextError:
        return False
    base = _artifact_key(key or report.url.rstrip("/").rsplit("/", 1)[-1])
    create_markdown_artifact(markdown=report.markdown, key=f"{base}-report",
                             description=f"certeval report of {report.url}")
    table = [{k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in row.items()}
             for row in report.table]
    if table:
        create_table_artifact(table=table, key=f"{base}-models", description="estimates and decisions per model")
    return True


def report_run(run: str, *, html: bool = False, savings: str | None = None, publish: bool = True) -> Report:
    """What flows call at the end of a run: write the report and, inside Prefect, publish it."""
    rep = write_report(run, html=html, savings=savings)
    if publish:
        publish_artifacts(rep)
    return rep
