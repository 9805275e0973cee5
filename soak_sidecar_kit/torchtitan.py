"""torchtitan (0.3) adapter: the soak as torchtitan's own subclasses of its components.

Run torchtitan's own entry point with the soak, no line of yours changed::

    torchrun --nproc_per_node=8 -m soak_sidecar_kit.torchtitan --module llama3 --config llama3_8b ...

or, in a script of your own that builds the trainer from its config::

    from soak_sidecar_kit.torchtitan import soak_config

    trainer = soak_config(config).build()
    trainer.train()

torchtitan builds a config's owner (``Configurable``): ``soak_config`` turns a ``Trainer.Config`` into
``SoakTrainer.Config``, whose build makes ``SoakTrainer``, which in turn builds its checkpointer,
validator and metrics from the soak's configs of them (``SoakCheckpointManager``, ``SoakValidator``,
``SoakMetricsProcessor``). A config of your own ``Trainer`` subclass (or checkpointer, validator,
metrics subclass) gets a subclass of both, yours and the soak's, made here at run time.

What the trainer then does: progress every step (step, the tokens this rank has seen, the loss when
torchtitan logs it); an ``eval`` phase around each validation and a ``checkpoint`` phase around each
save, and a record of every save once complete on disk (an asynchronous one once it finished; not a
model-only final save, which cannot be resumed from); on the soft stop every rank stops after the
same step and the checkpointer saves a full checkpoint of that step (model, optimizers, schedulers,
dataloader, train state, whatever ``last_save_model_only`` says) into ``checkpoint.folder``; and
``train`` ends with the run's summary, of the right class on an exception. Checkpointing must be on
(``--checkpoint.enable``) for the stop to save anything. When the sidecar names a checkpoint folder
that outlives the attempt (``$SOAK_CHECKPOINT_DIR``, a pod's checkpoint volume), ``checkpoint.folder``
is moved into it. Under a soak an attempt loads exactly what the soak approved: the approved step, or
none of the folder's steps on a fresh attempt (``initial_load_path`` still applies). Outside a soak,
torchtitan's own rule: the newest complete step in ``checkpoint.folder``.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
import types
from typing import Any

from torchtitan import train as entry
from torchtitan.components.checkpoint import CheckpointManager
from torchtitan.components.metrics import MetricsProcessor
from torchtitan.components.validate import Validator
from torchtitan.config import ConfigManager
from torchtitan.trainer import Trainer

from soak_sidecar_kit import Soak, current

__all__ = [
    "SoakCheckpointManager",
    "SoakConfigManager",
    "SoakMetricsProcessor",
    "SoakTrainer",
    "SoakValidator",
    "attach",
    "main",
    "soak_config",
]

_STEP_DIR = re.compile(r"step-(\d+)")


class SoakCheckpointManager(CheckpointManager):  # type: ignore[misc]
    """torchtitan's DCP checkpointer, its saves recorded and its loads the soak's."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(CheckpointManager.Config):  # type: ignore[misc]
        """Builds ``SoakCheckpointManager``."""

    folder: str
    last_save_model_only: bool
    last_save_in_hf: bool

    def __init__(self, config: Any, **components: Any) -> None:
        super().__init__(config, **components)
        self._start_soak()

    def _start_soak(self) -> None:
        self.soak = current(owner="torchtitan")
        self.recorded_step: int | None = None
        self.pending: tuple[int, str, float] | None = None  # an asynchronous save not yet on disk
        if self.enable and self.soak.checkpoint_dir is not None:
            # The soak's folder outlives the attempt (a pod's checkpoint volume): saves and loads go
            # there, so that the next attempt finds them.
            name = os.path.basename(os.path.normpath(self.folder))
            self.folder = os.path.join(self.soak.checkpoint_dir, name)

    def _save(self, curr_step: int, last_step: bool = False) -> bool:
        self._record_pending(finished_only=True)  # torchtitan calls save every step
        if not self._should_save(curr_step, last_step):
            return False
        started = time.monotonic()
        with self.soak.phase("checkpoint", curr_step):
            saved = bool(super()._save(curr_step, last_step))
        if not saved or (last_step and self.last_save_model_only):
            return saved  # a model-only final save cannot be resumed from: not a record
        path = os.path.abspath(self._create_checkpoint_id(curr_step))
        self.pending = (curr_step, path, started)
        self._record_pending(finished_only=self.save_future is not None)
        return saved

    def _wait_for_saving(self) -> None:
        super()._wait_for_saving()
        self._record_pending()

    def _record_pending(self, finished_only: bool = False) -> None:
        if self.pending is None:
            return
        if finished_only and self.save_future is not None and not self.save_future.done():
            return
        step, path, started = self.pending
        self.pending = None
        self.recorded_step = step
        self.soak.checkpoint(step, path, duration_s=time.monotonic() - started)

    def _load(self, step: int = -1) -> bool:
        approved = self.soak.resume_checkpoint
        if step == -1 and self.soak.progress_dir is not None and approved is not None:
            step = self._approved_step(approved)
        return bool(super()._load(step))

    def _find_load_step(self, folder: str = "") -> int:
        # Asked only when no step is: under a soak that approved none, a fresh attempt loads none of
        # the folder's steps (an earlier run's, or one the soak never approved), and torchtitan goes
        # on to initial_load_path. Another folder (torchft's replicas) keeps torchtitan's rule.
        if self.soak.progress_dir is not None and not folder:
            return -1
        return int(super()._find_load_step(folder))

    def _approved_step(self, approved: str) -> int:
        found = _STEP_DIR.fullmatch(os.path.basename(os.path.normpath(approved)))
        parent = os.path.realpath(os.path.dirname(os.path.normpath(approved)))
        if found is None or parent != os.path.realpath(self.folder):
            raise ValueError(
                f"soak_sidecar_kit: the approved checkpoint {approved} is not a step-N folder of "
                f"torchtitan's checkpoint.folder ({self.folder}); torchtitan resumes from its own folder"
            )
        if self.soak.rank == 0:
            print(f"soak_sidecar_kit: resuming from {approved}", flush=True)
        return int(found.group(1))

    def save_for_stop(self, step: int) -> None:
        """The soft stop's save: a full checkpoint of ``step``, resumable, unless it is saved already."""
        self.maybe_wait_for_saving()  # an asynchronous save still on its way is recorded once on disk
        if step in (0, self.recorded_step):
            return  # nothing trained yet, or this step's save already landed
        if not self.enable:
            if self.soak.rank == 0:
                print("soak_sidecar_kit: checkpointing is off (checkpoint.enable): the stop saves nothing")
            return
        # The final save's model-only and HF options are for a finished run, not a stopped one.
        kept = self.last_save_model_only, self.last_save_in_hf
        self.last_save_model_only = self.last_save_in_hf = False
        try:
            self.save(step, last_step=True)
        finally:
            self.last_save_model_only, self.last_save_in_hf = kept


