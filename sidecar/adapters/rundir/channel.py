"""The sidecar's side of the run dir: it reads the launcher's records (typed, through the protocol's
parsers) and writes its own requests atomically. Every request names the launcher it is for
(``launch_id``), so a stale file of an earlier launcher never counts."""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypeVar

from sidecar.core.errors import AlreadySupervisedError, ConfigError, LauncherError
from sidecar.core.redaction import (
    DEFAULT_RULES,
    RedactionRules,
    redact_command,
    redact_exit_record,
    redact_stacks,
)
from sidecar.launcher.protocol import names
from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.launcher.protocol.fds import FdTable, parse_fd_report
from sidecar.launcher.protocol.fields import ProtocolError
from sidecar.launcher.protocol.files import atomic_write_json, read_json
from sidecar.launcher.protocol.go import GoRequest
from sidecar.launcher.protocol.records import (
    AbortRequest,
    ControlRequest,
    LauncherInfo,
    TrainerInfo,
)
from sidecar.launcher.protocol.stacks import STACKS_LIMIT_BYTES, StacksRecord

Action = Literal["soft_stop", "terminate", "kill"]
SIDECAR_LOCK = ".sidecar.lock"
Record = TypeVar("Record")


def _parsed(parse: Callable[[Mapping[str, Any]], Record], raw: Mapping[str, Any]) -> Record:
    try:
        return parse(raw)
    except ProtocolError as exc:
        raise LauncherError(str(exc)) from exc


class RunDir:
    """The shared run dir seen from the sidecar. Not thread-safe except beat() (own counter)."""

    def __init__(self, path: Path, redaction: RedactionRules = DEFAULT_RULES) -> None:
        self.path = Path(path)
        self._redaction = redaction
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
            atomic_write_json(str(self.file(name)), payload, durable=durable)
        except OSError as exc:
            raise LauncherError(f"cannot write {self.file(name)}: {exc}") from exc

    def _read(self, name: str) -> dict[str, Any] | None:
        raw = read_json(str(self.file(name)))
        if raw is None:
            return None
        if raw.get("protocol") != names.PROTOCOL:
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
            for name in names.RUN_DIR_FILES:
                self.file(name).unlink(missing_ok=True)
            for stale in self.path.glob(".*.tmp"):
                stale.unlink(missing_ok=True)
        except OSError as exc:
            raise LauncherError(f"cannot reset run dir {self.path}: {exc}") from exc
        self._launch_id = None

    # -- launcher -> sidecar ------------------------------------------------------

    def launcher(self) -> LauncherInfo | None:
        raw = self._read(names.LAUNCHER_FILE)
        return None if raw is None else _parsed(LauncherInfo.parse, raw)

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
                raise LauncherError(f"no {names.LAUNCHER_FILE} in {self.path} after {timeout_s:g}s")
            time.sleep(poll_s)

    def trainer(self) -> TrainerInfo | None:
        raw = self._read(names.TRAINER_FILE)
        if raw is None or raw.get("launch_id") != self._launch_id:
            return None
        return _parsed(TrainerInfo.parse, raw)

    def read_exit(self) -> ExitRecord | None:
        """exit.json of this launcher (or a launch_id-less one: it failed before announcing)."""
        raw = self._read(names.EXIT_FILE)
        if raw is None:
            return None
        bound = raw.get("launch_id")
        if bound is not None and self._launch_id is not None and bound != self._launch_id:
            return None
        return redact_exit_record(_parsed(ExitRecord.parse, raw), self._redaction)

    def stacks(self) -> StacksRecord | None:
        """The launcher's stacks.json of this launch, redacted; None when absent or of another
        launch. Evidence only (the trainer can write it too); LauncherError when malformed, or not
        a regular file of a JSON object within its size limit (a link is never followed)."""
        path = self.file(names.STACKS_FILE)
        raw = read_json(str(path), STACKS_LIMIT_BYTES)
        if raw is None and os.path.lexists(path):
            limit = STACKS_LIMIT_BYTES // (1024 * 1024)
            raise LauncherError(
                f"{names.STACKS_FILE} is not a regular file holding a JSON object within {limit} MiB"
            )
        if raw is None or self._launch_id is None or raw.get("launch_id") != self._launch_id:
            return None
        if raw.get("protocol") != names.PROTOCOL:
            raise LauncherError(f"{names.STACKS_FILE}: unsupported protocol {raw.get('protocol')!r:.20}")
        return redact_stacks(_parsed(StacksRecord.parse, raw), self._redaction)

    def fd_report(self) -> dict[tuple[int, int], FdTable]:
        """The launcher's fds.json (the fd tables of a tree under another UID) by (pid, start
        ticks); {} when absent, of another launch or malformed. The trainer can write this file:
        a bad report hides only its own fds and never stops the monitor."""
        raw = read_json(str(self.file(names.FD_REPORT_FILE)), names.FD_REPORT_LIMIT_BYTES)
        if raw is None or self._launch_id is None or raw.get("protocol") != names.PROTOCOL:
            return {}
        try:
            return parse_fd_report(raw, self._launch_id)
        except ProtocolError:
            return {}

    def redact_commands(self) -> None:
        """Rewrite launcher.json and exit.json with every command line in them redacted (the launcher
        knows no rules): a local run dir stays on disk, next to the artifact, after the run. A record
        that cannot be parsed cannot be redacted either: it is removed."""
        for name, parse in (
            (names.LAUNCHER_FILE, self._redacted_launcher_info),
            (names.EXIT_FILE, self._redacted_exit_json),
            (names.STACKS_FILE, self._redacted_stacks),
        ):
            path = self.file(name)
            try:
                redacted = parse()
            except LauncherError:
                redacted = None
            if redacted is not None:
                atomic_write_json(str(path), redacted)
            elif path.exists() or path.is_symlink():
                path.unlink()

    def _redacted_launcher_info(self) -> dict[str, Any] | None:
        raw = self._read(names.LAUNCHER_FILE)
        if raw is None:
            return None
        info = _parsed(LauncherInfo.parse, raw)
        return dataclasses.replace(info, command=redact_command(info.command, self._redaction)).to_json()

    def _redacted_exit_json(self) -> dict[str, Any] | None:
        record = self.read_exit()
        return None if record is None else record.to_json()

    def _redacted_stacks(self) -> dict[str, Any] | None:
        record = self.stacks()
        return None if record is None else record.to_json()

    def go_given(self) -> bool:
        """Whether a sidecar (this one's predecessor, after a restart) already gave the go-ahead."""
        return self.file(names.GO_FILE).exists()

    def wait_exit(self, timeout_s: float, *, poll_s: float = 0.05) -> ExitRecord | None:
        end = time.monotonic() + timeout_s
        while True:
            record = self.read_exit()
            if record is not None or time.monotonic() >= end:
                return record
            time.sleep(poll_s)

    def console_logs(self) -> list[Path]:
        """Existing console log files, oldest first."""
        logs = (names.CONSOLE_LOG_ROTATED, names.CONSOLE_LOG)
        return [self.file(name) for name in logs if self.file(name).is_file()]

    # -- sidecar -> launcher ------------------------------------------------------

    def give_go(self, go: GoRequest, record: Mapping[str, Any] | None = None) -> None:
        """Write the trainer's deadline copy (with the deadline ``record``), then go.json: the
        launcher starts the trainer.

        Start the heartbeat before calling this: the launcher's heartbeat clock starts at go.
        """
        if go.launch_id != self._require_launch_id():
            raise LauncherError(f"go.json names launcher {go.launch_id}, not {self._launch_id}")
        self._write(names.DEADLINE_COPY_FILE, go.deadline_copy(record))
        self._write(names.GO_FILE, go.to_json())

    def abort(self, reason: str, exit_code: int) -> None:
        """Tell the launcher not to start the trainer; it exits with exit_code (1-255).

        Before wait_for_launcher() succeeded the abort is unbound and applies to any launcher.
        """
        if not 1 <= exit_code <= 255:
            raise ConfigError(f"abort exit_code must be 1-255, got {exit_code}")
        self._write(names.ABORT_FILE, AbortRequest(self._launch_id, reason, exit_code).to_json())

    def beat(self) -> None:
        """One heartbeat: new content every time (the launcher watches for change, not mtime)."""
        self._write(
            names.HEARTBEAT_FILE,
            {
                "protocol": names.PROTOCOL,
                "seq": next(self._beats),
                "pid": os.getpid(),
                "wall": time.time(),
                "monotonic": time.monotonic(),
            },
            durable=False,
        )

    def request(self, action: Action, reason: str, *, stacks_timeout_s: float = 0.0) -> int:
        """Ask the launcher to soft_stop, terminate (TERM, KILL after kill_grace_s) or kill; with
        ``stacks_timeout_s``, to take the trainer's stacks (stacks.json) before the TERM."""
        if action not in names.ACTIONS:
            raise ConfigError(f"unknown control action {action!r}")
        launch_id = self._require_launch_id()
        previous = read_json(str(self.file(names.CONTROL_FILE))) or {}
        last = previous.get("seq") if previous.get("launch_id") == launch_id else None
        seq = max(self._control_seq, last if isinstance(last, int) else 0) + 1
        request = ControlRequest(launch_id, seq, action, reason, stacks_timeout_s, time.time())
        self._write(names.CONTROL_FILE, request.to_json())
        self._control_seq = seq
        return seq

    def heartbeat(self, interval_s: float) -> Heartbeat:
        return Heartbeat(self, interval_s)


