"""The README's command examples run as written, or say what they need; every failure line that says a run folder
is resumable also says what to try.

Each pipeline command of the README's examples block is validated the way the CLI validates it before Ray or
Prefect start (``plan_from_args``: specs, bank, budget, numbers, output); an example that cannot run as written
(an ``s3://`` output) says in its comment what it needs. ``plan`` and ``bounds`` run, and print the numbers their
comments promise. The runtime-failure and interruption lines name the next step: rerun the same command (same
``--run-id``) to resume, ``certeval up`` when Ray or Prefect fail to start.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from certeval.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"
PIPELINE = ("certify", "compare", "rank", "select")


def _examples() -> list[tuple[str, str]]:
    """(command line, its comment) of every ``certeval`` line in the README's first bash block of examples."""
    text = README.read_text()
    block = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if "certeval certify" in b)
    joined = re.sub(r"\\\n\s*", " ", block)
    out = []
    for line in joined.splitlines():
        if line.startswith("certeval "):
            command, _, comment = line.partition("  #")
            out.append((command.strip(), comment.strip()))
    return out


def test_the_readme_has_examples_of_every_pipeline_command():
    kinds = {shlex.split(c)[1] for c, _ in _examples()}
    assert set(PIPELINE) <= kinds and {"plan", "bounds", "backtest"} <= kinds


@pytest.mark.parametrize("command, comment", [e for e in _examples() if shlex.split(e[0])[1] in PIPELINE],
                         ids=lambda v: v[:70] if isinstance(v, str) else v)
def test_every_pipeline_example_validates_as_written_or_says_what_it_needs(command, comment, tmp_path,
                                                                           monkeypatch):
    from certeval.cli import build_parser
    from certeval.cli.pipeline import plan_from_args

    argv = shlex.split(command)[1:]
    if "s3://" in command:  # a bucket of one's own: the example says so (and is not tried: no network here)
        assert "bucket" in comment and "credentials" in comment, command
        return
    # the default ./certeval-runs is checked, never created; the example task's data file is named from the
    # clone's root, where the README's commands run
    monkeypatch.chdir(README.parent if "docs/examples/" in command else tmp_path)
    args = build_parser().parse_args(argv)
    plan, prepared = plan_from_args(args)
    n_items = prepared.bank.n_items
    if plan.max_items is not None:  # a budget the bank can pay (uscapitals has 55 items, not 100)
        assert plan.max_items <= n_items, (command, n_items)
    assert not (tmp_path / "certeval-runs").exists()


@pytest.mark.parametrize("command, comment", [e for e in _examples() if shlex.split(e[0])[1] in ("plan", "bounds")])
def test_plan_and_bounds_print_what_their_comments_say(command, comment, capsys):
    assert main(shlex.split(command)[1:]) == 0
    out = json.dumps(json.loads(capsys.readouterr().out))
    for number in re.findall(r"\d+\.\d+|\d{3,}", comment):
        assert number in out, (command, number)


def test_the_uscapitals_example_and_its_timing_say_the_category_size():
    text = README.read_text()
    from certeval.inputs.trivia import load_trivia_bank

    n = len(load_trivia_bank(categories=["uscapitals"]))
    assert n == 55 and f"`uscapitals` ({n} items" in text


# ------------------------------------------------------------------------------------------ what to try


def _fail_with(monkeypatch, exc: BaseException, *, claimed: bool):
    import certeval.cli.pipeline as pipeline
    from certeval.cli import _failure

    def run(args):
        if claimed:
            _failure.set_run_folder(type("Store", (), {"folder": _Nowhere()})())
        raise exc

    monkeypatch.setattr(pipeline, "run", run)


class _Nowhere:
    def write_bytes(self, rel, body):
        raise OSError("read-only")

    def url(self, rel=""):
        return rel


def _line(capsys) -> str:
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    return lines[0]


ARGV = ["certify", "--model", "replay:bundled:helm_mmlu#openai_ada", "--goal", "halfwidth:0.1"]


def test_a_runtime_failure_of_a_claimed_run_says_to_rerun_the_same_command(monkeypatch, capsys):
    _fail_with(monkeypatch, RuntimeError("disk on fire"), claimed=True)
    assert main(ARGV) == 3
    line = _line(capsys)
    assert "resumable" in line and "rerun the same command (same --run-id)" in line and "certeval up" not in line
    assert line.index("rerun") < line.index("(traceback:")  # the line still ends with where the traceback is


def test_a_failure_of_ray_or_prefect_also_names_certeval_up(monkeypatch, capsys):
    error = type("RaySystemError", (RuntimeError,), {"__module__": "ray.exceptions"})
    _fail_with(monkeypatch, error("GCS unreachable"), claimed=True)
    assert main(ARGV) == 3
    line = _line(capsys)
    assert "rerun the same command" in line and "`certeval up`" in line


def test_a_start_failure_keeps_its_own_hint_once(monkeypatch, capsys):
    from certeval.hosting.ray_setup import START_HINT
    from certeval.runtime.start_retry import StartError

    _fail_with(monkeypatch, StartError(f"Ray's local node did not start in 3 tries (last: timeout); {START_HINT}"),
               claimed=False)
    assert main(ARGV) == 3
    line = _line(capsys)
    assert line.count("certeval up") == 1 and "retry" in line


def test_an_interrupted_run_says_how_to_resume(monkeypatch, capsys):
    _fail_with(monkeypatch, KeyboardInterrupt(), claimed=True)
    assert main(ARGV) == 130
    line = _line(capsys)
    assert "resumable" in line and "rerun the same command (same --run-id)" in line
