"""The ports of a run: the core's (sidecar.core.ports) and those that speak the launcher's protocol.

The launcher channel's Protocols live here rather than in the core because they carry the
launcher's own record type (``GoRequest``, from the stdlib-only launcher module), which the pure
core may not import. Adapters implement them structurally.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Protocol

from sidecar.core.artifact.lost import FoundAttempt
from sidecar.core.disruption import StopEvidence
from sidecar.core.identity import RunIdentity
from sidecar.core.pod_facts import ContainerState, PodMoments
from sidecar.core.ports import (
    ArtifactSink,
    DeadlineStore,
    GpuBackend,
    LedgerStore,
    MetricsSink,
    NodeClock,
    ProcessTable,
    ProgressProbe,
    ReferenceClock,
    TrainerMemory,
)
from sidecar.core.publication import Publication
from sidecar.core.redaction import RedactionRules
from sidecar.core.run_summary import ManifestValidator, ValidatorUnavailable
from sidecar.core.running_annotations import ProgressFigures
from sidecar.core.samples import ProcessInfo
from sidecar.core.store_features import StoreFeatures
from sidecar.launcher.protocol.exit import ExitRecord
from sidecar.launcher.protocol.go import GoRequest
from sidecar.launcher.protocol.records import LauncherInfo, TrainerInfo
from sidecar.launcher.protocol.stacks import StacksRecord
from sidecar.settings import DeadlineSettings

StopRequest = Literal["soft_stop", "terminate", "kill"]


class LauncherChannel(Protocol):
    """The run dir as the sidecar speaks it (docs/run-dir-protocol.md)."""

    @property
    def launch_id(self) -> str | None: ...
    def exclusive(self) -> AbstractContextManager[None]:
        """Held by the one sidecar of this run dir; AlreadySupervisedError for a second."""
        ...

    def reset(self) -> None: ...
    def wait_for_launcher(
        self, timeout_s: float, *, alive: Callable[[], bool] | None = None
    ) -> LauncherInfo: ...
    def go_given(self) -> bool: ...
    def give_go(self, go: GoRequest, record: Mapping[str, Any] | None = None) -> None: ...
    def abort(self, reason: str, exit_code: int) -> None: ...
    def request(self, action: StopRequest, reason: str, *, stacks_timeout_s: float = 0.0) -> int: ...
    def heartbeat(self, interval_s: float) -> AbstractContextManager[HeartbeatStatus]: ...
    def trainer(self) -> TrainerInfo | None: ...
    def read_exit(self) -> ExitRecord | None: ...
    def stacks(self) -> StacksRecord | None: ...
    def wait_exit(self, timeout_s: float) -> ExitRecord | None: ...
    def console_logs(self) -> list[Path]: ...
    def redact_commands(self) -> None:
        """Leave no unredacted command line in the run dir's records."""
        ...


class HeartbeatStatus(Protocol):
    @property
    def unwritten(self) -> Sequence[str]:
        """Why heartbeats could not be written, the first few; empty while all were."""
        ...

    @property
    def longest_gap_s(self) -> float:
        """The longest time between two heartbeats that were written (the sidecar's clock)."""
        ...


class LocalLauncher(Protocol):
    """A launcher this process started (local mode); ``subprocess.Popen`` is one."""

    @property
    def pid(self) -> int: ...
    @property
    def stdout(self) -> IO[bytes] | None: ...
    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


class LauncherSpawner(Protocol):
    def spawn(
        self, command: Sequence[str], *, go_timeout_s: float, pass_fds: Sequence[int], capture_output: bool
    ) -> LocalLauncher: ...


class SampleLog(Protocol):
    error: str | None
    flushed_bytes: int

    def write_line(self, line: str) -> None: ...
    def close(self) -> None: ...


class ArtifactFiles(Protocol):
    """The attempt's local artifact directory."""

    path: Path

    def create(self) -> None: ...
    def open_samples(self, name: str) -> SampleLog: ...
    def write(self, name: str, data: bytes) -> Path: ...
    def keep_copies(self, files: Sequence[Path]) -> list[Path]: ...
    def existing(self, names: Sequence[str]) -> list[Path]: ...
    def sha256(self, name: str) -> str | None: ...
    def read_span(
        self, source: Path, offset_for: Callable[[int, bytes], int], limit: int
    ) -> tuple[int, bytes, int, bytes]:
        """(inode, first bytes, offset, bytes) of a regular file from ``offset_for(inode, first
        bytes)``, never through a link; OSError when unreadable."""
        ...


class AttemptHistory(Protocol):
    """Where earlier attempts of a run left their evidence (the local output dir, the bucket)."""

    def find(self, run_id: str, runs_prefix: str) -> Iterator[FoundAttempt]:
        """Each attempt location found for ``run_id`` (the bucket is listed under ``runs_prefix``),
        read as it is asked for; TransientError when it cannot be read."""
        ...


class Provenance(Protocol):
    def describe(self) -> dict[str, Any]:
        """``source``, ``software``, ``hostname`` and ``boot_id`` of where the sidecar runs."""
        ...


