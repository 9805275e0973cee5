"""Hugging Face Trainer adapter: ``train(trainer)`` instead of ``trainer.train()``.

    from soak_sidecar_kit.hf import output_dir, train

    args = TrainingArguments(output_dir=output_dir("out"), ...)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    train(trainer)

``train`` adds the kit's callback, resumes from the checkpoint the soak approved for this attempt
(``trainer.train(resume_from_checkpoint=...)``: the model, optimizer, scheduler, RNG and data order
as the Trainer saved them), and writes the run's summary whatever ends it. The callback reports
progress every step, each evaluation in the ``eval`` phase and each save in the ``checkpoint`` phase
while it is written (each phase its own stale timeout), and records every save once it is on disk.
On the soft stop every rank stops at the same step, the Trainer saves its own checkpoint
(``checkpoint-N`` in ``output_dir``) and the callback records it. ``output_dir`` is the soak's
checkpoint folder when the sidecar names one (a pod's checkpoint volume, which outlives the
attempt); a Trainer that writes elsewhere then is refused at the start of training.
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback
from transformers.utils import logging

from soak_sidecar_kit import Soak, current

__all__ = ["SoakTrainerCallback", "output_dir", "train"]

# Under transformers' own logger: its handler and its verbosity, per rank (TrainingArguments'
# log_level and log_level_replica).
logger = logging.get_logger(f"transformers.{__name__}")


def output_dir(default: str) -> str:
    """The ``output_dir`` to build ``TrainingArguments`` with: the soak's checkpoint folder when the
    sidecar names one (``$SOAK_CHECKPOINT_DIR``), where the next attempt finds the checkpoints;
    ``default`` otherwise."""
    folder = current(owner="transformers").checkpoint_dir
    return default if folder is None else folder


class SoakTrainerCallback(TrainerCallback):  # type: ignore[misc]
    """The soak's side of a Trainer run. It decides from the ``TrainerControl`` flags what the Trainer
    does after an event (``_maybe_log_save_evaluate``: log, evaluate, then save), so it must run after
    the callbacks that set them: ``train`` puts it last."""

    def __init__(self, soak: Soak | None = None) -> None:
        self.soak = soak if soak is not None else current(owner="transformers")
        self._stopped = False
        self._phase = "train"
        self._save_started: float | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        folder = self.soak.checkpoint_dir
        if folder is not None and os.path.abspath(args.output_dir) != os.path.abspath(folder):
            raise ValueError(
                f"soak_sidecar_kit: this soak keeps its checkpoints in {folder}, where the next attempt "
                f"finds them, but the Trainer's output_dir is {args.output_dir}: build the arguments "
                "with TrainingArguments(output_dir=soak_sidecar_kit.hf.output_dir(...), ...)"
            )
        return control

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        max_steps = getattr(state, "max_steps", 0)  # the Trainer's own total, epochs included
        self.soak.total_steps = self.soak.total_steps or (
            max_steps if isinstance(max_steps, int) and max_steps > 0 else None
        )
        self.soak.progress(int(state.global_step))
        if not self._stopped and self.soak.should_stop():
            self._stopped = True
            control.should_save = True  # the Trainer's own checkpoint, then the stop
            control.should_evaluate = False  # the stop's margin is for the save
            control.should_training_stop = True
        self._next_phase(state, control)
        return control

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._next_phase(state, control)
        return control

    def on_prediction_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._enter(state, "eval")  # an evaluate() of the script's own too
        return control

    def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        self._next_phase(state, control)  # should_evaluate is reset by now: the save, or training
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        loss = None if logs is None else logs.get("loss")
        if isinstance(loss, (int, float)):
            self.soak.progress(int(state.global_step), loss=float(loss), phase=self._phase)
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = int(state.global_step)
        path = os.path.join(args.output_dir, f"checkpoint-{step}")
        started, self._save_started = self._save_started, None
        duration = None if started is None else time.monotonic() - started
        if os.path.isdir(path):
            self.soak.checkpoint(step, path, duration_s=duration)
        self._enter(state, "train")
        return control

    def _next_phase(self, state: Any, control: Any) -> None:
        """The phase of what the Trainer does next: an evaluation, a save, or the next step."""
        if control.should_evaluate:
            self._enter(state, "eval")
        elif control.should_save:
            self._save_started = time.monotonic()
            self._enter(state, "checkpoint")
        else:
            self._enter(state, "train")

    def _enter(self, state: Any, phase: str) -> None:
        if phase != self._phase:
            self._phase = phase
            self.soak.progress(int(state.global_step), phase=phase)


def train(trainer: Any, soak: Soak | None = None, **train_kwargs: Any) -> Any:
    """``trainer.train(**train_kwargs)`` as a soak's run: with the callback, resumed from this
    attempt's checkpoint unless ``resume_from_checkpoint`` is given, and the summary written at the
    end or on an exception (then raised again)."""
    kit = soak if soak is not None else current(owner="transformers")
    callback = trainer.pop_callback(SoakTrainerCallback) or SoakTrainerCallback(kit)
    trainer.add_callback(callback)  # last: it reads the flags the other callbacks set
    train_kwargs.setdefault("resume_from_checkpoint", kit.resume_checkpoint)
    if train_kwargs["resume_from_checkpoint"]:
        logger.info(f"soak_sidecar_kit: resuming from {train_kwargs['resume_from_checkpoint']}")
    with kit:
        return trainer.train(**train_kwargs)
