"""soak-sidecar's trainer kit: a trainer's side of a soak in a few lines, standard library only.

    import soak_sidecar_kit

    with soak_sidecar_kit.Soak() as soak:          # a run_summary.json at the end, or on an exception
        for step in soak.steps(first_step, steps, save=save, path=ckpt):  # ends at the soft stop,
            train_step()                                                 # save(ckpt) recorded
            soak.progress(step, samples=n, loss=loss)

What it does under soak-sidecar (it reads the launcher's environment; outside a soak it writes nothing
and only answers ``should_stop``):

- **progress**: ``progress.jsonl`` in ``$SOAK_PROGRESS_DIR``, one JSON line per step at most once a
  second (a phase change at once), every line with the run's declared total, bounded in size.
- **soft stop**: a flag set by ``$SOAK_SOFT_STOP_SIGNAL`` (SIGUSR1) and the file
  ``$SOAK_SOFT_STOP_FILE``; with ``torch.distributed`` initialised the ranks agree on it through one
  small collective about once a second (never per step), at the same step on every rank; once
  agreed, late copies of the signal are ignored.
- **checkpoints**: ``checkpoint.json`` (step, path, bytes, seconds), the record the sidecar counts
  lost work from and the pointer a resumed attempt loads (``resume_checkpoint``); also written to
  ``$SOAK_CHECKPOINT_RECORD``, the run's record that outlives the attempt, when the sidecar names
  one. ``checkpoint_dir`` (``$SOAK_CHECKPOINT_DIR``, its folder) is where the adapters save.
- **run_summary.json**: the core profile's document, completed at the end; at a soft stop or on an
  exception, abnormal with the class that fits (a stop is ``external_cancellation``, the trainer's
  own exception ``learner_failure``; the sidecar checks any claim against what it saw).

The files, their fields and bounds are ``soak_sidecar_kit.contract``, which the sidecar's parsers
judge by. A file the kit cannot write is logged (logger ``soak_sidecar_kit``), never raised: the
bookkeeping must not end the training; a wrong argument (an unknown phase) raises ValueError.

Only one process per node writes files (local rank 0); every rank answers ``should_stop``. Runs on
Python 3.9+ (the launcher's minimum), imports nothing outside the standard library, and stays
importable beside the launcher (``soak-sidecar install-launcher``) with nothing installed.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from soak_sidecar_kit import _summary
from soak_sidecar_kit._checkpoint import checkpoint_record, resume_from
from soak_sidecar_kit._files import PROGRESS_MAX_BYTES, ProgressDir
from soak_sidecar_kit._progress import ProgressLog
from soak_sidecar_kit._stop import DEFAULT_CHECK_S, ReduceMax, SoftStop, signal_number
from soak_sidecar_kit.contract import PHASES

__all__ = ["PHASES", "PROGRESS_MAX_BYTES", "Soak", "current"]
__version__ = _summary.KIT_VERSION

_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")

_current: Soak | None = None
_current_lock = threading.Lock()


def current(**options: Any) -> Soak:
    """The process's one Soak, made on first use: the training script and a framework adapter share it."""
    global _current  # noqa: PLW0603 - one per process by design
    with _current_lock:
        if _current is None:
            _current = Soak(**options)
        return _current