class Publisher(Protocol):
    """The verdict where the cluster shows it (pod annotations)."""

    def publish(self, publication: Publication) -> list[str]:
        """Problems, one line each; an empty list when published."""
        ...

    def progress(
        self, state: str, now_wall: float, now_monotonic: float, figures: ProgressFigures | None = None
    ) -> object:
        """A rate-limited "still running" note, called once per sample, with the trainer's rate and
        estimated finish when its progress records give them."""
        ...

    def evidence(self, uri: str, at_unix: float) -> object:
        """Where the attempt's evidence is, and when it last reached the store (advisory)."""
        ...


class IdentityFiles(Protocol):
    """The files a run identity hashes, and the approval and checkpoint it may name."""

    def identity(
        self,
        deadline: DeadlineSettings,
        *,
        run_id: str,
        command: Sequence[str],
        deadline_store: str,
        image_digest: str | None,
        redaction: RedactionRules,
    ) -> RunIdentity: ...
    def canonical_path(self, path: Path) -> str: ...
    def is_file(self, path: str) -> bool: ...
    def read_approval(self, path: Path) -> bytes: ...


class WorkDirs(Protocol):
    def require(self, *, writable: Sequence[Path], readable: Sequence[Path]) -> None:
        """ConfigError unless ``writable`` can be created and written and ``readable`` listed."""
        ...


class PodStatus(Protocol):
    """The sidecar's own pod and its Job, read when the soak is stopped or the launcher is gone."""

    # How long the cause of a stop may take to show in the API (the Job controller's status).
    cause_wait_s: float

    def stop_evidence(self, signal: str | None) -> StopEvidence:
        """What the pod and the Job say now; what cannot be read is left unknown (never raises)."""
        ...

    def trainer_ended(self) -> ContainerState | None:
        """The trainer container's terminated state as the kubelet reports it, None while it
        reports none (or the pod cannot be read; never raises)."""
        ...

    def moments(self) -> PodMoments | None:
        """When the pod was created, scheduled and started its containers; None when the pod
        cannot be read (never raises)."""
        ...


class Strays(Protocol):
    """Processes that left the launcher's tree and became the sidecar's children (local mode: the
    sidecar is a child subreaper, so an orphan whose launcher was killed, or a process a tracer made
    the launcher clone beside itself, is reparented to it rather than to init)."""

    def find(self, launcher_pid: int) -> list[ProcessInfo]:
        """The sidecar's descendants but the launcher and its tree; never raises."""
        ...

    def reap(self, processes: Sequence[ProcessInfo]) -> None:
        """Collect those of ``processes`` that are the sidecar's children and have died."""
        ...


class StoreCheck(Protocol):
    def check(self, slot: str) -> StoreFeatures:
        """What the store honours (sidecar.core.store_features); raises ConfigError for a store the
        run cannot rely on, TransientError when it cannot be asked."""
        ...


class LockLoss:
    """Set by a deadline store whose lock (an S3 lease) was lost while the run was going."""

    def __init__(self) -> None:
        self.reason: str | None = None

    def __call__(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason


def _no_image_digest() -> str | None:
    return None


@dataclass(frozen=True)
class Ports:
    """Everything with side effects a run uses, injected by the CLI (or a test)."""

    channel: LauncherChannel
    spawner: LauncherSpawner
    processes: ProcessTable
    progress: ProgressProbe
    open_gpu: Callable[[Mapping[str, str] | None], GpuBackend]
    store: DeadlineStore
    artifact_files: Callable[[Path], ArtifactFiles]
    provenance: Provenance
    clock: NodeClock
    identity_files: IdentityFiles
    workdirs: WorkDirs
    sink: ArtifactSink | None = None
    publisher: Publisher | None = None
    metrics: MetricsSink | None = None
    # Resolved when the ports are built: a bad validator setting fails before the trainer runs.
    manifest_validator: ManifestValidator | ValidatorUnavailable | None = None
    # The trainer image's digest, part of the run identity in a pod.
    image_digest: Callable[[], str | None] = _no_image_digest
    lock_loss: LockLoss = field(default_factory=LockLoss)
    # The S3 store's features, checked before the first lock or claim (None: no S3 store).
    store_check: StoreCheck | None = None
    # A clock outside the node (the apiserver's, in a pod) that bounds the deadline too.
    reference_clock: ReferenceClock | None = None
    # The sidecar's pod and Job as the API says (pod mode): why a stop came, how the trainer's
    # container ended. None outside Kubernetes.
    pod_status: PodStatus | None = None
    # Where to look for earlier attempts that ended without a verdict.
    histories: tuple[AttemptHistory, ...] = ()
    # Where the run's ledger is kept (the bucket's first).
    ledgers: tuple[LedgerStore, ...] = ()
    # Memory beyond RSS (the launcher's memory cgroup, /dev/shm), opened for a launcher pid.
    trainer_memory: Callable[[int], TrainerMemory] | None = None
    # Local mode: processes that left the launcher's tree for the sidecar's (it is a subreaper).
    strays: Strays | None = None
    sleep: Callable[[float], None] = time.sleep
    status_stream: IO[str] | None = None
