"""torchtitan (0.3) adapter: the soak attached to torchtitan's ``Trainer``.

Run torchtitan's own entry point with the soak attached, no line of yours changed::

    torchrun --nproc_per_node=8 -m soak_sidecar_kit.torchtitan --module llama3 --config llama3_8b ...

or, in a script of your own that builds the trainer::

    from soak_sidecar_kit.torchtitan import attach

    trainer = config.build()
    attach(trainer)
    trainer.train()

What it does to the trainer: progress every step (step, the tokens this rank has seen, the loss when
torchtitan logs it); a checkpoint phase around each save and a record of every save that completed;
on the soft stop every rank stops after the same step (a MAX over the default process group) and
the checkpointer saves a full checkpoint of that step (model, optimizers, schedulers, dataloader,
train state, whatever ``last_save_model_only`` says) into ``checkpoint.folder``; a resumed attempt
loads the step the soak approved (``checkpoint.load_step``), and ``train`` ends with the run's
summary, of the right class on an exception. Checkpointing must be on (``--checkpoint.enable``) for
the stop to save anything. When the sidecar names a checkpoint folder that outlives the attempt
(``$SOAK_CHECKPOINT_DIR``, a pod's checkpoint volume), ``checkpoint.folder`` is moved into it.
Under a soak an attempt loads exactly what the soak approved: the approved step, or none of the
folder's steps on a fresh attempt (``initial_load_path`` still applies). Outside a soak, torchtitan's
own rule: the newest complete step in ``checkpoint.folder``.
"""

from __future__ import annotations

import functools
import os
import re
import time
from collections.abc import Callable
from typing import Any

from torchtitan import train as entry
from torchtitan.trainer import Trainer

from soak_sidecar_kit import Soak, current

__all__ = ["attach", "main"]

_STEP_DIR = re.compile(r"step-(\d+)")


def attach(trainer: Any, soak: Soak | None = None) -> Soak:
    """Attach the soak to a built torchtitan ``Trainer`` (before ``trainer.train()``)."""
    kit = _hook(trainer, soak)
    train = trainer.train

    @functools.wraps(train)
    def soaked_train(*args: Any, **kwargs: Any) -> Any:
        with kit:
            return train(*args, **kwargs)

    trainer.train = soaked_train
    return kit


def main() -> None:
    """``torchtitan.train``'s entry point, every trainer it builds attached to the soak."""
    build = Trainer.Config.build

    @functools.wraps(build)
    def build_attached(self: Any, **kwargs: Any) -> Any:
        built = build(self, **kwargs)
        if isinstance(built, Trainer):  # a subclass's trainer too, whatever its __init__ does
            attach(built)
        return built

    Trainer.Config.build = build_attached
    entry.main()


