"""``transformers.Trainer`` checkpoint selection: a :class:`~transformers.TrainerCallback` that certifies every
checkpoint the Trainer saves (:func:`certeval.flows.training.certify_checkpoint`; what each number claims is said
there).

On ``on_save`` (the Trainer has just written ``<output_dir>/checkpoint-<step>``) the checkpoint is certified with
the earlier ones as history and compared with the best so far; the result goes into the Trainer's logs
(``trainer.state.log_history``, as one entry of ``certeval/...`` keys at the step, and the ``certeval.training``
logger) and into ``checkpoints.json``. With ``stop_after=N`` the callback ends training (``control.
should_training_stop``) once N checkpoints in a row were certifiably not better than the best so far.

The Trainer needs ``processing_class=tokenizer`` (each checkpoint then holds its tokenizer). Only the main process
certifies (``state.is_world_process_zero``), so ``stop_after`` stops that process alone: use it with one process.
The checkpoints must stay on disk until the next one is compared (a ``save_total_limit`` that deletes the best so far
fails the next comparison in one line).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from transformers import TrainerCallback

from certeval.errors import InputError
from certeval.runs.inputs import load_run_bank

from .training import CheckpointCertification, CheckpointEntry, certify_checkpoint, read_checkpoints

PREFIX = "certeval/"  # the log keys' prefix, as transformers' integrations name their own


class CheckpointCertifier(TrainerCallback):
    """Certify each checkpoint a Trainer saves; ``settings.output`` None: ``<output_dir>/certeval``.

    ``entries``: this training run's certified checkpoints, in order (also in ``checkpoints.json``)."""

    def __init__(self, settings: CheckpointCertification) -> None:
        if not isinstance(settings, CheckpointCertification):
            raise InputError(f"CheckpointCertifier takes a CheckpointCertification, got {type(settings).__name__}")
        self.settings = settings
        self.entries: list[CheckpointEntry] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.settings.output is None:
            self.settings = replace(self.settings, output=f"{args.output_dir.rstrip('/')}/certeval")
        if state.is_world_process_zero:
            # a bad bank found before any training step, not after the first checkpoint
            if self.settings.bank is None:
                raise InputError("CheckpointCertifier needs settings.bank: the items each checkpoint is scored on")
            if kwargs.get("processing_class") is None:  # a checkpoint without its tokenizer cannot be scored
                raise InputError("CheckpointCertifier needs the Trainer's processing_class (its tokenizer), so that "
                                 "each checkpoint folder holds the tokenizer: Trainer(..., processing_class=tokenizer)")
            load_run_bank(self.settings.bank, ())
            read_checkpoints(self.settings.output)  # a record of another kind or schema refused now

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not state.is_world_process_zero:
            return
        folder = f"{args.output_dir.rstrip('/')}/checkpoint-{state.global_step}"
        entry = certify_checkpoint(folder, self.settings, step=state.global_step)
        self.entries.append(entry)
        state.log_history.append({**log_entry(entry), "step": state.global_step})
        record = read_checkpoints(self.settings.output)
        if self.settings.stop_after is not None and record.not_better_streak() >= self.settings.stop_after:
            control.should_training_stop = True


def log_entry(entry: CheckpointEntry) -> dict[str, Any]:
    """A checkpoint's certification as Trainer log values (numbers and strings, ``certeval/`` keys)."""
    out: dict[str, Any] = {f"{PREFIX}checkpoint": entry.checkpoint, f"{PREFIX}mean": entry.mean,
                           f"{PREFIX}lower": entry.lower, f"{PREFIX}upper": entry.upper,
                           f"{PREFIX}n_scored": entry.n_scored, f"{PREFIX}method": entry.method,
                           f"{PREFIX}history_models": len(entry.history_models), f"{PREFIX}best": entry.best}
    c = entry.comparison
    if c is not None:
        out.update({f"{PREFIX}vs_best_diff": c.diff, f"{PREFIX}vs_best_lower": c.lower,
                    f"{PREFIX}vs_best_upper": c.upper, f"{PREFIX}vs_best_verdict": c.verdict,
                    f"{PREFIX}not_better": c.not_better})
    return out
