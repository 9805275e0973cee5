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
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Literal

from sidecar import launcher as proto
from sidecar.core.errors import AlreadySupervisedError, ConfigError, LauncherError
from sidecar.core.launch_records import (
    ExitRecord,
    FdTable,
    LauncherInfo,
    SoftStopRecord,
    TrainerInfo,
    parse_fd_report,
)
from sidecar.core.trainer_env import trainer_environment

Action = Literal["soft_stop", "terminate", "kill"]
SIDECAR_LOCK = ".sidecar.lock"


def launcher_path() -> Path:
    """The launcher as a single file: what local mode runs and the chart's init container copies."""
    return Path(proto.__file__).resolve()


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
            # No symlink followed: the trainer can write the run dir too.
            flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
            fd = os.open(self.path / SIDECAR_LOCK, flags, 0o644)
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
        if raw.get("reason") not in proto.REASONS:
            raise LauncherError(f"exit.json: unknown reason {raw.get('reason')!r}")
        return ExitRecord.parse(raw)

    def fd_report(self) -> dict[tuple[int, int], FdTable]:
        """The launcher's fds.json (the fd tables of a tree under another UID) by (pid, start
        ticks); {} when absent, of another launch or malformed. The trainer can write this file:
        a bad report hides only its own fds and never stops the monitor."""
        raw = proto.read_json(str(self.file(proto.FD_REPORT_FILE)), proto.FD_REPORT_LIMIT_BYTES)
        if raw is None or self._launch_id is None or raw.get("protocol") != proto.PROTOCOL:
            return {}
        try:
            return parse_fd_report(raw, self._launch_id)
        except LauncherError:
            return {}

    def exit_json(self) -> dict[str, Any] | None:
        """exit.json as the launcher wrote it (for the artifact), None when absent or unreadable."""
        return proto.read_json(str(self.file(proto.EXIT_FILE)))

    def go_given(self) -> bool:
        """Whether a sidecar (this one's predecessor, after a restart) already gave the go-ahead."""
        return self.file(proto.GO_FILE).exists()

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

    def give_go(self, go: proto.GoRequest, record: Mapping[str, Any] | None = None) -> None:
        """Write the trainer's deadline copy (with the deadline ``record``), then go.json: the
        launcher starts the trainer.

        Start the heartbeat before calling this: the launcher's heartbeat clock starts at go.
        """
        if go.launch_id != self._require_launch_id():
            raise LauncherError(f"go.json names launcher {go.launch_id}, not {self._launch_id}")
        self._write(proto.DEADLINE_COPY_FILE, go.deadline_copy(record))
        self._write(proto.GO_FILE, go.to_json())

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

    def heartbeat(self, interval_s: float) -> Heartbeat:
        return Heartbeat(self, interval_s)


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
    keep_env: Sequence[str] = (),
) -> subprocess.Popen[bytes]:
    """Local mode: start the launcher as our child, in its own session (a Ctrl-C at the terminal
    reaches the sidecar, which decides what the trainer gets). owner_pid defaults to this process:
    the launcher kills the trainer as soon as its parent is no longer that process. The launcher,
    and so the trainer, gets this process's environment without the sidecar's settings and
    credentials (sidecar.core.trainer_env), but for the names in ``keep_env``."""
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
            env=trainer_environment(os.environ, keep_env),
        )
    except OSError as exc:
        raise LauncherError(f"cannot start the launcher with {python}: {exc}") from exc


class LocalLauncherSpawner:
    """Starts the launcher as this process's child (local mode); implements LauncherSpawner."""

    def __init__(self, run_dir: Path, *, keep_env: Sequence[str] = ()) -> None:
        self._run_dir = run_dir
        self._keep_env = tuple(keep_env)

    def spawn(
        self, command: Sequence[str], *, go_timeout_s: float, pass_fds: Sequence[int], capture_output: bool
    ) -> subprocess.Popen[bytes]:
        return spawn_local_launcher(
            self._run_dir,
            command,
            go_timeout_s=go_timeout_s,
            pass_fds=pass_fds,
            stdout=subprocess.PIPE if capture_output else None,
            stderr=subprocess.STDOUT if capture_output else None,
            keep_env=self._keep_env,
        )


# ----------------------------------------------------------------------------- early exit (pod)


def launchers() -> list[tuple[int, Path | None]]:
    """Launchers in this PID namespace and the run dir each was given: processes running the
    launcher file with ``--run-dir``. In a pod (shareProcessNamespace) that is the pod's own
    launcher. Command lines are world-readable, so this works under another UID too."""
    name = launcher_path().name.encode()
    found: list[tuple[int, Path | None]] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.endswith(name) for arg in argv[:3]) and b"--run-dir" in argv:
            at = argv.index(b"--run-dir") + 1
            given = argv[at].decode(errors="replace") if at < len(argv) and argv[at] else None
            found.append((int(entry.name), None if given is None else Path(given)))
    return found


def release_waiting_launcher(run_dir: Path | None, reason: str, exit_code: int) -> str:
    """A pod's sidecar is ending before the go-ahead: the launcher must not wait for a go that never
    comes (the pod would linger with the trainer container up). abort.json when the run dir takes it,
    else in the run dir the launcher was given, else SIGTERM to the launcher; nothing once go.json
    exists (heartbeat loss stops the trainer then). Returns what was done, for the log."""
    if run_dir is not None and (run_dir / proto.GO_FILE).exists():
        return "the trainer was started: the launcher stops it when the heartbeat ends"
    if run_dir is not None:
        try:
            RunDir(run_dir).abort(reason, min(max(exit_code, 1), 255))
            return f"abort.json written to {run_dir}"
        except (LauncherError, ConfigError):
            pass  # an unusable run dir: signal the launcher instead
    done = []
    for pid, given in launchers():
        # The launcher's own run dir, from its command line (a sidecar under another UID cannot
        # signal it); SIGTERM where that fails too.
        if given is not None and given != run_dir and given.is_dir() and not (given / proto.GO_FILE).exists():
            with contextlib.suppress(LauncherError, ConfigError):
                RunDir(given).abort(reason, min(max(exit_code, 1), 255))
                done.append(f"abort.json written to {given}")
                continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
            done.append(f"SIGTERM to launcher pid {pid}")
    return "; ".join(done) if done else "no launcher found to stop"
