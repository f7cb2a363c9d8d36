"""The Python API (issue 57): ``import certeval`` gives the typed requests and three verbs over the same object —
``run`` (live: the Prefect flow, the models replayed by Ray actors), ``backtest`` (on recorded scores) and
``preview`` (the cost of a ranking before any model is called). The live run and the backtest's rep 0 of the same
request and seed make the same decisions, for a ranking and for a certification; the command line's
``certeval backtest certify`` is the API's backtest. Cost: one shared Prefect and Ray (the ``infra`` fixture), two
live runs of replay models on 150 items (~20 s)."""

from __future__ import annotations

import json
import sys
from dataclasses import FrozenInstanceError, replace
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import certeval  # noqa: E402
from certeval.cli import main  # noqa: E402
from certeval.errors import InputError  # noqa: E402

from test_pipeline_support import MIDDLE, SCORES, STRONG, WEAK, replay, small_scores  # noqa: E402


@pytest.fixture(scope="module")
def scores(tmp_path_factory) -> str:
    return small_scores(tmp_path_factory.mktemp("api"), n_items=150)


def test_import_certeval_exposes_the_requests_the_verbs_and_the_results():
    for name in ("Certify", "Compare", "Rank", "Select", "run", "backtest", "preview", "RunResults",
                 "BacktestResult", "CostPreview"):
        assert name in certeval.__all__ and hasattr(certeval, name), name
    request = certeval.Rank(models=("a", "b"), margin=0.02)
    assert (request.kind, request.margin, request.confidence) == ("rank", 0.02, 0.95)
    with pytest.raises(FrozenInstanceError):
        request.margin = 0.1  # type: ignore[misc]
    with pytest.raises(TypeError):  # a question's own fields only: certify has no margin
        certeval.Certify(models=("a",), margin=0.1)


def test_a_bad_request_is_refused_by_every_verb_in_one_line_naming_the_flag(infra, scores, tmp_path):
    bad = certeval.Rank(models=(replay(STRONG, scores), replay(WEAK, scores)), epsilon=1.5,
                        output=str(tmp_path / "runs"))
    for verb in (certeval.run, lambda r: certeval.backtest(r, scores=scores, reps=1),
                 lambda r: certeval.preview(replace(r, history=(SCORES,)))):
        with pytest.raises(InputError, match=r"--epsilon must lie in \(0, 1\), got 1.5"):
            verb(bad)
    assert not (tmp_path / "runs").exists()  # nothing written
    with pytest.raises(InputError, match="--goal applies to certify and rank, not compare"):
        certeval.backtest(certeval.Compare(models=(STRONG, WEAK), goal="halfwidth:0.1"), scores=scores, reps=1)


def test_the_same_rank_request_live_backtested_and_previewed(infra, scores, tmp_path):
    request = certeval.Rank(models=tuple(replay(m, scores) for m in (STRONG, MIDDLE, WEAK)), margin=0.02,
                            batch_size=20, seed=3, output=str(tmp_path / "runs"), run_id="rank", ray_address=infra)
    live = certeval.run(request)
    assert isinstance(live, certeval.RunResults) and live.kind == "rank" and live.done
    backtest = certeval.backtest(request, scores=scores, reps=2)
    assert isinstance(backtest, certeval.BacktestResult) and len(backtest.reps) == 2
    rep = backtest.reps[0]  # rep 0 is the live run: the same shared items, the same listing and the same means
    assert isinstance(rep, certeval.RankRep) and rep.tie_groups == tuple(map(tuple, live.ranking.tie_groups))
    assert dict(zip(rep.models, rep.items_used)) == {m.model: m.n_scored for m in live.models}
    assert rep.means == pytest.approx(tuple(live.ranking.means), abs=1e-12)
    assert backtest.config["seed"] == 3 and backtest.reps[1].rep == 1
    assert 0 < backtest.answer.fraction_used <= 1 and 0 <= backtest.answer.error_rate <= 1
    # the preview plays the same statement on recorded models that are not the request's own
    preview = certeval.preview(replace(request, history=(SCORES,)), reps=3)
    assert isinstance(preview, certeval.CostPreview) and preview.kind == "rank" and preview.n_models == 3
    assert preview.n_items == 150 and len(preview.fractions) == 3 and 0 < preview.fraction <= 1
    assert preview.history_models > 3  # HELM MMLU's other models stood in for the three


def test_backtest_certify_rep_0_is_the_live_certification(infra, scores, tmp_path, capsys):
    request = certeval.Certify(models=(replay(STRONG, scores), replay(WEAK, scores)), goal="halfwidth:0.12",
                               batch_size=20, seed=5, output=str(tmp_path / "runs"), run_id="certify",
                               ray_address=infra)
    live = certeval.run(request)
    backtest = certeval.backtest(request, scores=scores, reps=2)
    played = {m.model: m for m in backtest.reps[0].models}
    for m in live.models:
        mine = played[m.model]
        assert mine.n_scored == m.n_scored and mine.rule == m.decision.rule
        assert (mine.mean, mine.lower, mine.upper) == pytest.approx((m.mean, m.lower, m.upper), abs=1e-12)
    assert backtest.reps[1].seed == 6  # rep r is the live run with seed + r
    # the command line's backtest certify is the same backtest
    argv = ["backtest", "certify", "--scores", scores, "--model", STRONG, "--model", WEAK, "--goal", "halfwidth:0.12",
            "--batch-size", "20", "--seed", "5", "--reps", "2", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["runs"] == [r.to_dict() for r in backtest.reps] and out["answer"]["reps"] == 2


def test_a_broken_certify_backtest_is_caught_by_the_same_comparison(scores):
    """The control: another seed's rep 0 differs from the seed's, so the comparison above can fail."""
    request = certeval.Certify(models=(STRONG,), goal="halfwidth:0.12", batch_size=20)
    seeds = {seed: certeval.backtest(request, scores=scores, reps=1, seed=seed).reps[0].models[0]
             for seed in (5, 6, 7)}
    assert len({(m.n_scored, round(m.mean, 12)) for m in seeds.values()}) > 1


API_DOC = HERE.parent / "docs" / "api.md"


def test_the_api_page_examples_run_as_written(infra, tmp_path, monkeypatch, capsys):
    """docs/api.md's Python blocks, run in order in one namespace (the live run on the shared Ray and Prefect)."""
    import re

    blocks = re.findall(r"```python\n(.*?)```", API_DOC.read_text(), re.S)
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", infra)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(API_DOC), "exec"), namespace)
    out = capsys.readouterr().out
    assert "--epsilon must lie in (0, 1), got 1.5" in out and "rep 0:" in out
    assert (tmp_path / "certeval-runs").is_dir()


def test_the_readme_tour_python_block_runs_as_written(infra, tmp_path, monkeypatch):
    import re

    block = next(b for b in re.findall(r"```python\n(.*?)```", (HERE.parent / "README.md").read_text(), re.S)
                 if "certeval.run(" in b)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAY_ADDRESS", infra)
    exec(compile(block, "README.md", "exec"), {})
    assert (tmp_path / "certeval-runs").is_dir()
