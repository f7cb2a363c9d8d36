"""Checkpoint selection from a training loop (certeval/flows/training.py, certeval/flows/trainer_callback.py).

The first test trains the real SmolLM2-135M for two steps on CPU with ``transformers.Trainer`` — docs/training.md's
example, run as written — and certifies both checkpoints through the callback on the shared Prefect server and Ray.
Two steps cannot make two checkpoints reliably differ, so the verdicts are checked in the second test, with replay
models of known bank means (recorded HELM MMLU scores) through the plain function and the callback's ``on_save``
(real ``TrainerState`` / ``TrainerControl``; no Trainer, whose checkpoints would be torch models, not recorded
scores). Cost (2026-12-06, a shared 2-core machine at load average 17-25, not idle): the SmolLM2 test 166-249 s of
wall time (four model actors, two training steps, two saves of 540 MB), its process tree 89 CPU-seconds with the
shared Prefect and Ray start, the whole file 103; the replay test 40-74 s; the others under a second each.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from certeval.errors import InputError

from test_pipeline_support import MIDDLE, STRONG, WEAK, bank_diff, needs_small_lm, replay, small_scores

DOC = Path(__file__).resolve().parents[1] / "docs" / "training.md"


def _doc_example() -> str:
    return next(b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S) if "CheckpointCertifier" in b)


@pytest.mark.slow
def test_trainer_certifies_each_checkpoint_of_a_smollm2_fine_tune(infra, tmp_path, monkeypatch):
    """docs/training.md's example as written (in a temporary folder; the shared Ray of this process is used)."""
    needs_small_lm()
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(_doc_example(), str(DOC), "exec"), namespace)  # the documented example, nothing changed
    record, trainer = namespace["record"], namespace["trainer"]
    out = tmp_path / "smollm2-capitals" / "certeval"

    first, second = record.checkpoints
    assert (first.checkpoint, first.step, second.checkpoint, second.step) == ("checkpoint-1", 1, "checkpoint-2", 2)
    # history from the second checkpoint on: the first checkpoint's run
    assert (first.method, first.history_models) == ("adaptive", ())
    assert (second.method, second.history_models) == ("history", ("checkpoint-1",))
    for entry in record.checkpoints:
        assert 0 < entry.n_scored <= 16 and 0.0 <= entry.lower <= entry.mean <= entry.upper <= 1.0
        stored = json.loads((out / entry.run_id / "results.json").read_text())
        assert stored["models"][0]["model"] == entry.checkpoint and stored["models"][0]["lower"] == pytest.approx(entry.lower)
    assert first.comparison is None and first.not_better is None and first.best == "checkpoint-1"
    c = second.comparison
    assert (c.best, c.run_id, c.confidence) == ("checkpoint-1", "vs-checkpoint-2-checkpoint-1", pytest.approx(0.975))
    assert c.lower <= c.diff <= c.upper and 0 < c.n_items <= 16
    assert second.not_better == (c.verdict in ("b>a", "equivalent"))
    assert second.best == ("checkpoint-2" if c.diff > 0 else "checkpoint-1") == record.best
    pair = json.loads((out / c.run_id / "results.json").read_text())["pairs"][0]
    assert (pair["model_a"], pair["model_b"], pair["verdict"]) == ("checkpoint-2", "checkpoint-1", c.verdict)

    # the Trainer's logs: one certeval entry at each checkpoint's step, beside the loss entries
    logged = [h for h in trainer.state.log_history if "certeval/mean" in h]
    assert [(h["step"], h["certeval/checkpoint"], h["certeval/lower"], h["certeval/upper"]) for h in logged] == [
        (e.step, e.checkpoint, e.lower, e.upper) for e in record.checkpoints]
    assert "certeval/not_better" not in logged[0] and logged[1]["certeval/vs_best_verdict"] == c.verdict
    assert any("loss" in h for h in trainer.state.log_history)

    written = json.loads((out / "checkpoints.json").read_text())
    assert (written["kind"], written["schema_version"], written["best"]) == ("training-checkpoints", 1, record.best)
    assert [e["n_scored"] for e in written["checkpoints"]] == [e.n_scored for e in record.checkpoints]
    assert written["checkpoints"][1]["history_models"] == ["checkpoint-1"]