# The failed heartbeats a Heartbeat keeps the messages of: the first explains the rest.
UNWRITTEN_KEPT = 4


class Heartbeat:
    """Beats the run dir every interval_s on a daemon thread while the context is open.

    The first beat happens synchronously on entry (and raises if the run dir is unwritable);
    later failures are kept in ``unwritten`` (the first ``UNWRITTEN_KEPT``): the launcher then
    fails closed on its own, and the trainer can break the run dir (a directory where the heartbeat
    goes), so the verdict must then not blame a lost sidecar.
    """

    def __init__(self, run_dir: RunDir, interval_s: float) -> None:
        if interval_s <= 0:
            raise ConfigError("heartbeat interval must be > 0")
        self.run_dir = run_dir
        self.interval_s = interval_s
        self.beats = 0
        self.unwritten: list[str] = []
        # The longest time between two heartbeats that landed (the sidecar's own clock): a gap the
        # launcher's timeout could see as a lost sidecar. A stopped or starved sidecar shows it here.
        self.longest_gap_s = 0.0
        self._landed_at = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Heartbeat:
        self.run_dir.beat()
        self.beats = 1
        self._landed_at = time.monotonic()
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
            self._landed()  # the time since the last beat counts too

    def _landed(self) -> None:
        now = time.monotonic()
        self.longest_gap_s = max(self.longest_gap_s, now - self._landed_at)
        self._landed_at = now

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.run_dir.beat()
                self.beats += 1
                self._landed()
            except LauncherError as exc:
                if len(self.unwritten) < UNWRITTEN_KEPT:
                    self.unwritten.append(str(exc))
