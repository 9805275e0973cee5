"""PyTorch Lightning (2.x) adapter: a Callback that does the trainer's side of a soak.

    from soak_sidecar_kit.lightning import SoakCallback

    soak = SoakCallback()
    trainer = L.Trainer(max_steps=1000, callbacks=[soak])
    trainer.fit(model, datamodule, ckpt_path=soak.resume_checkpoint)

Progress every step; on the soft stop every rank stops at the same step (the strategy reduces the
decision), the callback saves a checkpoint through ``trainer.save_checkpoint`` and records it, and
the summary says the soak was stopped. ``ModelCheckpoint``'s own saves are recorded as they land. A
resumed attempt passes the recorded checkpoint to ``fit`` (``resume_checkpoint``), so Lightning
restores the model, optimizers, loops and callbacks itself. An exception ends the run with a
summary of the right class; Lightning's swallowed SIGTERM (``SIGTERMException``, which would exit 0)
counts as a stop from outside, never as a completed run.
"""

from __future__ import annotations

import os
import time
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package
    import pytorch_lightning as pl

from soak_sidecar_kit import Soak, current

__all__ = ["SoakCallback"]

STOP_CHECKPOINT = "soak-stop-step{step}.ckpt"


class SoakCallback(pl.Callback):  # type: ignore[misc]
    """``checkpoint_dir``: where the soft stop's checkpoint goes (default: the soak's checkpoint
    folder, ``$SOAK_CHECKPOINT_DIR``, when the sidecar names one, else the trainer's
    ``default_root_dir``/soak-checkpoints); ``soak``: the process's kit by default."""

    def __init__(
        self, checkpoint_dir: str | os.PathLike[str] | None = None, soak: Soak | None = None
    ) -> None:
        super().__init__()
        self.soak = soak if soak is not None else current(owner="lightning")
        self._checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self._stopped = False
        self._recorded: str | None = None

    @property
    def resume_checkpoint(self) -> str | None:
        """The checkpoint this attempt resumes from (give it to ``fit(ckpt_path=...)``); None on a
        fresh start."""
        return self.soak.resume_checkpoint

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        strategy = trainer.strategy
        # Any rank's stop stops every rank at the same step (all=False: one vote is enough).
        self.soak.agree_with(lambda local: bool(strategy.reduce_boolean_decision(local, all=False)))

    def on_train_batch_end(
        self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        step = int(trainer.global_step)
        # Lightning's max_steps is -1 when the run is bounded by epochs instead: no total then.
        max_steps = getattr(trainer, "max_steps", -1)
        self.soak.total_steps = self.soak.total_steps or (
            max_steps if isinstance(max_steps, int) and max_steps > 0 else None
        )
        loss = _loss_of(outputs) if self.soak.progress_due() else None
        self.soak.progress(step, loss=loss)
        self._record_model_checkpoint(trainer, step)
        if not self._stopped and self.soak.should_stop():
            self._stopped = True
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if not self._stopped:
            return
        step = int(trainer.global_step)
        directory = (
            self._checkpoint_dir
            or self.soak.checkpoint_dir
            or os.path.join(trainer.default_root_dir, "soak-checkpoints")
        )
        path = os.path.join(directory, STOP_CHECKPOINT.format(step=step))
        started = time.monotonic()
        with self.soak.phase("checkpoint", step):
            trainer.save_checkpoint(path)  # every rank takes part; the strategy decides who writes
        self.soak.checkpoint(step, path, duration_s=time.monotonic() - started)

    def on_fit_end(self, trainer: Any, pl_module: Any) -> None:
        self.soak.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if type(exception).__name__ == "SIGTERMException":
            self.soak.stopped_from_outside()
        self.soak.fail(exception)

    def _record_model_checkpoint(self, trainer: Any, step: int) -> None:
        """A ModelCheckpoint save that landed since the last step: the newest complete checkpoint."""
        callback = getattr(trainer, "checkpoint_callback", None)
        path = getattr(callback, "last_model_path", "") or getattr(callback, "best_model_path", "")
        if path and path != self._recorded and os.path.exists(path):
            self._recorded = path
            self.soak.checkpoint(step, path)


def _loss_of(outputs: Any) -> float | None:
    loss: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(loss.detach().item()) if hasattr(loss, "detach") else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None
