"""A pod's sidecar ending before the go-ahead: release the launcher waiting for it."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from sidecar.adapters.rundir.channel import RunDir
from sidecar.core.errors import ConfigError, LauncherError
from sidecar.launcher.protocol import names


def launchers() -> list[tuple[int, Path | None]]:
    """Launchers in this PID namespace and the run dir each was given: processes running the
    launcher file with ``--run-dir``. In a pod (shareProcessNamespace) that is the pod's own
    launcher. Command lines are world-readable, so this works under another UID too."""
    name = names.LAUNCHER_FILE_NAME.encode()
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
    if run_dir is not None and (run_dir / names.GO_FILE).exists():
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
        if given is not None and given != run_dir and given.is_dir() and not (given / names.GO_FILE).exists():
            with contextlib.suppress(LauncherError, ConfigError):
                RunDir(given).abort(reason, min(max(exit_code, 1), 255))
                done.append(f"abort.json written to {given}")
                continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
            done.append(f"SIGTERM to launcher pid {pid}")
    return "; ".join(done) if done else "no launcher found to stop"
