"""One spelling of every request field (issue 57): each field's name and default is written once, in its request
class (certeval/requests.py), and every flag of ``certeval certify|compare|rank|select`` and ``certeval backtest
COMMAND`` that sets a request field is generated from it. A control plants a second spelling and is caught.
Cost: parsing only (well under a second)."""

from __future__ import annotations

import argparse
import ast
from dataclasses import fields
from pathlib import Path

import pytest

from certeval.cli import build_parser
from certeval.cli.request_flags import backtest_fields, request_fields
from certeval.requests import REQUESTS, BacktestOptions, field_default, field_help

ROOT = Path(__file__).resolve().parents[1] / "certeval"
# the modules a request goes through from the command line to the verbs: none may spell a field's default again
REQUEST_PATH = ("cli/pipeline.py", "cli/request_flags.py", "cli/surfaces.py", "api.py", "reports/preview.py",
                "backtests/commands.py", "runs/plan.py", "runs/plan_checks.py")


def _declared(source: str) -> dict[str, list[str]]:
    """Per field name, the request classes whose bodies declare it (annotated assignments)."""
    out: dict[str, list[str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name) \
                        and "ClassVar" not in ast.unparse(item.annotation):
                    out.setdefault(item.target.id, []).append(node.name)
    return out


def test_each_field_is_declared_in_exactly_one_request_class():
    declared = _declared((ROOT / "requests.py").read_text())
    names = {f.name for cls in (*REQUESTS.values(), BacktestOptions) for f in fields(cls)}
    assert names <= set(declared)
    assert {name: owners for name, owners in declared.items() if len(owners) != 1} == {}


def test_the_check_catches_a_field_declared_twice():
    twice = "class A:\n    margin: float = 0.0\nclass B:\n    margin: float = 0.1\n"
    assert _declared(twice) == {"margin": ["A", "B"]}


def _subparser(parser: argparse.ArgumentParser, *path: str) -> argparse.ArgumentParser:
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


def _generated_mismatches(parser: argparse.ArgumentParser, kind: str, live: bool) -> list[str]:
    by_dest: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        by_dest.setdefault(action.dest, []).append(action)
    wrong = []
    for f in request_fields(kind, live=live):
        actions = by_dest.get(f.name, [])
        default = field_default(f)
        if len(actions) != 1:
            wrong.append(f"{kind}: {len(actions)} flags set {f.name}")
            continue
        action = actions[0]
        if tuple(action.option_strings) != f.metadata["flags"]:
            wrong.append(f"{kind}: {f.name} spelled {action.option_strings}")
        if action.default != (list(default) if isinstance(default, tuple) else default):
            wrong.append(f"{kind}: {f.name} defaults to {action.default!r}, the request to {default!r}")
        if live and action.help != field_help(f, kind):
            wrong.append(f"{kind}: {f.name}'s help is not the request's")
    return wrong


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_every_request_flag_of_the_commands_is_generated_from_its_field(kind):
    parser = build_parser()
    assert _generated_mismatches(_subparser(parser, kind), kind, live=True) == []
    assert _generated_mismatches(_subparser(parser, "backtest", kind), kind, live=False) == []
    backtest_dests = {a.dest for a in _subparser(parser, "backtest", kind)._actions}
    assert not {f.name for f in request_fields(kind) if f.metadata.get("live")} & backtest_dests


@pytest.mark.parametrize("kind", list(REQUESTS))
def test_every_backtest_option_of_backtest_command_is_generated_from_its_field(kind):
    """``certeval backtest KIND``'s own options (--scores, --reps, --pairs, --history-fraction, ...) are
    :class:`BacktestOptions`'s fields: one flag each, its spelling, default and help; a field KIND does not read
    has no flag there."""
    parser = _subparser(build_parser(), "backtest", kind)
    by_dest = {}
    for action in parser._actions:
        by_dest.setdefault(action.dest, []).append(action)
    read = backtest_fields(kind)
    for f in read:
        (action,) = by_dest[f.name]
        assert tuple(action.option_strings) == f.metadata["flags"] and action.default == field_default(f)
        assert action.help == field_help(f, kind)
    assert ({f.name for f in fields(BacktestOptions)} - {f.name for f in read}) & set(by_dest) == set()
    assert {"scores", "reps"} <= {f.name for f in read}


def test_the_check_catches_a_flag_written_by_hand():
    parser = argparse.ArgumentParser()
    parser.add_argument("--margin", type=float, default=0.05)  # a second spelling of the margin's default
    assert any("margin defaults to 0.05" in w for w in _generated_mismatches(parser, "compare", live=False))


def _respelled(path: Path) -> list[str]:
    """``getattr(x, "FIELD", default)`` and ``add_argument("--FLAG", ...)`` of a request field in ``path``."""
    names = {f.name for cls in REQUESTS.values() for f in fields(cls)}
    flags = {flag for cls in REQUESTS.values() for f in fields(cls) for flag in f.metadata.get("flags", ())}
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.Call):
            continue
        func = ast.unparse(node.func)
        literal = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if func == "getattr" and len(node.args) == 3 and literal and literal[0] in names:
            out.append(f"{path.name}:{node.lineno} getattr {literal[0]!r} with a default")
        if func.endswith("add_argument") and set(literal) & flags:
            out.append(f"{path.name}:{node.lineno} add_argument {sorted(set(literal) & flags)}")
    return out


def test_no_module_on_the_request_path_spells_a_field_again():
    assert [w for rel in REQUEST_PATH for w in _respelled(ROOT / rel)] == []


def test_the_scan_catches_a_default_spelled_again(tmp_path):
    planted = tmp_path / "planted.py"
    planted.write_text('def f(args, p):\n    getattr(args, "in_flight", 2)\n    p.add_argument("--confidence")\n')
    assert len(_respelled(planted)) == 2
