"""From the command line's request to a run: its id, a local run's own directories, the ports."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import IO

from sidecar.app.values import RunRequest
from sidecar.app.wiring import Wiring, build_ports, local_strays
from sidecar.core.errors import ConfigError
from sidecar.core.identity import new_run_id, parse_run_id
from sidecar.settings import Settings, with_defaults


@dataclass(frozen=True)
class PreparedRun:
    settings: Settings
    wiring: Wiring
    request: RunRequest


def prepare_run(
    settings: Settings, command: Sequence[str], *, pod: bool, status_stream: IO[str] | None = sys.stderr
) -> PreparedRun:
    """The run id (pod mode needs the Job's; a local run gets a new one), a local run's layout, and
    the ports the settings choose."""
    if pod and command:
        raise ConfigError("pod mode takes no command: the launcher in the trainer container runs it")
    if settings.deadline.run_id is not None:
        run_id = parse_run_id(settings.deadline.run_id)
    elif pod:
        raise ConfigError("pod mode needs a run id (SOAK_DEADLINE__RUN_ID) shared by every attempt")
    else:
        run_id = new_run_id()
    if not pod:
        settings = local_layout(settings, run_id)
    wiring = build_ports(settings, pod=pod, status_stream=status_stream)
    if not pod:
        wiring = replace(wiring, ports=replace(wiring.ports, strays=local_strays(settings)))
    request = RunRequest(
        mode="pod" if pod else "local",
        run_id=run_id,
        command=tuple(command),
        context=wiring.context,
        attempt_label=wiring.attempt_label,
        index=settings.kube.completion_index if pod else None,
        indexes=settings.kube.completions if pod else 1,
    )
    return PreparedRun(settings, wiring, request)


def local_layout(settings: Settings, run_id: str) -> Settings:
    """Local runs keep their run dir and progress dir apart per run id under the output dir, so
    two runs never share (or reset) each other's files; attempts of one run share them, as a
    resumed trainer needs its checkpoints. Paths the user set are left alone."""
    output = settings.artifact.output_dir
    return with_defaults(
        settings,
        {
            "monitor.progress_dir": output / "runs" / run_id / "progress",
            "launcher.run_dir": output / "runs" / run_id / "run",
            "deadline.store_dir": output / "deadlines",
        },
    )
