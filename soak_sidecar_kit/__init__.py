"""soak-sidecar's trainer kit: a trainer's side of a soak in a few lines, standard library only.

    import soak_sidecar_kit

    with soak_sidecar_kit.Soak() as soak:          # a run_summary.json at the end, or on an exception
        for step in soak.steps(first_step, steps, save=save, path=ckpt):  # ends at the soft stop,
            train_step()                                                 # save(ckpt) recorded
            soak.progress(step, samples=n, loss=loss)

What it does under soak-sidecar (it reads the launcher's environment; outside a soak it writes nothing
and only answers ``should_stop``):

- **progress**: ``progress.jsonl`` in ``$SOAK_PROGRESS_DIR``, one JSON line per step at most once a
  second (a phase change at once), bounded in size; the sidecar takes any change there as progress.
- **soft stop**: a flag set by ``$SOAK_SOFT_STOP_SIGNAL`` (SIGUSR1) and the file
  ``$SOAK_SOFT_STOP_FILE``; with ``torch.distributed`` initialised the ranks agree on it (MAX) so
  none is left alone in the next collective; once agreed, late copies of the signal are ignored.
- **checkpoints**: ``checkpoint.json`` (step, path, bytes, seconds), the record the sidecar counts
  lost work from and the pointer a resumed attempt loads (``resume_checkpoint``); also written to
  ``$SOAK_CHECKPOINT_RECORD``, the run's record that outlives the attempt, when the sidecar names
  one. ``checkpoint_dir`` (``$SOAK_CHECKPOINT_DIR``, its folder) is where the adapters save.
- **run_summary.json**: the core profile's document, completed at the end; at a soft stop or on an
  exception, abnormal with the class that fits (a stop is ``external_cancellation``, the trainer's
  own exception ``learner_failure``; the sidecar checks any claim against what it saw).

Only one process per node writes files (local rank 0); every rank answers ``should_stop``. Runs on
Python 3.9+ (the launcher's minimum), imports nothing outside the standard library, and stays
importable beside the launcher (``soak-sidecar install-launcher``) with nothing installed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = ["PHASES", "Soak", "current"]
__version__ = "1"

PHASES = ("train", "eval", "checkpoint", "data", "compile")
PROGRESS_FILE = "progress.jsonl"
CHECKPOINT_FILE = "checkpoint.json"
SUMMARY_FILE = "run_summary.json"
# progress.jsonl is started again (the old one kept as .1) past this size: days of one line a second.
PROGRESS_MAX_BYTES = 8 * 1024 * 1024
# A checkpoint record the kit reads back on resume, at most (the sidecar reads 64 KiB of it).
RECORD_MAX_BYTES = 64 * 1024
_RANK_VARS = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_LOCAL_RANK_VARS = ("LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")

Agree = Callable[[bool], bool]
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
    """The trainer's side of a soak. ``owner`` names the trainer in the shutdown record."""

    def __init__(
        self,
        *,
        owner: str = "trainer",
        environ: Mapping[str, str] | None = None,
        agree: Agree | None = None,
        handle_signal: bool = True,
        progress_interval_s: float = 1.0,
        total_steps: int | None = None,
    ) -> None:
        env = os.environ if environ is None else environ
        progress = env.get("SOAK_PROGRESS_DIR") or ""
        self.progress_dir: Path | None = Path(progress) if progress else None
        self.owner = owner
        self.rank = _first_int(env, _RANK_VARS)
        self.local_rank = _first_int(env, _LOCAL_RANK_VARS)
        # One writer per node: each pod's sidecar reads its own progress dir.
        self.writes = self.progress_dir is not None and self.local_rank == 0
        self._stop_file = env.get("SOAK_SOFT_STOP_FILE") or None
        self._resume = env.get("SOAK_RESUME_CHECKPOINT") or None
        # The run's record that outlives the attempt (a checkpoint volume in a pod), and its folder.
        self._record = env.get("SOAK_CHECKPOINT_RECORD") or None
        directory = env.get("SOAK_CHECKPOINT_DIR") or ""
        self.checkpoint_dir: str | None = directory or None
        self._agree = agree
        self._interval_s = progress_interval_s
        # The step the run ends at, when known: the sidecar estimates the finish from it.
        self.total_steps = total_steps
        self._requested = threading.Event()
        self._agreed = False
        self._signum = _signal_number(env.get("SOAK_SOFT_STOP_SIGNAL", "SIGUSR1"))
        self._previous: Any = None
        self._last_line = 0.0
        self._phase = "train"
        self._figures: dict[str, Any] = {}
        self._summary_written = False
        if handle_signal:
            self._install_handler()

    # -- the soft stop -------------------------------------------------------------------------

    @property
    def stop_requested(self) -> bool:
        """This process's own view: the signal came or the file is there (no collective)."""
        if not self._requested.is_set() and self._stop_file is not None and os.path.lexists(self._stop_file):
            self._requested.set()
        return self._requested.is_set()

    @property
    def stopping(self) -> bool:
        """A stop was asked for or agreed: what an exception now is a consequence of."""
        return self._agreed or self._requested.is_set()

    def should_stop(self) -> bool:
        """Whether to stop now, the same answer on every rank: call it at the same point of every
        step on every rank (with torch.distributed initialised it is a collective)."""
        if self._agreed:
            return True
        if self._decide(self.stop_requested):
            self._agreed = True
            self._ignore_late_copies()
        return self._agreed

    def steps(
        self,
        start: int,
        stop: int,
        *,
        save: Callable[[str], object] | None = None,
        path: str | os.PathLike[str] | None = None,
    ) -> Iterator[int]:
        """``range(start, stop)`` that ends at the soft stop. Before each step every rank asks
        ``should_stop`` (a collective under torch.distributed); on the stop, ``save(path)`` runs on
        every rank (the framework decides who writes), the checkpoint is recorded as the step to go
        on from, and the loop ends. The summary is the ``with`` block's."""
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

    def agree_with(self, agree: Agree) -> None:
        """How the ranks agree on a stop: ``agree(local)`` returns True on every rank when any
        rank's ``local`` is (a framework's own reduction); by default a torch.distributed MAX."""
        self._agree = agree

    def stopped_from_outside(self) -> None:
        """The framework took a stop signal itself (Lightning's SIGTERM, HF's): what ends the run
        now is a consequence of the stop, not the trainer's own failure."""
        self._requested.set()

    def _decide(self, local: bool) -> bool:
        if self._agree is not None:
            return bool(self._agree(local))
        return _torch_any(local)

    def _install_handler(self) -> None:
        if self._signum is None or threading.current_thread() is not threading.main_thread():
            return  # the file still works; signals can only be handled in the main thread
        previous = signal.getsignal(self._signum)

        def on_soft_stop(signum: int, frame: Any) -> None:
            self._requested.set()
            if callable(previous):
                previous(signum, frame)

        self._previous = previous
        signal.signal(self._signum, on_soft_stop)

    def _ignore_late_copies(self) -> None:
        """Acted on: a second copy (mpirun forwards it too) must not kill the process, including while
        the interpreter exits and Python restores the default actions."""
        if self._signum is not None and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(self._signum, signal.SIG_IGN)

    # -- progress and checkpoints --------------------------------------------------------------

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
        """One step's progress; written at most once per ``progress_interval_s`` unless the phase
        changed or ``force``. Non-finite numbers are written as null (and the loss flagged)."""
        self._figures["steps"] = int(step)
        for name, value in (("samples", samples), ("tokens", tokens)):
            if value is not None:
                self._figures[name] = _finite(value)
        if loss is not None:
            self._figures["last_loss"] = _finite(loss)
        now = time.time()
        changed = phase != self._phase
        self._phase = phase if phase in PHASES else "train"
        if not self.writes or not (force or changed or now - self._last_line >= self._interval_s):
            return
        self._last_line = now
        line: dict[str, Any] = {"t": round(now, 3), "step": int(step), "phase": self._phase}
        if self.total_steps:
            line["total_steps"] = int(self.total_steps)
        line.update((k, _finite(v)) for k, v in (("samples", samples), ("tokens", tokens)) if v is not None)
        if loss is not None:
            line["loss"] = _finite(loss)
            if line["loss"] is None:
                line["loss_nonfinite"] = True
        self._append_progress(line)

    def progress_due(self) -> bool:
        """Whether ``progress`` would write a line now: a costly figure (a loss on the GPU) need only
        be taken then."""
        return self.writes and time.time() - self._last_line >= self._interval_s

    @contextlib.contextmanager
    def phase(self, name: str, step: int | None = None) -> Iterator[None]:
        """A stretch of work that is not a training step (``eval``, ``checkpoint``, ``data``,
        ``compile``): written when it starts and when it ends, so a long one reads as itself."""
        at = self._figures.get("steps", 0) if step is None else step
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
        bytes: int | None = None,
        duration_s: float | None = None,
    ) -> None:
        """Record a checkpoint that is now complete on disk (checkpoint.json). ``path`` is what a
        resumed attempt loads; its size is measured when ``bytes`` is not given."""
        if not self.writes or self.progress_dir is None:
            return
        record: dict[str, Any] = {"step": int(step), "t": round(time.time(), 3)}
        if path is not None:
            record["path"] = os.path.abspath(os.fspath(path))
            size = _size_of(record["path"]) if bytes is None else int(bytes)
            if size is not None:
                record["bytes"] = size
        if duration_s is not None:
            record["duration_s"] = _finite(duration_s)
        # The attempt's record (the sidecar counts this attempt's checkpoints by it), then the run's,
        # which the next attempt resumes from, when it lives elsewhere.
        _write_json(self.progress_dir / CHECKPOINT_FILE, record)
        if self._record is not None and os.path.abspath(self._record) != str(
            (self.progress_dir / CHECKPOINT_FILE).absolute()
        ):
            with contextlib.suppress(OSError):
                _write_json(Path(self._record), record)
        self._append_progress({"t": record["t"], "step": int(step), "phase": "checkpoint", "saved": True})

    @property
    def resume_checkpoint(self) -> str | None:
        """What this attempt resumes from: the ``path`` of the approved checkpoint record (the file
        this kit's ``checkpoint`` writes), or the approved file itself; None on a fresh start."""
        approved = self._resume
        if approved is None:
            return None
        record = _read_record(approved)
        if record is not None and isinstance(record.get("path"), str) and record["path"]:
            return str(Path(approved).parent / record["path"])
        return approved

    @property
    def resume_step(self) -> int | None:
        """The step the approved checkpoint record names, if it is one of this kit's records."""
        record = None if self._resume is None else _read_record(self._resume)
        step = None if record is None else record.get("step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    # -- the summary ---------------------------------------------------------------------------

    def figure(self, **figures: Any) -> None:
        """Extra top-level figures for run_summary.json (JSON values)."""
        self._figures.update(figures)

    def finish(self) -> None:
        """The run ended without an exception: completed, or stopped by the soft stop."""
        if self.stopping:
            self._summary("external_cancellation", None)
        else:
            self._summary("normal_completion", None)

    def fail(self, error: BaseException) -> None:
        """The run ended by ``error``: a consequence of the stop, or the trainer's own failure."""
        stopped = self.stopping or isinstance(error, KeyboardInterrupt)
        self._summary("external_cancellation" if stopped else "learner_failure", error)

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

    def _summary(self, classification: str, error: BaseException | None) -> None:
        """run_summary.json, once: the first ending wins (an adapter and the script may both end it)."""
        if self._summary_written or not self.writes or self.progress_dir is None:
            return
        self._summary_written = True
        self._ignore_late_copies()
        completed = classification == "normal_completion"
        exception = None
        if error is not None:
            exception = {"type": type(error).__name__, "message": str(error)[:2000]}
        elif classification == "external_cancellation":
            exception = {"type": "SoftStop", "message": "stopped by the soft stop"}
        document = {
            **{k: v for k, v in self._figures.items() if k not in _RESERVED},
            "status": "completed" if completed else "failed",
            "metric_schema_version": 1,
            "runtime_manifest": {
                "schema_version": 2,
                "kit": {"name": "soak_sidecar_kit", "version": __version__},
                "shutdown": {
                    "classification": classification,
                    "owner": self.owner,
                    "phase": "final" if completed else self._phase,
                    "exception": exception,
                    "cleanup": {"errors": []},
                },
            },
        }
        _write_json(self.progress_dir / SUMMARY_FILE, document)

    def _append_progress(self, line: Mapping[str, Any]) -> None:
        if self.progress_dir is None:
            return
        path = self.progress_dir / PROGRESS_FILE
        with contextlib.suppress(OSError):
            if path.stat().st_size > PROGRESS_MAX_BYTES:
                os.replace(path, path.with_name(PROGRESS_FILE + ".1"))
        with contextlib.suppress(OSError), path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(line, allow_nan=False) + "\n")


