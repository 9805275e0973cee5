"""A pod's sidecar ending before the go-ahead: release the launcher waiting for it."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from sidecar.adapters.rundir.channel import RunDir
from sidecar.core.errors import ConfigError, LauncherError
from sidecar.launcher.protocol import names
from sidecar.launcher.protocol.records import LauncherInfo

# Whether ``pid`` runs as the process that started at ``start_ticks`` clock ticks after boot.
IsRunning = Callable[[int, int], bool]


def release_waiting_launcher(
    run_dir: Path, reason: str, exit_code: int, *, is_running: IsRunning, boot_id: str | None
) -> str:
    """A pod's sidecar is ending before the go-ahead: the launcher must not wait for a go that never
    comes (the pod would linger with the trainer container up). abort.json in the run dir, else
    SIGTERM to the launcher that launcher.json names, verified (pid, start ticks, boot id); nothing
    once go.json exists (heartbeat loss stops the trainer then). The launcher is found through the
    run dir only, never by command lines: any process can look like a launcher. Returns what was
    done, for the log."""
    if (run_dir / names.GO_FILE).exists():
        return "the trainer was started: the launcher stops it when the heartbeat ends"
    channel = RunDir(run_dir)
    try:
        channel.abort(reason, min(max(exit_code, 1), 255))
        return f"abort.json written to {run_dir}"
    except (LauncherError, ConfigError, OSError) as exc:
        unwritable = f"cannot write abort.json to {run_dir} ({exc})"
    try:
        info = channel.launcher()
    except (LauncherError, OSError):
        info = None
    if info is None:
        return f"{unwritable}; no launcher announced there: it stops at its --go-timeout"
    if not _verified(info, is_running, boot_id):
        return (
            f"{unwritable}; {names.LAUNCHER_FILE} names no running launcher (pid {info.pid}): not signalled"
        )
    try:
        os.kill(info.pid, signal.SIGTERM)
    except OSError as exc:
        return f"{unwritable}; cannot signal launcher pid {info.pid}: {exc}"
    return f"{unwritable}; SIGTERM to launcher pid {info.pid}"


def _verified(info: LauncherInfo, is_running: IsRunning, boot_id: str | None) -> bool:
    """The record names a live process, on this boot, started when the record says, that is neither
    init nor this sidecar."""
    return (
        info.pid > 1
        and info.pid != os.getpid()
        and info.start_ticks is not None
        and info.boot_id is not None
        and info.boot_id == boot_id
        and is_running(info.pid, info.start_ticks)
    )