class SoakValidator(Validator):  # type: ignore[misc]
    """torchtitan's validator, each validation in the ``eval`` phase (the eval timeout's)."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(Validator.Config):  # type: ignore[misc]
        """Builds ``SoakValidator``."""

    def validate(self, model_parts: list[Any], step: int) -> None:
        with current(owner="torchtitan").phase("eval", step):
            super().validate(model_parts, step)


class SoakMetricsProcessor(MetricsProcessor):  # type: ignore[misc]
    """torchtitan's metrics, the last loss logged kept for the progress records."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(MetricsProcessor.Config):  # type: ignore[misc]
        """Builds ``SoakMetricsProcessor``."""

    loss: float | None = None

    def log(self, step: int, global_avg_loss: Any, *args: Any, **kwargs: Any) -> None:
        self.loss = _float_or_none(global_avg_loss)
        super().log(step, global_avg_loss, *args, **kwargs)


# The trainer's components the soak has subclasses of, by the trainer config's field.
_PARTS = {
    "checkpoint": ("checkpointer", SoakCheckpointManager),
    "validator": ("validator", SoakValidator),
    "metrics": ("metrics_processor", SoakMetricsProcessor),
}


class SoakTrainer(Trainer):  # type: ignore[misc]
    """torchtitan's Trainer with the soak: its components the soak's, progress every step, the soft
    stop checked once a step, and the summary at the end of ``train``."""

    @dataclasses.dataclass(kw_only=True, slots=True)
    class Config(Trainer.Config):  # type: ignore[misc]
        """Builds ``SoakTrainer``."""

    def __init__(self, config: Any) -> None:
        for field, (_, soak) in _PARTS.items():
            setattr(config, field, _soaked_config(getattr(config, field), soak))
        super().__init__(config)
        self._start_soak()

    def _start_soak(self) -> None:
        self.soak = current(owner="torchtitan")
        self.soak.total_steps = self.soak.total_steps or self.config.training.steps

    def train(self) -> None:
        with self.soak:
            super().train()

    def train_step(self, data_iterator: Any) -> None:
        super().train_step(data_iterator)
        metrics = self.metrics_processor
        loss = metrics.loss if isinstance(metrics, SoakMetricsProcessor) else None
        self.soak.progress(int(self.step), tokens=self.ntokens_seen, loss=loss)

    def should_continue_training(self) -> bool:
        # Checked once a step on every rank, where torchtitan's loop asks: the ranks stop together.
        if not super().should_continue_training():
            return False
        if not self.soak.should_stop():
            return True
        if isinstance(self.checkpointer, SoakCheckpointManager):
            self.checkpointer.save_for_stop(int(self.step))
        elif self.soak.rank == 0:
            print("soak_sidecar_kit: the checkpointer is no CheckpointManager: the stop saves nothing")
        return False