class Soak:
    """The trainer's side of a soak, one small facade over its concerns: the soft stop
    (``_stop``), progress records (``_progress``), the checkpoint record (``_checkpoint``) and the
    summary (``_summary``). ``owner`` names the trainer in the shutdown record; ``stop_check_s``
    is how often, at most, the ranks agree on the stop; ``reduce_max`` how (``agree_with``)."""

    def __init__(
        self,
        *,
        owner: str = "trainer",
        environ: Mapping[str, str] | None = None,
        reduce_max: ReduceMax | None = None,
        handle_signal: bool = True,
        progress_interval_s: float = 1.0,
        total_steps: int | None = None,
        stop_check_s: float = DEFAULT_CHECK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if environ is None else environ
        self.owner = owner
        self.rank = _first_int(env, _RANK_VARS)
        self.local_rank = _first_int(env, _LOCAL_RANK_VARS)
        progress = env.get("SOAK_PROGRESS_DIR") or ""
        self.progress_dir: Path | None = Path(progress) if progress else None
        # One writer per node: each pod's sidecar reads its own progress dir.
        self.writes = self.progress_dir is not None and self.local_rank == 0
        files = (
            ProgressDir(self.progress_dir, env.get("SOAK_CHECKPOINT_RECORD") or None)
            if (self.writes and self.progress_dir is not None)
            else None
        )
        self._files = files
        # The soak's checkpoint folder that outlives the attempt, where the adapters save.
        self.checkpoint_dir: str | None = env.get("SOAK_CHECKPOINT_DIR") or None
        self._resume = env.get("SOAK_RESUME_CHECKPOINT") or None
        self._progress = ProgressLog(
            files, interval_s=progress_interval_s, total_steps=total_steps, clock=time.time
        )
        self._stop = SoftStop(
            stop_file=env.get("SOAK_SOFT_STOP_FILE") or None,
            signum=signal_number(env.get("SOAK_SOFT_STOP_SIGNAL", "SIGUSR1")),
            clock=clock,
            check_s=stop_check_s,
            reduce_max=reduce_max,
        )
        self._sections: dict[str, Any] = {}
        self._summary_written = False
        if handle_signal:
            self._stop.install_handler()

    # -- the soft stop -------------------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        """This process's own view: the signal came or the file is there (no collective)."""
        return self._stop.requested

    def should_stop(self) -> bool:
        """Whether to stop now, the same answer at the same call on every rank: call it at the same
        point of every step on every rank. Cheap: the ranks agree (one small collective under
        torch.distributed) about once per ``stop_check_s``, at a call count they agreed on."""
        return self._stop.should_stop()

    def agree_with(self, reduce_max: ReduceMax) -> None:
        """How the ranks agree: ``reduce_max(values)`` returns the elementwise MAX of ``values`` over
        every rank (a framework's own reduction), or None when this process is alone; by default a
        torch.distributed MAX all-reduce."""
        self._stop.agree_with(reduce_max)

    def stopped_from_outside(self) -> None:
        """The framework took a stop signal itself (Lightning's SIGTERM, HF's): what ends the run
        now is a consequence of the stop, not the trainer's own failure."""
        self._stop.ask()

    def steps(
        self,
        start: int,
        stop: int,
        *,
        save: Callable[[str], object] | None = None,
        path: str | os.PathLike[str] | None = None,
    ) -> Iterator[int]:
        """``range(start, stop)`` that ends at the soft stop. Before each step every rank asks
        ``should_stop``; on the stop, ``save(path)`` runs on every rank (the framework decides who
        writes) in the checkpoint phase, and is recorded as the step to go on from: the first step
        not yet trained. The summary is the ``with`` block's."""
        self.total_steps = self.total_steps or stop
        for step in range(start, stop):
            if self.should_stop():
                if save is not None and path is not None:
                    target = os.fspath(path)
                    started = time.monotonic()
                    with self.phase("checkpoint", step):
                        save(target)
                    self.checkpoint(step, target, duration_s=time.monotonic() - started)
                return
            yield step

    # -- progress and checkpoints --------------------------------------------------------------

    @property
    def total_steps(self) -> int | None:
        """The step the run ends at, when known: the sidecar estimates the finish from it."""
        return self._progress.total_steps

    @total_steps.setter
    def total_steps(self, value: int | None) -> None:
        self._progress.total_steps = value

    def progress(
        self,
        step: int,
        *,
        samples: float | None = None,
        tokens: float | None = None,
        loss: float | None = None,
        phase: str = "train",
        force: bool = False,
    ) -> None:
        """One step's progress, in ``phase`` (one of ``PHASES``): written at most once per
        ``progress_interval_s``, at once when the phase changed or ``force``. Non-finite numbers are
        written as null (and the loss flagged)."""
        self._progress.record(step, samples=samples, tokens=tokens, loss=loss, phase=phase, force=force)

    def progress_due(self) -> bool:
        """Whether ``progress`` would write a line now: a costly figure (a loss on the GPU) need only
        be taken then."""
        return self._progress.due()

    @contextlib.contextmanager
    def phase(self, name: str, step: int | None = None) -> Iterator[None]:
        """A stretch of work that is not a training step (``eval``, ``checkpoint``, ``data``,
        ``compile``): written when it starts, and ``train`` when it ends, so a long one is judged
        by its own timeout and what follows by the train timeout."""
        at = self._progress.step or 0 if step is None else step
        self.progress(at, phase=name, force=True)
        try:
            yield
        finally:
            self.progress(at, phase="train", force=True)

    def checkpoint(
        self,
        step: int,
        path: str | os.PathLike[str] | None = None,
        *,
        size_bytes: int | None = None,
        duration_s: float | None = None,
    ) -> None:
        """Record a save now complete on disk: ``step`` is the step a resumed attempt goes on from
        (the first not in the save), ``path`` what it loads (its size measured unless given). The
        record sets no phase: what follows the save is judged as the phase the trainer is in."""
        if self._files is None:
            return
        record = checkpoint_record(step, path, size_bytes=size_bytes, duration_s=duration_s, now=time.time())
        self._files.write_checkpoint(record)
        self._progress.saved(record["step"])

    @property
    def resume_checkpoint(self) -> str | None:
        """What this attempt resumes from: the ``path`` of the approved checkpoint record (the file
        this kit's ``checkpoint`` writes), or the approved file itself; None on a fresh start."""
        return resume_from(self._resume)[0]

    @property
    def resume_step(self) -> int | None:
        """The step the approved checkpoint record names, if it is one of this kit's records."""
        return resume_from(self._resume)[1]

    # -- the summary ---------------------------------------------------------------------------

    def figure(self, **figures: Any) -> None:
        """Extra top-level figures for run_summary.json (JSON values)."""
        self._progress.figures.update(figures)

    def manifest(self, **sections: Any) -> None:
        """Extra sections of the summary's ``runtime_manifest`` (JSON values), for a profile that
        asks for more than the core one (``replay_ingress``, ...); the shutdown record is the kit's."""
        self._sections.update(sections)

    def finish(self) -> None:
        """The run ended without an exception: completed, or stopped by the soft stop."""
        self._end(None)

    def fail(self, error: BaseException) -> None:
        """The run ended by ``error``: a consequence of the stop, or the trainer's own failure."""
        self._end(error)

    def __enter__(self) -> Soak:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if error is None or (isinstance(error, SystemExit) and error.code in (0, None)):
            self.finish()
        else:
            self.fail(error)

    def _end(self, error: BaseException | None) -> None:
        """run_summary.json, once: the first ending wins (an adapter and the script may both end it)."""
        if self._summary_written or self._files is None:
            return
        self._summary_written = True
        self._stop.ignore_late_copies()
        stopping = self._stop.agreed or self._stop.requested
        document = _summary.summary_document(
            figures=self._progress.figures,
            sections=self._sections,
            classification=_summary.ending(stopping=stopping, error=error),
            owner=self.owner,
            phase=self._progress.phase,
            error=error,
        )
        self._files.write_summary(document)


def _first_int(env: Mapping[str, str], names: tuple[str, ...]) -> int:
    for name in names:
        with contextlib.suppress(KeyError, ValueError):
            return int(env[name])
    return 0
