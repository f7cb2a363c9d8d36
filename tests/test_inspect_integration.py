"""certeval inside Inspect AI (a real ``inspect_ai.eval`` on Inspect's mock model, offline) and Inspect logs
read back as scores, items and history (``certeval import inspect``).

The mock model answers from a fixed, seeded table of right/wrong answers and reports its own token usage, so
Inspect never counts tokens with tiktoken (which would download an encoding; the loopback guard in conftest.py
would refuse it). Everything else is Inspect's real eval loop, scorer (``match``) and log reader/writer.
"""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

inspect_ai = pytest.importorskip("inspect_ai")

from certeval.cli import main  # noqa: E402
from certeval.errors import InputError  # noqa: E402
from certeval.harnesses.inspect_early_stopping import CertevalStopping  # noqa: E402
from certeval.harnesses.readers import score_value  # noqa: E402
from certeval.inputs.banks import load_bank, load_scores  # noqa: E402
from certeval.inputs.history import load_history  # noqa: E402

# inspect-ai 0.3.285 passes a deprecated argument to tenacity 9.2 on every model call: not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")

N_SAMPLES = 400
TASK = "mock_qa"


def correct_table(seed: int = 3, n: int = N_SAMPLES) -> np.ndarray:
    """Which sample the mock model answers right (about 70%, seeded)."""
    return np.random.default_rng(seed).random(n) < 0.7


def run_inspect_eval(log_dir, correct: np.ndarray, stopping, *, shuffle_seed: int | None = 11, log_format="eval",
                     metrics: list | None = None):
    from inspect_ai import Task
    from inspect_ai import eval as inspect_eval
    from inspect_ai.dataset import MemoryDataset, Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model
    from inspect_ai.scorer import match
    from inspect_ai.solver import generate

    dataset = MemoryDataset([Sample(id=i, input=f"question {i}", target=f"answer{i}") for i in range(len(correct))])
    if shuffle_seed is not None:
        dataset.shuffle(seed=shuffle_seed)  # the user's part: a uniformly random order

    def respond(messages, tools, tool_choice, config):
        i = int(messages[-1].text.split()[-1])
        out = ModelOutput.from_content(model="mockllm", content=f"answer{i}" if correct[i] else "no idea")
        out.usage = ModelUsage(input_tokens=3, output_tokens=2, total_tokens=5)  # no tiktoken download
        return out

    task = Task(dataset=dataset, solver=generate(), scorer=match(), early_stopping=stopping, name=TASK,
                metrics=metrics)
    logs = inspect_eval(task, model=get_model("mockllm/model", custom_outputs=respond), log_dir=str(log_dir),
                        display="none", log_format=log_format, max_samples=4)
    return logs[0]


@pytest.fixture(scope="module")
def stopped_eval(tmp_path_factory):
    correct = correct_table()
    log = run_inspect_eval(tmp_path_factory.mktemp("inspect-logs"), correct,
                           CertevalStopping(goal="halfwidth:0.1", confidence=0.95))
    return log, correct


def test_real_inspect_eval_stops_early_and_its_interval_covers_the_full_run(stopped_eval):
    log, correct = stopped_eval
    assert log.status == "success"
    summary = log.results.early_stopping
    meta = summary.metadata
    assert summary.manager == "certeval uniform halfwidth:0.1" and meta["certeval"] is True
    # stopped early: well under the 400 samples, the rest skipped through Inspect's EarlyStop
    assert meta["reached"] and meta["rule"] == "precision" and meta["halfwidth"] <= 0.1
    assert 60 < meta["n_scored"] < 250 and len(summary.early_stops) == N_SAMPLES - meta["n_scored"]
    assert meta["n_scored"] - meta["stopped_at"] <= 4  # only samples already running finished after the stop
    assert meta["anytime_valid"] is True and "betting" in meta["guarantee"]
    # the full run's accuracy: the mock model's answers are fixed per sample, and Inspect's own scorer scored
    # every sample it ran exactly as the table says, so a full run would score correct.mean()
    scored = {int(s.id): s.scores["match"].value for s in log.samples}
    assert len(scored) == meta["n_scored"]
    assert all((v == "C") == bool(correct[i]) for i, v in scored.items())
    full_run = float(correct.mean())
    assert meta["lower"] <= full_run <= meta["upper"], (meta["lower"], full_run, meta["upper"])
    assert meta["estimate"] == pytest.approx(np.mean([correct[i] for i in scored]))


