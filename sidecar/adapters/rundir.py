"""The sidecar's side of the run-dir protocol (docs/run-dir-protocol.md).

The launcher (``sidecar/launcher.py``, stdlib only) owns the protocol's names; this adapter reads
its records into typed dataclasses and writes the sidecar's requests atomically. Every request
names the launcher it is for (``launch_id``) so a stale file of an earlier launcher never counts.
"""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from sidecar import launcher as proto
from sidecar.core.errors import AlreadySupervisedError, ConfigError, LauncherError

Action = Literal["soft_stop", "terminate", "kill"]
SIDECAR_LOCK = ".sidecar.lock"


def launcher_path() -> Path:
    """The launcher as a single file: what local mode runs and the chart's init container copies."""
    return Path(proto.__file__).resolve()


# ----------------------------------------------------------------------------- records


def _get(raw: Mapping[str, Any], key: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    value = raw.get(key)
    if value is None and optional:
        return None
    # bool is an int subclass: reject it where a number is expected.
    if isinstance(value, bool) and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise LauncherError(f"run dir record: {key} has the wrong type ({value!r})")
    if not isinstance(value, kind):
        raise LauncherError(f"run dir record: {key} has the wrong type ({value!r})")
    return value


def _number(raw: Mapping[str, Any], key: str, *, optional: bool = False) -> float | None:
    value = _get(raw, key, (int, float), optional=optional)
    return None if value is None else float(value)


@dataclass(frozen=True)
class LauncherInfo:
    """launcher.json: who the launcher is (PID-reuse-safe through start_ticks and boot_id)."""

    launch_id: str
    pid: int
    start_ticks: int | None
    boot_id: str | None
    hostname: str
    command: tuple[str, ...]
    python: str
    python_version: str
    subreaper: bool
    owner_pid: int | None
    go_timeout_s: float
    started_unix: float

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> LauncherInfo:
        command = _get(raw, "command", list)
        return cls(
            launch_id=_get(raw, "launch_id", str),
            pid=_get(raw, "pid", int),
            start_ticks=_get(raw, "start_ticks", int, optional=True),
            boot_id=_get(raw, "boot_id", str, optional=True),
            hostname=_get(raw, "hostname", str),
            command=tuple(str(part) for part in command),
            python=_get(raw, "python", str),
            python_version=_get(raw, "python_version", str),
            subreaper=_get(raw, "subreaper", bool),
            owner_pid=_get(raw, "owner_pid", int, optional=True),
            go_timeout_s=float(_get(raw, "go_timeout_s", (int, float))),
            started_unix=float(_get(raw, "started_unix", (int, float))),
        )


@dataclass(frozen=True)
class TrainerInfo:
    """trainer.json: the trainer's process (leader of its own session and process group)."""

    launch_id: str
    pid: int
    pgid: int
    start_ticks: int | None
    started_unix: float

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> TrainerInfo:
        return cls(
            launch_id=_get(raw, "launch_id", str),
            pid=_get(raw, "pid", int),
            pgid=_get(raw, "pgid", int),
            start_ticks=_get(raw, "start_ticks", int, optional=True),
            started_unix=float(_get(raw, "started_unix", (int, float))),
        )


@dataclass(frozen=True)
class SoftStopRecord:
    """soft-stop.json: the launcher told the trainer to checkpoint and stop."""

    reason: str
    deadline_unix: float
    sent_unix: float

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> SoftStopRecord:
        return cls(
            reason=_get(raw, "reason", str),
            deadline_unix=float(_get(raw, "deadline_unix", (int, float))),
            sent_unix=float(_get(raw, "sent_unix", (int, float))),
        )


@dataclass(frozen=True)
class KilledProcess:
    pid: int
    command: str


@dataclass(frozen=True)
class ControlAction:
    seq: int
    action: str
    reason: str | None


@dataclass(frozen=True)
class ExitRecord:
    """exit.json: how the trainer ended and what the launcher had to kill."""

    launch_id: str | None
    exit_code: int
    reason: str
    returncode: int | None = None
    signal: int | None = None
    signal_name: str | None = None
    trainer_pid: int | None = None
    deadline_expired: bool = False
    heartbeat_lost: bool = False
    owner_lost: bool = False
    soft_stop_sent: bool = False
    term_sent: bool = False
    kill_sent: bool = False
    control: tuple[ControlAction, ...] = ()
    signals_forwarded: tuple[str, ...] = ()
    killed_with_trainer: tuple[KilledProcess, ...] = ()
    survivors_killed: tuple[KilledProcess, ...] = ()
    unreaped: tuple[int, ...] = ()
    stdout_dropped_bytes: int = 0
    started_unix: float | None = None
    ended_unix: float | None = None

    @property
    def trainer_started(self) -> bool:
        return self.trainer_pid is not None

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ExitRecord:
        def processes(key: str) -> tuple[KilledProcess, ...]:
            return tuple(
                KilledProcess(pid=_get(item, "pid", int), command=_get(item, "command", str))
                for item in _get(raw, key, list, optional=True) or []
            )

        def flag(key: str) -> bool:
            return bool(_get(raw, key, bool, optional=True))

        reason = _get(raw, "reason", str)
        if reason not in proto.REASONS:
            raise LauncherError(f"exit.json: unknown reason {reason!r}")
        return cls(
            launch_id=_get(raw, "launch_id", str, optional=True),
            exit_code=_get(raw, "exit_code", int),
            reason=reason,
            returncode=_get(raw, "returncode", int, optional=True),
            signal=_get(raw, "signal", int, optional=True),
            signal_name=_get(raw, "signal_name", str, optional=True),
            trainer_pid=_get(raw, "trainer_pid", int, optional=True),
            deadline_expired=flag("deadline_expired"),
            heartbeat_lost=flag("heartbeat_lost"),
            owner_lost=flag("owner_lost"),
            soft_stop_sent=flag("soft_stop_sent"),
            term_sent=flag("term_sent"),
            kill_sent=flag("kill_sent"),
            control=tuple(
                ControlAction(
                    seq=_get(item, "seq", int),
                    action=_get(item, "action", str),
                    reason=_get(item, "reason", str, optional=True),
                )
                for item in _get(raw, "control", list, optional=True) or []
            ),
            signals_forwarded=tuple(
                str(name) for name in _get(raw, "signals_forwarded", list, optional=True) or []
            ),
            killed_with_trainer=processes("killed_with_trainer"),
            survivors_killed=processes("survivors_killed"),
            unreaped=tuple(int(pid) for pid in _get(raw, "unreaped", list, optional=True) or []),
            stdout_dropped_bytes=_get(raw, "stdout_dropped_bytes", int, optional=True) or 0,
            started_unix=_number(raw, "started_unix", optional=True),
            ended_unix=_number(raw, "ended_unix", optional=True),
        )


@dataclass(frozen=True)
class GoRecord:
    """What give_go() wrote: go.json's content and the trainer's deadline copy."""

    deadline_unix: float
    soft_stop_unix: float
    term_unix: float
    env: dict[str, str] = field(default_factory=dict)
    go_path: Path = Path()
    deadline_copy_path: Path = Path()


# ----------------------------------------------------------------------------- the run dir


class RunDir:
    """The shared run dir seen from the sidecar. Not thread-safe except beat() (own counter)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._launch_id: str | None = None
        self._beats = itertools.count(1)
        self._control_seq = 0

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def launch_id(self) -> str | None:
        """The launcher this run dir talks to, once wait_for_launcher() has seen it."""
        return self._launch_id

    def _write(self, name: str, payload: Mapping[str, Any], *, durable: bool = True) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            proto.atomic_write_json(str(self.file(name)), payload, durable=durable)
        except OSError as exc:
            raise LauncherError(f"cannot write {self.file(name)}: {exc}") from exc

    def _read(self, name: str) -> dict[str, Any] | None:
        raw = proto.read_json(str(self.file(name)))
        if raw is None:
            return None
        if raw.get("protocol") != proto.PROTOCOL:
            raise LauncherError(f"{self.file(name)}: unsupported protocol {raw.get('protocol')!r}")
        return raw

    def _require_launch_id(self) -> str:
        if self._launch_id is None:
            raise LauncherError("no launcher seen yet: call wait_for_launcher() first")
        return self._launch_id

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        """Held by the one sidecar that talks to this run dir; a second gets AlreadySupervisedError.

        The lock file is not a protocol file: the launcher never sees it, and a dead sidecar's
        lock goes with its process (a restarted sidecar takes it again).
        """
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path / SIDECAR_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise ConfigError(f"cannot use run dir {self.path}: {exc}") from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError as exc:
                raise AlreadySupervisedError(
                    f"another soak-sidecar is using run dir {self.path}; give each run its own run dir"
                ) from exc
            yield
        finally:
            os.close(fd)

    def reset(self) -> None:
        """Remove a previous run's files (local mode; a pod's emptyDir starts empty)."""
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            for name in proto.RUN_DIR_FILES:
                self.file(name).unlink(missing_ok=True)
            for stale in self.path.glob(".*.tmp"):
                stale.unlink(missing_ok=True)
        except OSError as exc:
            raise LauncherError(f"cannot reset run dir {self.path}: {exc}") from exc
        self._launch_id = None

    # -- launcher -> sidecar ------------------------------------------------------

    def launcher(self) -> LauncherInfo | None:
        raw = self._read(proto.LAUNCHER_FILE)
        return None if raw is None else LauncherInfo.parse(raw)

    def wait_for_launcher(
        self,
        timeout_s: float,
        *,
        poll_s: float = 0.05,
        alive: Callable[[], bool] | None = None,
    ) -> LauncherInfo:
        """Wait for launcher.json; LauncherError on timeout, or when ``alive()`` says the
        launcher process is gone, or when it exited early (exit.json without launcher.json)."""
        end = time.monotonic() + timeout_s
        while True:
            info = self.launcher()
            if info is not None:
                self._launch_id = info.launch_id
                return info
            early = self.read_exit()
            if early is not None:
                raise LauncherError(f"launcher exited before announcing itself: {early.reason}")
            if alive is not None and not alive():
                raise LauncherError("launcher process exited before announcing itself")
            if time.monotonic() >= end:
                raise LauncherError(f"no {proto.LAUNCHER_FILE} in {self.path} after {timeout_s:g}s")
            time.sleep(poll_s)

    def trainer(self) -> TrainerInfo | None:
        raw = self._read(proto.TRAINER_FILE)
        if raw is None or raw.get("launch_id") != self._launch_id:
            return None
        return TrainerInfo.parse(raw)

    def soft_stop_record(self) -> SoftStopRecord | None:
        raw = self._read(proto.SOFT_STOP_FILE)
        if raw is None or raw.get("launch_id") != self._launch_id:
            return None
        return SoftStopRecord.parse(raw)

    def read_exit(self) -> ExitRecord | None:
        """exit.json of this launcher (or a launch_id-less one: it failed before announcing)."""
        raw = self._read(proto.EXIT_FILE)
        if raw is None:
            return None
        bound = raw.get("launch_id")
        if bound is not None and self._launch_id is not None and bound != self._launch_id:
            return None
        return ExitRecord.parse(raw)

    def wait_exit(self, timeout_s: float, *, poll_s: float = 0.05) -> ExitRecord | None:
        end = time.monotonic() + timeout_s
        while True:
            record = self.read_exit()
            if record is not None or time.monotonic() >= end:
                return record
            time.sleep(poll_s)

    def console_logs(self) -> list[Path]:
        """Existing console log files, oldest first."""
        names = (proto.CONSOLE_LOG_ROTATED, proto.CONSOLE_LOG)
        return [self.file(name) for name in names if self.file(name).is_file()]

    # -- sidecar -> launcher ------------------------------------------------------

    def give_go(
        self,
        *,
        deadline_unix: float,
        checkpoint_margin_s: float,
        term_grace_s: float,
        heartbeat_timeout_s: float,
        kill_grace_s: float,
        console_log_bytes: int,
        soft_stop_signal: str = "SIGUSR1",
        run_id: str | None = None,
        progress_dir: Path | None = None,
        env: Mapping[str, str] | None = None,
        deadline_record: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
    ) -> GoRecord:
        """Write the trainer's deadline copy, then go.json (the launcher starts the trainer).

        Start the Heartbeat before calling this: the launcher's heartbeat clock starts at go.
        """
        launch_id = self._require_launch_id()
        try:
            proto.signal_number(soft_stop_signal)
        except ValueError as exc:
            raise ConfigError(f"soft_stop_signal: {exc}") from exc
        soft_stop_unix = deadline_unix - checkpoint_margin_s
        term_unix = deadline_unix - term_grace_s
        copy = {
            "protocol": proto.PROTOCOL,
            "deadline_unix": deadline_unix,
            "soft_stop_unix": soft_stop_unix,
            "term_unix": term_unix,
            "checkpoint_margin_s": checkpoint_margin_s,
            "term_grace_s": term_grace_s,
            "soft_stop_signal": soft_stop_signal,
            "run_id": run_id,
            "record": dict(deadline_record) if deadline_record is not None else None,
        }
        trainer_env = {
            "SOAK_DEADLINE_UNIX": repr(deadline_unix),
            "SOAK_SOFT_STOP_UNIX": repr(soft_stop_unix),
            "SOAK_TERM_UNIX": repr(term_unix),
            "SOAK_CHECKPOINT_MARGIN_S": repr(checkpoint_margin_s),
            "SOAK_SOFT_STOP_SIGNAL": soft_stop_signal,
        }
        if run_id is not None:
            trainer_env["SOAK_RUN_ID"] = run_id
        if progress_dir is not None:
            trainer_env["SOAK_PROGRESS_DIR"] = str(progress_dir)
        trainer_env.update(env or {})
        self._write(proto.DEADLINE_COPY_FILE, copy)
        self._write(
            proto.GO_FILE,
            {
                "protocol": proto.PROTOCOL,
                "launch_id": launch_id,
                "deadline_unix": deadline_unix,
                "checkpoint_margin_s": checkpoint_margin_s,
                "term_grace_s": term_grace_s,
                "heartbeat_timeout_s": heartbeat_timeout_s,
                "kill_grace_s": kill_grace_s,
                "console_log_bytes": console_log_bytes,
                "soft_stop_signal": soft_stop_signal,
                "env": trainer_env,
                "extra_args": list(extra_args),
            },
        )
        return GoRecord(
            deadline_unix=deadline_unix,
            soft_stop_unix=soft_stop_unix,
            term_unix=term_unix,
            env=trainer_env,
            go_path=self.file(proto.GO_FILE),
            deadline_copy_path=self.file(proto.DEADLINE_COPY_FILE),
        )

    def abort(self, reason: str, exit_code: int) -> None:
        """Tell the launcher not to start the trainer; it exits with exit_code (1-255).

        Before wait_for_launcher() succeeded the abort is unbound and applies to any launcher.
        """
        if not 1 <= exit_code <= 255:
            raise ConfigError(f"abort exit_code must be 1-255, got {exit_code}")
        self._write(
            proto.ABORT_FILE,
            {
                "protocol": proto.PROTOCOL,
                "launch_id": self._launch_id,
                "reason": reason,
                "exit_code": exit_code,
            },
        )

    def beat(self) -> None:
        """One heartbeat: new content every time (the launcher watches for change, not mtime)."""
        self._write(
            proto.HEARTBEAT_FILE,
            {
                "protocol": proto.PROTOCOL,
                "seq": next(self._beats),
                "pid": os.getpid(),
                "wall": time.time(),
                "monotonic": time.monotonic(),
            },
            durable=False,
        )

    def request(self, action: Action, reason: str) -> int:
        """Ask the launcher to soft_stop, terminate (TERM, KILL after kill_grace_s) or kill."""
        if action not in proto.ACTIONS:
            raise ConfigError(f"unknown control action {action!r}")
        launch_id = self._require_launch_id()
        previous = proto.read_json(str(self.file(proto.CONTROL_FILE))) or {}
        last = previous.get("seq") if previous.get("launch_id") == launch_id else None
        seq = max(self._control_seq, last if isinstance(last, int) else 0) + 1
        self._write(
            proto.CONTROL_FILE,
            {
                "protocol": proto.PROTOCOL,
                "launch_id": launch_id,
                "seq": seq,
                "action": action,
                "reason": reason,
            },
        )
        self._control_seq = seq
        return seq


class Heartbeat:
    """Beats the run dir every interval_s on a daemon thread while the context is open.

    The first beat happens synchronously on entry (and raises if the run dir is unwritable);
    later failures are kept in ``last_error``: the launcher then fails closed on its own.
    """

    def __init__(self, run_dir: RunDir, interval_s: float) -> None:
        if interval_s <= 0:
            raise ConfigError("heartbeat interval must be > 0")
        self.run_dir = run_dir
        self.interval_s = interval_s
        self.beats = 0
        self.last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        self.run_dir.beat()
        self.beats = 1
        self._thread = threading.Thread(target=self._loop, name="soak-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_dir.beat()
                self.beats += 1
                self.last_error = None
            except LauncherError as exc:
                self.last_error = str(exc)


def spawn_local_launcher(
    run_dir: Path,
    command: Sequence[str],
    *,
    python: str = sys.executable,
    owner_pid: int | None = None,
    go_timeout_s: float | None = None,
    stdout: int | IO[bytes] | None = None,
    stderr: int | IO[bytes] | None = None,
    pass_fds: Sequence[int] = (),
) -> subprocess.Popen[bytes]:
    """Local mode: start the launcher as our child, in its own session (a Ctrl-C at the terminal
    reaches the sidecar, which decides what the trainer gets). owner_pid defaults to this process:
    the launcher kills the trainer as soon as its parent is no longer that process."""
    if not command:
        raise ConfigError("missing trainer command")
    argv = [
        python,
        str(launcher_path()),
        "--run-dir",
        str(run_dir),
        "--owner-pid",
        str(os.getpid() if owner_pid is None else owner_pid),
    ]
    if go_timeout_s is not None:
        argv += ["--go-timeout", repr(go_timeout_s)]
    argv += ["--", *command]
    try:
        return subprocess.Popen(
            argv,
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            pass_fds=tuple(pass_fds),
        )
    except OSError as exc:
        raise LauncherError(f"cannot start the launcher with {python}: {exc}") from exc


# ----------------------------------------------------------------------------- early exit (pod)


def launcher_pids() -> list[int]:
    """PIDs of launchers in this PID namespace: processes running the launcher file with
    ``--run-dir``. In a pod (shareProcessNamespace) that is the pod's own launcher, whatever run dir
    it was given."""
    name = launcher_path().name.encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(name) for arg in argv[:3]) and b"--run-dir" in argv:
            found.append(int(entry.name))
    return found


def release_waiting_launcher(run_dir: Path | None, reason: str, exit_code: int) -> str:
    """A pod's sidecar is ending before the go-ahead: the launcher must not wait for a go that never
    comes (the pod would linger with the trainer container up). abort.json when the run dir takes it,
    SIGTERM to the launcher otherwise; nothing once go.json exists (heartbeat loss stops the trainer
    then). Returns what was done, for the log."""
    if run_dir is not None and (run_dir / proto.GO_FILE).exists():
        return "the trainer was started: the launcher stops it when the heartbeat ends"
    if run_dir is not None:
        try:
            RunDir(run_dir).abort(reason, min(max(exit_code, 1), 255))
            return f"abort.json written to {run_dir}"
        except (LauncherError, ConfigError):
            pass  # an unusable run dir: signal the launcher instead
    pids = launcher_pids()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    return f"SIGTERM to launcher pid(s) {pids}" if pids else "no launcher found to stop"
