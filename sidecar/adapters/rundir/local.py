"""Local mode: the sidecar starts the launcher (the built zipapp) as its own child."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from sidecar.adapters.rundir.zipapp import launcher_path
from sidecar.core.errors import ConfigError, LauncherError
from sidecar.core.trainer_env import trainer_environment


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
