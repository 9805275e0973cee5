"""PyTorch Lightning (2.x) adapter: a Callback that does the trainer's side of a soak.

    from soak_sidecar_kit.lightning import SoakCallback

    soak = SoakCallback()
    trainer = L.Trainer(max_steps=1000, callbacks=[soak])
    trainer.fit(model, datamodule, ckpt_path=soak.resume_checkpoint)

Progress every batch, in the phase Lightning is in: ``eval`` from a validation's start (the sanity
check's too) to its end, ``checkpoint`` while any save is written (``ModelCheckpoint``'s, its
``last.ckpt``, the script's own ``trainer.save_checkpoint``), each recorded as it lands with the step
it holds; ``train`` again at once after either. On the soft stop every rank stops after the same
optimizer step (the strategy's own MAX reduction), the callback saves through
``trainer.save_checkpoint``, and the summary says the soak was stopped. A resumed attempt passes the
recorded checkpoint to ``fit`` (``resume_checkpoint``), so Lightning restores the model, optimizers,
loops and callbacks itself. An exception ends the run with a summary of the right class; Lightning's
swallowed SIGTERM (``SIGTERMException``, which would exit 0) counts as a stop from outside, never as
a completed run.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
from typing_extensions import override

try:
    import lightning.pytorch as pl
    from lightning.pytorch.plugins.io import CheckpointIO
    from lightning.pytorch.utilities.exceptions import SIGTERMException  # every Lightning 2.x
    from lightning.pytorch.utilities.types import STEP_OUTPUT
except ImportError:  # the standalone package
    import pytorch_lightning as pl
    from pytorch_lightning.plugins.io import CheckpointIO
    from pytorch_lightning.utilities.exceptions import SIGTERMException
    from pytorch_lightning.utilities.types import STEP_OUTPUT

from soak_sidecar_kit import Soak, current

__all__ = ["SoakCallback"]

STOP_CHECKPOINT = "soak-stop-step{step}.ckpt"


class SoakCallback(pl.Callback):  # type: ignore[misc]
    """``checkpoint_dir``: where the soft stop's checkpoint goes (default: the soak's checkpoint
    folder, ``$SOAK_CHECKPOINT_DIR``, when the sidecar names one, else the trainer's
    ``default_root_dir``/soak-checkpoints); ``soak``: the process's kit by default.

    A plain Callback, not a ``Checkpoint``: Lightning counts any Checkpoint as the user's checkpointing,
    so it would refuse ``enable_checkpointing=False``, drop its default ModelCheckpoint, and hand this
    callback out as ``trainer.checkpoint_callback``. Saves are seen in the save itself (the
    CheckpointIO below), whatever order the callbacks run in."""

    def __init__(
        self, checkpoint_dir: str | os.PathLike[str] | None = None, soak: Soak | None = None
    ) -> None:
        super().__init__()
        self.soak = soak if soak is not None else current(owner="lightning")
        self._checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self._stopped = False
        self._asked_at: int | None = None
        self._io: _RecordingCheckpointIO | None = None

    @property
    def resume_checkpoint(self) -> str | None:
        """The checkpoint this attempt resumes from (give it to ``fit(ckpt_path=...)``); None on a
        fresh start."""
        return self.soak.resume_checkpoint

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        strategy = trainer.strategy

        def reduce_max(values: list[int]) -> list[int]:
            # DDP's reduce is a MAX all-reduce over the world; a single device's, the identity.
            local = torch.tensor(values, dtype=torch.int64, device=strategy.root_device)
            return [int(value) for value in strategy.reduce(local, reduce_op="max").tolist()]

        self.soak.agree_with(reduce_max)
        # CheckpointIO is Lightning's own seam for where a checkpoint is written (a user's plugin
        # wraps the same way): every save of every kind passes through it, on the rank that writes,
        # with the state's own global_step. Whatever plugin the strategy has stays the writer.
        if not isinstance(strategy.checkpoint_io, _RecordingCheckpointIO):
            strategy.checkpoint_io = _RecordingCheckpointIO(strategy.checkpoint_io, self.soak)
        self._io = strategy.checkpoint_io

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning's max_steps is -1 when the run is bounded by epochs instead: no total then.
        if trainer.max_steps > 0:
            self.soak.total_steps = self.soak.total_steps or trainer.max_steps
        self._asked_at = trainer.global_step

    @override
    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: STEP_OUTPUT,
        batch: Any,
        batch_idx: int,
    ) -> None:
        step = trainer.global_step
        loss = _loss_of(outputs) if self.soak.progress_due() else None
        self.soak.progress(step, loss=loss)
        # Asked once per optimizer step, never between accumulated batches: every rank asks at the
        # same steps, and a stop never drops half an accumulation.
        if step != self._asked_at:
            self._asked_at = step
            if self.soak.should_stop():
                self._stopped = trainer.should_stop = True

    @override
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Every validation loop, the sanity check's included, starts and ends with these hooks.
        self.soak.progress(trainer.global_step, phase="eval")

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.soak.progress(trainer.global_step, phase="train")

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        # The save has begun (its state gathered; the module's own hook and the write to come): the
        # writing rank's CheckpointIO ends the phase once the file is written.
        if trainer.is_global_zero:
            self.soak.progress(trainer.global_step, phase="checkpoint")

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self._stopped:
            return
        step = trainer.global_step
        directory = (
            self._checkpoint_dir
            or self.soak.checkpoint_dir
            or os.path.join(trainer.default_root_dir, "soak-checkpoints")
        )
        path = os.path.join(directory, STOP_CHECKPOINT.format(step=step))
        trainer.save_checkpoint(path)  # every rank takes part; the strategy decides who writes
        if self._io is None or self._io.last_path != path:
            # Written elsewhere (another node's rank) or not through CheckpointIO (DeepSpeed's
            # engine, FSDP's sharded save): this node's record still names the stop's checkpoint.
            self.soak.checkpoint(step, path)

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.soak.finish()

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if isinstance(exception, SIGTERMException):
            self.soak.stopped_from_outside()
        self.soak.fail(exception)


class _RecordingCheckpointIO(CheckpointIO):  # type: ignore[misc]
    """The strategy's CheckpointIO, each save written in the ``checkpoint`` phase and recorded once
    it is on disk, with the step it holds: a resumed attempt goes on from its ``global_step``."""

    def __init__(self, inner: CheckpointIO, soak: Soak) -> None:
        super().__init__()
        self.inner = inner
        self.soak = soak
        self.last_path: str | None = None

    @override
    def save_checkpoint(
        self,
        checkpoint: dict[str, Any],
        path: str | os.PathLike[str],
        storage_options: Any | None = None,
    ) -> None:
        step = int(checkpoint["global_step"])
        started = time.monotonic()
        with self.soak.phase("checkpoint", step):
            self.inner.save_checkpoint(checkpoint, path, storage_options=storage_options)
        self.last_path = os.fspath(path)
        self.soak.checkpoint(step, path, duration_s=time.monotonic() - started)

    @override
    def load_checkpoint(self, path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> dict[str, Any]:
        loaded: dict[str, Any] = self.inner.load_checkpoint(path, *args, **kwargs)
        return loaded

    @override
    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        self.inner.remove_checkpoint(path)

    @override
    def teardown(self) -> None:
        self.inner.teardown()  # an asynchronous plugin waits for its last write here


def _loss_of(outputs: STEP_OUTPUT) -> float | None:
    loss: Any = outputs.get("loss") if isinstance(outputs, dict) else outputs
    try:
        return float(loss.detach().item()) if hasattr(loss, "detach") else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None