async def _drive(stopping, order, scores, finish_order=None):
    """Inspect's calls to an EarlyStopping manager, one sample at a time (finish_order: a reordering of when
    scheduled samples report back, within batches of 4 in flight)."""
    samples = [SimpleNamespace(id=i) for i in range(len(scores))]
    await stopping.start_task(SimpleNamespace(task="t"), samples, 1)
    in_flight = []
    for i in order:
        if await stopping.schedule_sample(int(i), 1) is not None:
            continue
        in_flight.append(int(i))
        if len(in_flight) == 4:
            for j in (finish_order(in_flight) if finish_order else in_flight):
                value = SimpleNamespace(score=SimpleNamespace(value=float(scores[j])))
                await stopping.complete_sample(j, 1, {"s": value})
            in_flight = []
    for j in in_flight:
        await stopping.complete_sample(j, 1, {"s": SimpleNamespace(score=SimpleNamespace(value=float(scores[j])))})
    return await stopping.complete_task()


def _coverage(orders, scores, finish_order=None, goal="halfwidth:0.1", confidence=0.95):
    truth = float(np.mean(scores))
    hits, used = [], []
    for order in orders:
        meta = asyncio.run(_drive(CertevalStopping(goal=goal, confidence=confidence), order, scores, finish_order))
        hits.append(meta["lower"] <= truth <= meta["upper"])
        used.append(meta["n_scored"])
    return float(np.mean(hits)), float(np.mean(used))


def _calibrated(coverage: float, reps: int, level: float = 0.95) -> bool:
    """Coverage no lower than a ``level`` interval's could plausibly give over ``reps`` runs (misses at most the
    0.999 quantile of Binomial(reps, 1 - level)): a calibrated interval fails this 1 time in 1000."""
    from scipy.stats import binom

    return round((1 - coverage) * reps) <= binom.ppf(0.999, reps, 1 - level)


def test_stopping_coverage_over_random_orders_and_controls_that_must_fail():
    """Monte-Carlo coverage at the stopping time over 50 shuffles of a fixed 400-item bank at 95% (measured once
    over 400 shuffles: 16 misses, 4%). Three controls break it and the same check fails them, so it would catch
    a miscalibrated interval: the interval at 50% confidence claimed as 95%; the dataset in its own sorted order;
    scores absorbed as they finish when wrong answers are slow."""
    rng = np.random.default_rng(20261124)
    scores = (rng.random(N_SAMPLES) < 0.62).astype(float)
    orders = [rng.permutation(N_SAMPLES) for _ in range(50)]
    coverage, used = _coverage(orders, scores)
    assert _calibrated(coverage, len(orders)) and used < 0.6 * N_SAMPLES, (coverage, used)
    claimed, _ = _coverage(orders, scores, confidence=0.5)  # a 50% interval presented as a 95% one
    assert not _calibrated(claimed, len(orders)), claimed
    sorted_order = [np.argsort(-scores, kind="stable")] * 3  # right answers first: not a random order
    assert not _calibrated(_coverage(sorted_order, scores)[0], len(sorted_order))

    # a manager absorbing in finishing order, where the wrong answers of each batch finish last and the eval
    # stops before they report: the control the scheduling-order rule exists for
    class FinishOrder(CertevalStopping):
        async def complete_sample(self, id, epoch, scores_):
            self.scheduled_ = [p for p in self.scheduled_ if p != self._position(id)]
            self.scheduled_.insert(self.absorbed_, self._position(id))
            await super().complete_sample(id, epoch, scores_)

    def wrong_last(batch):
        return sorted(batch, key=lambda j: -scores[j])

    def truncated(stopping, order):
        async def go():
            samples = [SimpleNamespace(id=i) for i in range(N_SAMPLES)]
            await stopping.start_task(SimpleNamespace(task="t"), samples, 1)
            for k in range(0, N_SAMPLES, 8):
                batch = [int(i) for i in order[k:k + 8] if await stopping.schedule_sample(int(i), 1) is None]
                for j in wrong_last(batch)[: max(1, len(batch) - 3)]:  # the slow (wrong) ones never report
                    await stopping.complete_sample(j, 1, {"s": SimpleNamespace(score=SimpleNamespace(value=scores[j]))})
            return stopping.summary()
        return asyncio.run(go())

    truth = float(scores.mean())
    finish = [truncated(FinishOrder(goal="halfwidth:0.1"), o) for o in orders[:20]]
    scheduled = [truncated(CertevalStopping(goal="halfwidth:0.1"), o) for o in orders[:20]]
    assert not _calibrated(np.mean([m["lower"] <= truth <= m["upper"] for m in finish]), len(finish))
    # certeval's rule waits for the slow samples: it never absorbs past one still running, so it stays valid
    assert _calibrated(np.mean([m["lower"] <= truth <= m["upper"] for m in scheduled]), len(scheduled))