def soak_config(config: Any) -> Any:
    """``config`` (a ``Trainer.Config``, or a ``Trainer`` subclass's) as the same trainer's with the
    soak: ``soak_config(config).build()`` builds it."""
    return _soaked_config(config, SoakTrainer)


class SoakConfigManager(ConfigManager):  # type: ignore[misc]
    """torchtitan's ConfigManager: the config it parses (registry function and CLI), with the soak."""

    def parse_args(self, args: list[str] | None = None) -> Any:
        self.config = soak_config(super().parse_args(args))
        return self.config


def main() -> None:
    """``torchtitan.train``'s entry point, the trainer it builds with the soak."""
    # torchtitan.train.main makes its ConfigManager by this module-level name and takes none as an
    # argument: naming ours there is the smallest seam, and the rest of main (structured logger,
    # seed checkpoint, close, process group teardown) stays torchtitan's.
    entry.ConfigManager = SoakConfigManager
    entry.main()


def attach(trainer: Any) -> Soak:
    """The soak for a trainer already built (``trainer = config.build()``), before ``train()``:
    ``soak_config(config).build()`` is the same, built so."""
    parts: list[tuple[Any, Any]] = [(trainer, SoakTrainer)]
    parts += [(getattr(trainer, name, None), soak) for name, soak in _PARTS.values()]
    for part, soak in parts:
        if isinstance(part, soak.__base__) and not isinstance(part, soak):
            # Built already: each part's class becomes the soak's subclass of it, the class
            # soak_config would have built (it adds no attribute but what _start_soak sets).
            part.__class__ = _soaked(part.__class__, soak)
            if hasattr(part, "_start_soak"):
                part._start_soak()
    return current(owner="torchtitan")


def _soaked_config(config: Any, soak: Any) -> Any:
    """``config``, its owner (the class it builds) made the soak's subclass of that owner; a config of
    a class the soak has no subclass for (another checkpointer) as it is."""
    owner = type(config)._owner
    if owner is None or not issubclass(owner, soak.__base__):
        return config
    made = _soaked(owner, soak)
    if made is owner:
        return config
    values = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.init}
    return made.Config(**values)


@functools.cache
def _soaked(owner: Any, soak: Any) -> Any:
    """``soak`` for torchtitan's own ``owner``, ``owner`` when it has the soak already, or else, for a
    subclass of yours known only at run time, a class made here of both (the soak's methods first)
    with its own Config: torchtitan builds a Config's ``_owner``, the class that declares it."""
    if issubclass(owner, soak):
        return owner
    if owner is soak.__base__:
        return soak
    name = f"Soak{owner.__name__}"
    config: Any = dataclasses.dataclass(kw_only=True, slots=True)(
        types.new_class(
            "Config",
            (owner.Config,),
            exec_body=lambda ns: ns.update(__module__=__name__, __qualname__=f"{name}.Config"),
        )
    )
    return types.new_class(
        name, (soak, owner), exec_body=lambda ns: ns.update(__module__=__name__, Config=config)
    )


def _float_or_none(value: Any) -> float | None:
    try:
        return float(value.item()) if hasattr(value, "item") else float(value)
    except (TypeError, ValueError, RuntimeError):
        return None


if __name__ == "__main__":
    main()
