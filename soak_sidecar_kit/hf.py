"""Hugging Face ``transformers.Trainer`` adapter: a TrainerCallback, and ``train`` for what callbacks
cannot do (load the resume checkpoint, end the run's summary on an exception).

    from soak_sidecar_kit.hf import train

    trainer = Trainer(model=model, args=args, train_dataset=data)
    train(trainer)  # instead of trainer.train()

``train`` adds the callback, resumes from the checkpoint the soak approved for this attempt
(``trainer.train(resume_from_checkpoint=...)``: the model, optimizer, scheduler, RNG and data order
as the Trainer saved them), and writes the run's summary whatever ends it. The callback reports
progress every step; on the soft stop every rank stops at the same step, the Trainer saves its own
checkpoint (``checkpoint-N`` in ``output_dir``) and the callback records it. The Trainer's other saves
(``save_steps``) are recorded as they land.
"""

from __future__ import annotations

import os
import time
from typing import Any

from transformers import TrainerCallback

from soak_sidecar_kit import Soak, current

__all__ = ["SoakTrainerCallback", "train"]


class SoakTrainerCallback(TrainerCallback):  # type: ignore[misc]
    def __init__(self, soak: Soak | None = None) -> None:
        self.soak = soak if soak is not None else current(owner="transformers")
        self._stopped = False
        self._save_started: float | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        max_steps = getattr(state, "max_steps", 0)  # the Trainer's own total, epochs included
        self.soak.total_steps = self.soak.total_steps or (
            max_steps if isinstance(max_steps, int) and max_steps > 0 else None
        )
        self.soak.progress(int(state.global_step))
        if not self._stopped and self.soak.should_stop():
            self._stopped = True
            control.should_save = True  # the Trainer's own checkpoint, then the stop
            control.should_training_stop = True
            self._save_started = time.monotonic()
        return control

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> Any:
        loss = None if logs is None else logs.get("loss")
        if isinstance(loss, (int, float)):
            self.soak.progress(int(state.global_step), loss=float(loss))
        return control

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        step = int(state.global_step)
        path = os.path.join(args.output_dir, f"checkpoint-{step}")
        started, self._save_started = self._save_started, None
        duration = None if started is None else time.monotonic() - started
        if os.path.isdir(path):
            self.soak.checkpoint(step, path, duration_s=duration)
        return control


def train(trainer: Any, soak: Soak | None = None, **train_kwargs: Any) -> Any:
    """``trainer.train(**train_kwargs)`` as a soak's run: with the callback, resumed from this
    attempt's checkpoint unless ``resume_from_checkpoint`` is given, its output_dir the soak's
    checkpoint folder when the sidecar names one, and the summary written at the end or on an
    exception (then raised again)."""
    kit = soak if soak is not None else current(owner="transformers")
    if not any(isinstance(callback, SoakTrainerCallback) for callback in trainer.callback_handler.callbacks):
        trainer.add_callback(SoakTrainerCallback(kit))
    if kit.checkpoint_dir is not None and trainer.args.output_dir != kit.checkpoint_dir:
        # The soak's checkpoint folder outlives the attempt (a pod's checkpoint volume): the
        # Trainer's checkpoints go there, so that the next attempt finds them.
        if trainer.is_world_process_zero():
            print(
                f"soak_sidecar_kit: output_dir is the soak's checkpoint folder {kit.checkpoint_dir}",
                flush=True,
            )
        trainer.args.output_dir = kit.checkpoint_dir
    train_kwargs.setdefault("resume_from_checkpoint", kit.resume_checkpoint)
    if train_kwargs["resume_from_checkpoint"] and trainer.is_world_process_zero():
        print(f"soak_sidecar_kit: resuming from {train_kwargs['resume_from_checkpoint']}", flush=True)
    with kit:
        return trainer.train(**train_kwargs)