def test_stopping_rejects_bad_settings_before_any_sample():
    samples = [SimpleNamespace(id=i) for i in range(5)]
    for kwargs, message in [({"goal": "halfwidth:2"}, "below 1"), ({"method": "adaptive"}, "decides the order"),
                            ({"confidence": 1.5}, "confidence"), ({"min_samples": -1}, "min_samples")]:
        with pytest.raises(InputError, match=message):
            asyncio.run(CertevalStopping(**kwargs).start_task(SimpleNamespace(task="t"), samples, 1))
    with pytest.raises(InputError, match="one epoch"):
        asyncio.run(CertevalStopping().start_task(SimpleNamespace(task="t"), samples, 3))


@pytest.mark.parametrize("value, expected", [("C", 1.0), ("I", 0.0), ("P", 0.5), ("N", 0.0), (True, 1.0),
                                             ("yes", 1.0), ("false", 0.0), (0.25, 0.25), ("0.75", 0.75)])
def test_score_values_follow_inspect_semantics(value, expected):
    assert score_value(value, "x") == expected


@pytest.mark.parametrize("value, message", [("maybe", "not a number"), ({"a": 1}, "not numeric"),
                                            (3.0, "outside"), ([1], "not numeric")])
def test_non_numeric_score_values_are_refused(value, message):
    with pytest.raises(InputError, match=message):
        score_value(value, "x")


def test_inspect_log_as_scores_items_history_and_import(stopped_eval, tmp_path, capsys):
    log, correct = stopped_eval
    frame = load_scores(log.location)
    assert set(frame["model"]) == {"mockllm/model"} and len(frame) == log.results.early_stopping.metadata["n_scored"]
    assert all(frame["score"] == [float(correct[int(i.split("/")[1])]) for i in frame["item_id"]])
    bank = load_bank(log.location)
    assert bank.n_items == len(frame) and bank.frame["question"].iloc[0].startswith("question ")
    out, items = tmp_path / "scores.parquet", tmp_path / "items.parquet"
    assert main(["import", "inspect", log.location, "-o", str(out), "--items", str(items)]) == 0
    written = pd.read_parquet(out)
    assert list(written.columns) == ["model", "item_id", "score", "subset"] and len(written) == len(frame)
    assert set(pd.read_parquet(items)["item_id"]) == set(written["item_id"])
    # the imported file serves a backtest, and a log serves as history
    capsys.readouterr()
    assert main(["backtest", "--scores", str(out), "--items", str(items), "--method", "uniform",
                 "--goal", "halfwidth:0.2", "--reps", "2", "--json"]) in (0, 1)
    assert json.loads(capsys.readouterr().out)["summary"]["coverage"] == 1.0
    assert load_history([log.location]).models == ["mockllm/model"]


