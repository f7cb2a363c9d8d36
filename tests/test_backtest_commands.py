"""``certeval backtest COMMAND --scores S [COMMAND's flags] --reps R`` (issue 43): the live command's own request
played on recorded scores, each rep checked against the exact answer; the live run and the backtest's rep 0 with the
same request and seed make the same decisions."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from certeval.cli import main  # noqa: E402

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK, replay, small_scores  # noqa: E402

FOUR = ("openai_gpt-3.5-turbo-0301", "openai_davinci", "openai_ada", "openai_babbage")


@pytest.fixture(scope="module")
def scores(tmp_path_factory) -> str:
    return small_scores(tmp_path_factory.mktemp("bt-commands"), n_items=150)


def _json(capsys, argv: list[str]) -> dict:
    code = main(argv)
    captured = capsys.readouterr()
    assert code == 0, captured.err
    return json.loads(captured.out)


def _models(names=FOUR) -> list[str]:
    return [a for n in names for a in ("--model", n)]


@pytest.mark.parametrize("argv", [
    ["rank", "--goal", "halfwidth:0.1"],
    ["rank", "--epsilon", "0.1"],
    ["select", "--top", "1", "--halfwidth", "0.02"],
    ["select", "--mode", "precision", "--halfwidth", "0.05"],
    ["compare", "--margin", "0.02"],
], ids=["rank-precision", "rank-epsilon", "select-top", "select-precision", "compare"])
def test_each_command_reports_fraction_and_errors(argv, capsys):
    kind = argv[0]
    models = _models(FOUR[:2]) if kind == "compare" else _models()
    out = _json(capsys, ["backtest", kind, "--scores", SCORES, *argv[1:], *models, "--reps", "1", "--json"])
    answer = out["answer"]
    assert 0.0 < answer["fraction_used"] <= 1.0 and answer["error_rate"] in (0.0, 1.0) and answer["reps"] == 1
    assert out["config"]["command"] == kind and out["config"]["labels"] == list(FOUR[:2] if kind == "compare" else FOUR)
    assert answer["fraction_used"] == pytest.approx(out["summary"]["fraction_used"])
    if argv[1:3] == ["--mode", "precision"]:  # the distribution target is implied, nothing is discarded below 0
        assert out["config"]["target"] == "distribution" and out["config"]["threshold"] == 0.0
        assert out["summary"]["guarantee"].startswith("exact: i.i.d. betting confidence sequences")


def test_compare_defaults_to_the_first_two_models_by_name(capsys):
    out = _json(capsys, ["backtest", "compare", "--scores", SCORES, "--margin", "0.02", "--reps", "1", "--json"])
    from certeval.inputs.banks import load_scores

    names = sorted(load_scores(SCORES)["model"].unique())
    assert out["config"]["labels"] == names[:2] and len(out["pairs"]) == 1


def test_errors_are_counted_against_the_exact_answer(tmp_path, capsys):
    """Two recorded models whose exact bank means differ by 0.005: at margin 0.02 every directional verdict is
    wrong and "equivalent" is right; at a weak level (confidence 0.5) some reps say a>b, and exactly those count."""
    import pandas as pd

    rng = np.random.default_rng(0)
    a = (rng.random(200) < 0.5).astype(float)
    b = rng.permutation(a)
    b[np.flatnonzero(b)[0]] = 0.0
    path = tmp_path / "close.scores.parquet"
    pd.DataFrame({"model": ["a"] * 200 + ["b"] * 200, "item_id": [f"i{k}" for k in range(200)] * 2,
                  "score": np.r_[a, b]}).to_parquet(path)
    out = _json(capsys, ["backtest", "compare", "--scores", str(path), "--margin", "0.02", "--confidence", "0.5",
                         "--reps", "10", "--batch-size", "10", "--json"])
    verdicts = out["pairs"][0]["verdicts"]
    assert out["pairs"][0]["bank_diff"] == pytest.approx(0.005)
    directional = verdicts.get("a>b", 0) + verdicts.get("b>a", 0)
    assert directional > 0 and verdicts.get("equivalent", 0) > 0
    assert out["answer"]["error_rate"] == pytest.approx(directional / 10)


@pytest.mark.parametrize("argv, flag, value", [
    (["rank", "--epsilon", "1.5"], "--epsilon", "1.5"),
    (["select", "--top", "99"], "--top", "99"),
    (["compare", "--margin", "0.01", "--model", FOUR[0]], "compare needs exactly 2", "1"),
    (["rank", "--model", FOUR[0], "--model", "no-such-model"], "unknown model", "no-such-model"),
    (["rank", "--model", "hf:/some/folder"], "--model", "hf:/some/folder"),
    (["rank", "--reps", "0"], "--reps", "0"),
    (["select", "--mode", "precision"], "--mode precision", "--halfwidth"),
    (["rank", "--history", "auto"], "--history auto", "auto"),
])
def test_bad_input_exits_2_naming_the_flag(argv, flag, value, capsys):
    try:
        code = main(["backtest", argv[0], "--scores", SCORES, *argv[1:], "--json"])
    except SystemExit as exc:  # a flag's range is checked while the line is parsed (certeval/cli/ranges.py)
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2 and flag in err and value in err


def test_scores_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["backtest", "rank", "--margin", "0.02"])
    assert exc.value.code == 2 and "--scores" in capsys.readouterr().err
    assert main(["backtest", "--goal", "rank:0.02"]) == 2 and "--scores" in capsys.readouterr().err


def test_old_goal_spelling_builds_the_same_request_as_the_command():
    """``--goal rank:D`` is an alias: its request is the live rank's plan's (make_plan, plan.group_request)."""
    from certeval.backtests.comparative import ComparativeOptions, live_request
    from certeval.requests import Rank
    from certeval.runs.plan import make_plan

    alias = live_request(ComparativeOptions("rank:0.02", SCORES, confidence=0.9, looks_every=40, seed=1), FOUR)
    plan, _ = make_plan(Rank(models=[replay(m) for m in FOUR], margin=0.02, confidence=0.9,
                                    batch_size=40, seed=1), check_output=False)
    assert alias == plan.group_request()


def _live(kind: str, scores: str, folder: Path, seed: int, **numbers) -> dict:
    """The live run, in this process (the flow's round loop without Prefect and Ray)."""
    from benchmarks.state_size import drive
    from certeval.requests import request_for
    from certeval.runs.plan import make_plan

    names = (STRONG, MIDDLE) if kind == "compare" else (STRONG, MIDDLE, WEAK)
    plan, _ = make_plan(request_for(kind, models=[replay(m, scores) for m in names], output=str(folder), seed=seed,
                                    batch_size=20, run_id=f"{kind}-{seed}", **numbers))
    drive(plan)
    return json.loads((folder / plan.run_id / "results.json").read_text())


CASES = [("rank", {"margin": 0.02}, 3), ("rank", {"margin": 0.02}, 11), ("rank", {"goal": "halfwidth:0.1"}, 3),
         ("rank", {"epsilon": 0.1}, 11), ("select", {"halfwidth": 0.05}, 3), ("compare", {"margin": 0.02}, 3),
         ("compare", {"margin": 0.0, "target": "distribution"}, 11)]


@pytest.mark.parametrize("kind, numbers, seed", CASES, ids=[f"{k}-{'-'.join(n)}-{s}" for k, n, s in CASES])
def test_live_run_and_backtest_rep_make_the_same_decisions(kind, numbers, seed, scores, tmp_path, capsys):
    live = _live(kind, scores, tmp_path, seed, **numbers)
    names = (STRONG, MIDDLE) if kind == "compare" else (STRONG, MIDDLE, WEAK)
    flags = [a for k, v in numbers.items() for a in (f"--{k}", str(v))]
    out = _json(capsys, ["backtest", kind, "--scores", scores, *_models(names), *flags, "--seed", str(seed),
                         "--batch-size", "20", "--reps", "1", "--json"])
    scored = {m["model"]: m["n_scored"] for m in live["models"]}
    if kind == "rank":
        rep = out["rankings"][0]
        assert rep["tie_groups"] == live["ranking"]["tie_groups"]
        assert dict(zip(rep["models"], rep["items_used"])) == scored
        assert rep["means"] == pytest.approx(live["ranking"]["means"])
    elif kind == "select":
        rep = out["runs"][0]
        assert rep["selected"] == live["selection"]["selected"] and rep["discarded"] == live["selection"]["discarded"]
        assert {m["model"]: (m["status"], m["n_scored"]) for m in rep["models"]} == \
            {m["model"]: (m["status"], m["n_scored"]) for m in live["selection"]["models"]}
    else:
        pair = out["pairs"][0]
        assert pair["verdicts"] == {live["pairs"][0]["verdict"]: 1}
        assert pair["fraction_used"] * 150 == pytest.approx(live["pairs"][0]["n_items"])
        assert set(scored.values()) == {live["pairs"][0]["n_items"]}


def test_rep_r_is_the_live_run_with_seed_plus_r(scores, capsys):
    """Rep 1 of seed 3 is rep 0 of seed 4: a rep is the live command with --seed (seed + r)."""
    base = ["backtest", "rank", "--scores", scores, *_models((STRONG, MIDDLE, WEAK)), "--margin", "0.0",
            "--batch-size", "10", "--json"]
    two = _json(capsys, [*base, "--seed", "3", "--reps", "2"])["rankings"]
    one = _json(capsys, [*base, "--seed", "4", "--reps", "1"])["rankings"]
    same = ("fraction_used", "tie_groups", "kendall_tau", "errors")
    assert {k: two[1][k] for k in same} == {k: one[0][k] for k in same}
    assert two[0]["fraction_used"] != two[1]["fraction_used"]  # two reps, two orders