_RESERVED = frozenset({"status", "metric_schema_version", "runtime_manifest"})


def _torch_any(local: bool) -> bool:
    """True on every rank when any rank's ``local`` is: a MAX all-reduce, when torch.distributed is
    already imported and initialised with more than one rank; ``local`` otherwise."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return local
    torch = sys.modules["torch"]
    # A mixed backend ("cuda:nccl,cpu:gloo", torchtitan's) takes a CPU tensor; NCCL alone a GPU one.
    backend = str(dist.get_backend())
    device = "cpu"
    if "nccl" in backend and "cpu:" not in backend:
        device = f"cuda:{torch.cuda.current_device()}"
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _first_int(env: Mapping[str, str], names: tuple[str, ...]) -> int:
    for name in names:
        with contextlib.suppress(KeyError, ValueError):
            return int(env[name])
    return 0


def _signal_number(name: str) -> int | None:
    number = getattr(signal, name.upper(), None) if name.upper().startswith("SIG") else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def _finite(value: float) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(number):
        return None
    return int(number) if number.is_integer() and abs(number) < 2**53 else number


def _size_of(path: str, limit: int = 100_000) -> int | None:
    """Bytes of a checkpoint file, or of the regular files under a checkpoint directory (at most
    ``limit`` entries looked at; no symlink followed)."""
    try:
        if not os.path.isdir(path):
            return os.stat(path).st_size
    except OSError:
        return None
    total, seen = 0, 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            seen += 1
            if seen > limit:
                return total
            with contextlib.suppress(OSError):
                info = os.lstat(os.path.join(root, name))
                total += info.st_size if not os.path.islink(os.path.join(root, name)) else 0
    return total


def _read_record(path: str) -> dict[str, Any] | None:
    """A JSON object of at most RECORD_MAX_BYTES, not through a symlink; None for anything else."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return None
    try:
        data = os.read(fd, RECORD_MAX_BYTES + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > RECORD_MAX_BYTES:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Whole or absent: a temp file beside it, then one rename. The temp name holds the host too: the
    nodes of a multi-node soak may write one record on a shared volume, with the same PIDs."""
    tmp = path.with_name(f".{path.name}.{socket.gethostname()}.{os.getpid()}.tmp")
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(document, allow_nan=False, indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