def test_import_inspect_name_renames_one_log(stopped_eval, tmp_path, capsys):
    log, _ = stopped_eval
    out = tmp_path / "s.parquet"
    assert main(["import", "inspect", log.location, "-o", str(out), "--name", "mine", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["models"] == ["mine"] and summary["sources"][0]["named_from"] == "--name"
    assert set(pd.read_parquet(out)["model"]) == {"mine"}
    assert main(["import", "inspect", log.location, log.location, "-o", str(tmp_path / "t.parquet"),
                 "--name", "mine"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--name 'mine'" in err and not (tmp_path / "t.parquet").exists()


def _rewrite(log, path, edit):
    from inspect_ai.log import write_eval_log

    copy = log.model_copy(deep=True)
    edit(copy)
    write_eval_log(copy, str(path), format="json")
    return str(path)


def test_bad_inspect_logs_are_one_clear_error(stopped_eval, tmp_path):
    log, _ = stopped_eval

    def no_scores(c):
        c.samples[3].scores = None

    def mixed(c):
        c.samples[1].output.model = "another-model"

    def words(c):
        c.samples[2].scores["match"].value = "perhaps"

    def no_samples(c):
        c.samples = []

    for edit, message in [(no_scores, "has no score"), (mixed, "mixes models"), (words, "not a number"),
                          (no_samples, "has no samples")]:
        path = _rewrite(log, tmp_path / f"{edit.__name__}.json", edit)
        with pytest.raises(InputError, match=message):
            load_scores(path)
    ok = _rewrite(log, tmp_path / "ok.json", lambda c: None)  # Inspect's .json format reads like .eval
    assert len(load_scores(ok)) == len(log.samples)
    with pytest.raises(InputError, match="no scorer 'f1'"):
        load_scores(ok, metric="f1")
    assert main(["import", "inspect", str(tmp_path / "missing.eval"), "-o", str(tmp_path / "s.parquet")]) == 2
    assert main(["import", "lm-eval", ok, "-o", str(tmp_path / "s.parquet")]) == 2
    assert not (tmp_path / "s.parquet").exists()


@pytest.mark.slow
def test_imported_inspect_scores_run_certify_replay(stopped_eval, infra, tmp_path, capsys):
    """``certeval import inspect`` output as a replay model and its items as the bank, through the real pipeline
    (Prefect + Ray); the model's name (``mockllm/model``) has a slash."""
    log, _ = stopped_eval
    out, items = tmp_path / "scores.parquet", tmp_path / "items.parquet"
    assert main(["import", "inspect", log.location, "-o", str(out), "--items", str(items)]) == 0
    capsys.readouterr()
    assert main(["certify", "--model", f"replay:{out}#mockllm/model", "--bank", str(items), "--goal",
                 "halfwidth:0.2", "--method", "uniform", "--output", str(tmp_path / "runs"), "--ray-address", infra,
                 "--batch-size", "30", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    m = res["models"][0]
    truth = float(pd.read_parquet(out)["score"].mean())
    assert m["model"] == "mockllm/model" and m["lower"] <= truth <= m["upper"] and m["n_total"] == len(log.samples)


def test_seq_method_and_threshold_goal_inside_inspect_protocol():
    """``seq`` and ``above:T`` through the same protocol calls: a verdict against the threshold, and the
    interval still covers the bank mean of a shuffled 400-item bank."""
    rng = np.random.default_rng(11)
    scores = (rng.random(N_SAMPLES) < 0.8).astype(float)
    meta = asyncio.run(_drive(CertevalStopping(goal="above:0.6", method="seq"), rng.permutation(N_SAMPLES), scores))
    assert meta["method"] == "seq" and meta["verdict"] == "above" and meta["reached"]
    assert meta["lower"] > 0.6 and meta["lower"] <= scores.mean() <= meta["upper"]
    assert meta["n_scored"] < N_SAMPLES and meta["skipped"] == N_SAMPLES - meta["n_scored"]


def test_an_errored_sample_stops_absorption_after_it():
    """A sample that never reports (it errored) may hide any score: nothing scheduled after it is absorbed, so
    the eval does not stop early on the rest; the summary counts what was left out."""
    async def go():
        stopping = CertevalStopping(goal="halfwidth:0.2")
        await stopping.start_task(SimpleNamespace(task="t"), [SimpleNamespace(id=i) for i in range(300)], 1)
        skipped = 0
        for i in range(300):
            if await stopping.schedule_sample(i, 1) is not None:
                skipped += 1
            elif i != 5:  # sample 5 errors
                await stopping.complete_sample(i, 1, {"s": SimpleNamespace(score=SimpleNamespace(value="C"))})
        return skipped, await stopping.complete_task()

    skipped, meta = asyncio.run(go())
    assert skipped == 0 and meta["n_scored"] == 5 and meta["not_absorbed"] == 295 and meta["stopped_at"] is None


def test_the_certified_interval_shows_in_inspects_results_and_an_unshuffled_dataset_is_warned(tmp_path):
    """``stopping.interval()`` puts the certified interval beside accuracy ± stderr in Inspect's own results (the
    ± there is a classical standard error); only the first skipped sample carries the interval; a dataset Inspect
    reports as unshuffled gets a warning and ``dataset_shuffled: false``."""
    import warnings

    from inspect_ai.scorer import accuracy, stderr

    correct = correct_table()
    stopping = CertevalStopping(goal="halfwidth:0.1")
    log = run_inspect_eval(tmp_path / "a", correct, stopping, metrics=[accuracy(), stderr(), stopping.interval()])
    meta = log.results.early_stopping.metadata
    shown = {name: m.value for score in log.results.scores for name, m in score.metrics.items()}
    assert (shown["certeval_lower"], shown["certeval_upper"]) == pytest.approx((meta["lower"], meta["upper"]))
    assert shown["certeval_estimate"] == pytest.approx(shown["accuracy"]) and meta["dataset_shuffled"] is True
    carrying = [stop for stop in log.results.early_stopping.early_stops if stop.metadata]
    assert len(carrying) == 1 and len(log.results.early_stopping.early_stops) > 100
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        unshuffled = run_inspect_eval(tmp_path / "b", correct, CertevalStopping(goal="halfwidth:0.1"),
                                      shuffle_seed=None)
    assert unshuffled.results.early_stopping.metadata["dataset_shuffled"] is False
    assert any("not shuffled" in str(w.message) for w in caught), [str(w.message) for w in caught]