def test_not_better_verdicts_with_replay_checkpoints(infra, tmp_path):
    """WEAK, then STRONG (certifiably better: the new best), then MIDDLE through the callback (certifiably not
    better: with ``stop_after=1`` training is told to stop). The comparisons' intervals cover the exact bank
    differences, at the spending's levels."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from certeval.flows.trainer_callback import CheckpointCertifier
    from certeval.flows.training import (
        CheckpointCertification,
        certify_checkpoint,
        comparison_confidence,
        read_checkpoints,
    )

    scores = small_scores(tmp_path, n_items=150)
    out = tmp_path / "runs"
    settings = CheckpointCertification(bank=None, output=str(out), goal="halfwidth:0.1", batch_size=25, seed=3,
                                       ray_address=infra)
    first = certify_checkpoint(replay(WEAK, scores), settings, step=100)
    assert (first.method, first.history_models, first.comparison, first.best) == ("adaptive", (), None, WEAK)
    second = certify_checkpoint(replay(STRONG, scores), settings, step=200)
    assert second.history_models == (WEAK,) and second.method == "history"
    c = second.comparison
    assert (c.best, c.verdict, second.not_better, second.best) == (WEAK, "a>b", False, STRONG)
    assert c.confidence == pytest.approx(comparison_confidence(0.95, 1)) == pytest.approx(0.975)
    assert c.lower - 1e-9 <= bank_diff(scores, STRONG, WEAK) <= c.upper + 1e-9 and c.n_items < 150  # early
    assert read_checkpoints(str(out)).not_better_streak() == 0  # the control: a better checkpoint stops nothing

    # the third checkpoint as the Trainer would hand it over: a saved folder (here holding its model spec)
    folder = tmp_path / "train" / "checkpoint-300"
    folder.mkdir(parents=True)
    (folder / "model.spec").write_text(replay(MIDDLE, scores) + "\n")
    certifier = CheckpointCertifier(CheckpointCertification(bank=None, output=str(out), goal="halfwidth:0.1",
                                                            batch_size=25, seed=3, ray_address=infra, stop_after=1))
    args = TrainingArguments(output_dir=str(tmp_path / "train"), use_cpu=True, report_to=[])
    state, control = TrainerState(global_step=300), TrainerControl()
    certifier.on_save(args, state, control)
    [third] = certifier.entries
    c = third.comparison
    assert sorted(third.history_models) == sorted([WEAK, STRONG])
    assert (c.best, c.verdict, third.not_better, third.best) == (STRONG, "b>a", True, STRONG)
    assert c.confidence == pytest.approx(1 - 0.05 / 6)
    # (a difference of 0.087 on 150 items, at level 1 - 0.05/6: decided once every item is scored, exactly)
    assert c.lower - 1e-9 <= bank_diff(scores, MIDDLE, STRONG) <= c.upper + 1e-9 and c.upper < 0
    assert control.should_training_stop
    [logged] = state.log_history
    assert (logged["step"], logged["certeval/checkpoint"], logged["certeval/not_better"]) == (300, MIDDLE, True)
    record = read_checkpoints(str(out))
    assert [e.checkpoint for e in record.checkpoints] == [WEAK, STRONG, MIDDLE] and record.best == STRONG
    assert record.not_better_streak() == 1

    # the same checkpoint again: its entry, nothing scored or appended
    assert certify_checkpoint(replay(MIDDLE, scores), settings) == third
    assert len(read_checkpoints(str(out)).checkpoints) == 3
    # another question on the same record: refused (the spending holds for one bank, goal, level and margin)
    with pytest.raises(InputError, match="was written with confidence 0.95, now 0.9"):
        certify_checkpoint(replay(MIDDLE, scores), CheckpointCertification(bank=None, output=str(out), confidence=0.9,
                                                                         goal="halfwidth:0.1"))


def test_spending_over_checkpoints_stays_below_alpha():
    from certeval.flows.training import comparison_confidence

    alpha = 0.05
    spent = sum(1 - comparison_confidence(1 - alpha, j) for j in range(1, 10_001))
    assert spent < alpha and spent == pytest.approx(alpha * (1 - 1 / 10_001))
    with pytest.raises(InputError, match="positive integer"):
        comparison_confidence(0.95, 0)


@pytest.mark.parametrize("change, message", [
    ({"kind": "certify"}, "is not a certeval training-checkpoints record (kind 'certify')"),
    ({"schema_version": 2}, "has schema_version 2; this certeval reads 1"),
])
def test_a_record_of_another_kind_or_schema_is_refused(tmp_path, change, message):
    from certeval.flows.training import CheckpointsRecord, read_checkpoints

    record = CheckpointsRecord(bank="b.jsonl", goal="halfwidth:0.05", confidence=0.95, margin=0.0).to_json()
    (tmp_path / "checkpoints.json").write_text(json.dumps({**record, **change}))
    with pytest.raises(InputError, match=re.escape(message)):
        read_checkpoints(str(tmp_path))


@pytest.mark.parametrize("kwargs, message", [
    ({"goal": "wide"}, "goal"),
    ({"confidence": 1.5}, "confidence"),
    ({"margin": 1.0}, "margin must lie in [0, 1), got 1.0"),
    ({"stop_after": 0}, "stop_after must be a positive integer or None, got 0"),
    ({"history": "runs/"}, "history must be a list of sources"),
    ({"options": {"nope": 1}}, "unknown option 'nope'"),
    ({"bank": ""}, "bank must name a bank"),
])
def test_bad_settings_are_one_line_errors(kwargs, message):
    from certeval.flows.training import CheckpointCertification

    with pytest.raises(InputError, match=re.escape(message)):
        CheckpointCertification(**{"bank": "b.jsonl", **kwargs})


def test_checkpoint_spec(tmp_path):
    from certeval.flows.training import checkpoint_spec

    folder = tmp_path / "checkpoint-7"
    folder.mkdir()
    assert checkpoint_spec(folder) == f"hf:{folder}"
    (folder / "model.spec").write_text("replay:bundled:helm_mmlu#openai_ada\n")
    assert checkpoint_spec(folder) == "replay:bundled:helm_mmlu#openai_ada"
    with pytest.raises(InputError, match="neither a folder nor a model spec"):
        checkpoint_spec(tmp_path / "missing")


@pytest.mark.parametrize("bank, processing_class, message", [
    (None, "tokenizer", "needs settings.bank"),
    ("bundled:trivia?categories=uscapitals&mc=4", None, "needs the Trainer's processing_class"),
    ("/nonexistent/bank.jsonl", "tokenizer", "/nonexistent/bank.jsonl"),
])
def test_the_callback_refuses_what_it_cannot_certify_before_training(tmp_path, bank, processing_class, message):
    """Found at ``on_train_begin``, before any training step (the Trainer's events called directly: no model)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from certeval.flows.trainer_callback import CheckpointCertifier
    from certeval.flows.training import CheckpointCertification

    certifier = CheckpointCertifier(CheckpointCertification(bank=bank))
    args = TrainingArguments(output_dir=str(tmp_path / "train"), use_cpu=True, report_to=[])
    with pytest.raises(InputError, match=re.escape(message)):
        certifier.on_train_begin(args, TrainerState(), TrainerControl(), processing_class=processing_class)
    assert certifier.settings.output == f"{tmp_path / 'train'}/certeval" and not (tmp_path / "train").exists()
