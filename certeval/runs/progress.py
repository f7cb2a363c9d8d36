"""What a run or a backtest shows while it works, on stderr.

On a terminal: live rich bars (one per model: items scored, current interval). Anywhere else (a log file, CI,
a pipe): one plain line per round of a run, and one per model and rep of a backtest, each with the items
scored, the current interval and the time since the start. ``--quiet`` shows nothing. Which of the three a
command gets is :func:`progress_mode`'s answer; standard output (tables, ``--json``) is never touched.
"""

from __future__ import annotations

import sys
import time
from typing import Any

BARS, LINES = "bars", "lines"
MAX_LINE_MODELS = 8  # models listed on one round line


def progress_mode(json_output: bool, quiet: bool = False) -> str | None:
    """``None`` (quiet), ``"bars"`` (a terminal, no ``--json``) or ``"lines"`` (anything else)."""
    if quiet:
        return None
    return BARS if (sys.stderr.isatty() and not json_output) else LINES


def interval_text(n_scored: int, mean: float, lower: float, upper: float) -> str:
    return "no item yet" if n_scored == 0 else f"{mean:.3f} [{lower:.3f}, {upper:.3f}]"


# a selection's statuses in words: the same on the progress lines, the console summary and report.md
SELECTION_WORDS = {"selected": "selected", "not-selected": "not selected", "not-best": "dropped (not among the best)",
                   "below": "dropped (below the threshold)", "discarded": "dropped", "running": "undecided"}


def verdict_text(kind: str, decision: Any) -> str:
    """A decided model's verdict as every screen words it (a selection's status in words, else as decided)."""
    note = str(decision.verdict or decision.rule or "")
    return SELECTION_WORDS.get(note, note) if kind == "select" else note


def say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _model_text(run: Any, label: str) -> str:
    look = run.shown_look(label)  # the look log's record: the interval results.json and the report show
    text = interval_text(look.n_scored, look.mean, look.lower, look.upper)
    decision = run.decisions.get(label)
    if decision is not None and decision.done:
        text += f" {verdict_text(run.plan.kind, decision)}"
    return f"{label} {look.n_scored} scored {text}"


class RunLines:
    """One line per round: ``certeval: certify r1 round 3 (12.4 s): model 150 scored 0.612 [0.540, 0.680]; ...``."""

    def __init__(self, run: Any) -> None:
        self.run = run
        self.t0 = time.monotonic()

    def status(self, text: str | None) -> None:  # lines are rounds only: a log reads one line per round
        pass

    def advance(self, label: str, n: int) -> None:  # a round's line says it all
        pass

    def refresh(self) -> None:
        run = self.run
        shown = list(run.labels[:MAX_LINE_MODELS])
        models = "; ".join(_model_text(run, label) for label in shown)
        if len(run.labels) > len(shown):  # a line per round stays a line: thousands of models are counted, not listed
            models += f"; … {len(run.labels) - len(shown)} more models ({len(run.active)} still in play)"
        say(f"certeval: {run.plan.kind} {run.plan.run_id} round {run.round} ({time.monotonic() - self.t0:.1f} s): "
            f"{models}")

    def close(self) -> None:
        pass


class RunBars:
    """One rich progress bar per model (items scored, current interval); terminal only."""

    def __init__(self, run: Any) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.run = run
        self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[interval]}"), TimeElapsedColumn(), transient=False)
        total = min(run.plan.max_items or run.bank.n_items, run.bank.n_items)
        self.tasks = {label: self.bar.add_task(label[:32], total=total, completed=run.n_scored(label), interval="")
                      for label in run.labels}
        # a status line for the slow steps between rounds (start-up of Ray and model hosts)
        self.status_task = self.bar.add_task("", total=None, interval="", visible=False)
        self.bar.start()
        self.refresh()

    def status(self, text: str | None) -> None:
        """Show ``text`` on the status line (None hides it)."""
        self.bar.update(self.status_task, description=text or "", visible=bool(text))

    def advance(self, label: str, n: int) -> None:
        self.bar.advance(self.tasks[label], n)

    def refresh(self) -> None:
        for label, task in self.tasks.items():
            look = self.run.shown_look(label)  # the same record as the lines, results.json and the report
            text = interval_text(look.n_scored, look.mean, look.lower, look.upper) if look.n_scored else ""
            decision = self.run.decisions.get(label)
            if decision is not None and decision.done:
                text += f"  {verdict_text(self.run.plan.kind, decision)}"
            self.bar.update(task, completed=self.run.n_scored(label), interval=text)

    def close(self) -> None:
        self.bar.stop()


def run_progress(run: Any, mode: str | None) -> RunLines | RunBars | None:
    return RunBars(run) if mode == BARS else (RunLines(run) if mode == LINES else None)


class BacktestProgress:
    """A backtest's progress: a bar on a terminal (runs done of runs in all, the model being replayed), else one
    line per model and rep with its items scored and final interval."""

    def __init__(self, mode: str | None, what: str) -> None:
        self.mode, self.what = mode, what
        self.bar = self.task = None
        self.t0 = time.monotonic()

    def __enter__(self) -> BacktestProgress:
        if self.mode == BARS:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[status]}"), TimeElapsedColumn(), transient=True)
            self.task = self.bar.add_task(f"backtest {self.what}", total=None, status="starting")
            self.bar.start()
        return self

    def update(self, done: int, total: int, model: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, completed=done, total=total, status=model[:40])

    def rows(self, rows: list[dict[str, Any]]) -> None:
        """Replayed reps, each a line (lines mode)."""
        if self.mode != LINES:
            return
        for row in rows:
            if "error" in row:
                text = f"error {row['error']}"
            else:
                text = (f"{row.get('n_scored', 0)} scored "
                        f"{interval_text(row.get('n_scored', 0), row.get('mean'), row.get('lower'), row.get('upper'))}")
            say(f"certeval: backtest {row.get('method')} {row.get('goal')}: {row.get('model')} rep {row.get('rep')}: "
                f"{text} ({time.monotonic() - self.t0:.1f} s)")

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