class _Hook:
    """The trainer's methods, wrapped: what torchtitan calls, the soak sees."""

    def __init__(self, trainer: Any, kit: Soak) -> None:
        self.trainer = trainer
        self.kit = kit
        self.checkpointer = trainer.checkpointer
        self.loss: float | None = None
        self.recorded_step: int | None = None
        self.pending: tuple[int, str, float] | None = None  # an asynchronous save not yet on disk

    def folder(self) -> str | None:
        return getattr(self.checkpointer, "folder", None) if self.checkpointer.enable else None

    def step_dir(self, step: int) -> str | None:
        folder = self.folder()
        return None if folder is None else os.path.abspath(os.path.join(folder, f"step-{step}"))

    # -- wrapped methods -----------------------------------------------------------------------

    def train_step(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        self.record_finished_save()
        trainer = self.trainer
        self.kit.total_steps = self.kit.total_steps or _training_steps(trainer)
        self.kit.progress(int(trainer.step), tokens=getattr(trainer, "ntokens_seen", None), loss=self.loss)
        return result

    def should_continue(self, original: Callable[[], bool]) -> bool:
        if not original():
            return False
        if not self.kit.should_stop():
            return True
        self.save_for_stop(int(self.trainer.step))
        return False

    def save(self, original: Callable[..., bool], curr_step: int, last_step: bool = False) -> bool:
        started = time.monotonic()
        model_only = last_step and bool(getattr(self.checkpointer, "last_save_model_only", False))
        saved = bool(original(curr_step, last_step))
        path = self.step_dir(curr_step)
        if not saved or path is None or model_only:
            return saved  # a model-only final save cannot be resumed from: not a record
        if getattr(self.checkpointer, "save_future", None) is not None:
            self.pending = (curr_step, path, started)
        else:
            self.record(curr_step, path, time.monotonic() - started)
        return saved

    def load(self, original: Callable[..., bool], step: int = -1) -> bool:
        approved = self.kit.resume_checkpoint
        if step != -1 or self.kit.progress_dir is None:
            return bool(original(step))  # a step asked for, or no soak: torchtitan's own rule
        if approved is None:
            return self.fresh_start(original)
        found = _STEP_DIR.fullmatch(os.path.basename(os.path.normpath(approved)))
        folder = self.folder()
        inside = folder is not None and os.path.realpath(os.path.dirname(os.path.normpath(approved))) == (
            os.path.realpath(folder)
        )
        if found is None or not inside:
            raise ValueError(
                f"soak_sidecar_kit: the approved checkpoint {approved} is not a step-N folder of "
                f"torchtitan's checkpoint.folder ({folder}); torchtitan resumes from its own folder"
            )
        if self.kit.rank == 0:
            print(f"soak_sidecar_kit: resuming from {approved}", flush=True)
        return bool(original(int(found.group(1))))

    def fresh_start(self, original: Callable[..., bool]) -> bool:
        """An attempt the soak resumes from nothing loads none of the folder's steps (an earlier run's,
        or one the soak never approved); the initial load (``initial_load_path``) still applies, as
        torchtitan gives it to an empty folder."""
        checkpointer = self.checkpointer
        folder = self.folder()
        if folder is None or not os.path.isdir(folder):
            return bool(original(-1))
        checkpointer.folder = os.path.join(folder, ".soak-fresh-start-has-no-steps")
        try:
            return bool(original(-1))
        finally:
            checkpointer.folder = folder

    def log(self, original: Callable[..., Any], step: int, loss: Any, *args: Any, **kwargs: Any) -> Any:
        self.loss = _float_or_none(loss)
        return original(step, loss, *args, **kwargs)

    def validate(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        with self.kit.phase("eval", int(self.trainer.step)):
            return original(*args, **kwargs)

    # -- the stop's checkpoint -----------------------------------------------------------------

    def save_for_stop(self, step: int) -> None:
        checkpointer = self.checkpointer
        self.record_finished_save(wait=True)
        if step in (0, self.recorded_step):
            return  # nothing trained yet, or this step's save already landed
        if not checkpointer.enable:
            if self.kit.rank == 0:
                print("soak_sidecar_kit: checkpointing is off (checkpoint.enable): the stop saves nothing")
            return
        # A full checkpoint, resumable: the final save's model-only and HF options are for a
        # finished run, not a stopped one.
        options = {"last_save_model_only": False, "last_save_in_hf": False}
        kept = {name: getattr(checkpointer, name) for name in options}
        try:
            for name, value in options.items():
                setattr(checkpointer, name, value)
            with self.kit.phase("checkpoint", step):
                checkpointer.save(step, last_step=True)  # recorded by the wrapped save
        finally:
            for name, value in kept.items():
                setattr(checkpointer, name, value)

    def record_finished_save(self, wait: bool = False) -> None:
        if self.pending is None:
            return
        future = getattr(self.checkpointer, "save_future", None)
        if future is not None and not future.done():
            if not wait:
                return
            self.checkpointer.maybe_wait_for_saving()
        step, path, started = self.pending
        self.pending = None
        self.record(step, path, time.monotonic() - started)

    def record(self, step: int, path: str, duration_s: float) -> None:
        self.recorded_step = step
        self.kit.checkpoint(step, path, duration_s=duration_s)


def _hook(trainer: Any, soak: Soak | None) -> Soak:
    kit = soak if soak is not None else current(owner="torchtitan")
    checkpointer = trainer.checkpointer
    if kit.checkpoint_dir is not None and checkpointer.enable:
        # The soak's checkpoint folder outlives the attempt (a pod's checkpoint volume): saves and
        # loads go there, so that the next attempt finds them.
        checkpointer.folder = os.path.join(
            kit.checkpoint_dir, os.path.basename(os.path.normpath(checkpointer.folder))
        )
    hook = _Hook(trainer, kit)
    _wrap(trainer, "train_step", hook.train_step)
    _wrap(trainer, "should_continue_training", hook.should_continue)
    _wrap(trainer.checkpointer, "save", hook.save)
    _wrap(trainer.checkpointer, "load", hook.load)
    metrics = getattr(trainer, "metrics_processor", None)
    if metrics is not None:
        _wrap(metrics, "log", hook.log)
    validator = getattr(trainer, "validator", None)
    if validator is not None and getattr(trainer.config.validator, "enable", False):
        _wrap(validator, "validate", hook.validate)
    return kit


def _wrap(owner: Any, name: str, wrapper: Callable[..., Any]) -> None:
    """``owner.name`` calls ``wrapper(original, ...)`` from now on (the instance's own attribute)."""
    original = getattr(owner, name)
    setattr(owner, name, functools.partial(wrapper, original))


def _float_or_none(value: Any) -> float | None:
    try:
        return float(value.item()) if hasattr(value, "item") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


def _training_steps(trainer: Any) -> int | None:
    """The run's total steps from the trainer's config (``training.steps``), where it has one."""
    config = getattr(trainer, "config", None) or getattr(trainer, "job_config", None)
    steps = getattr(getattr(config, "training", None), "steps", None)
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps > 0 else None


if __name__ == "__main__":
    main()
