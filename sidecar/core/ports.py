"""Small Protocols the core and the orchestrator depend on; adapters implement them."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sidecar.core.boot import BootClock, ReferenceTime, StoreClock
from sidecar.core.ledger.record import Ledger
from sidecar.core.samples import (
    CgroupMemorySample,
    GpuDevice,
    GpuSample,
    MemoryCgroupInfo,
    ProcessInfo,
    ProcessTreeSample,
    ProgressSample,
    Sample,
    ShmLeftovers,
)


class Clock(Protocol):
    def wall(self) -> float: ...
    def monotonic(self) -> float: ...


class NodeClock(Clock, Protocol):
    """The node's clocks, CLOCK_BOOTTIME included: what the deadline is judged by."""

    def boot(self) -> BootClock | None:
        """CLOCK_BOOTTIME and the boot it counts from; None where the kernel tells neither."""
        ...


class ReferenceClock(Protocol):
    """A clock outside the node (the apiserver's): read when a record is made and at each attempt,
    so that an attempt on a node with a wrong clock cannot gain time."""

    def now(self) -> ReferenceTime:
        """The reference clock now; TransientError when it cannot be read."""
        ...


class ProcessTable(Protocol):
    """The processes of the pod (or host): sampled, checked and, as a last resort, killed."""

    def sample(self, root_pid: int) -> ProcessTreeSample:
        """The root and all its descendants now; vanished processes are skipped."""
        ...

    def still_alive(self, known: Sequence[ProcessInfo]) -> list[ProcessInfo]:
        """Those of ``known`` still running as the same process (PID reuse rejected)."""
        ...

    def kill(self, processes: Sequence[ProcessInfo]) -> None:
        """SIGKILL those of ``processes`` still running as the same process."""
        ...

    def kill_group(self, leader_pid: int, leader_ticks: int) -> None:
        """SIGKILL the process group ``leader_pid`` leads, while it still runs as itself and leads
        it; never pid 1, the sidecar itself or the sidecar's own group."""
        ...

    def is_alive(self, pid: int, start_ticks: int | None) -> bool: ...

    def is_exiting(self, pid: int, start_ticks: int | None) -> bool:
        """Exiting, a zombie, gone, or another process."""
        ...

    def environ(self, pid: int) -> Mapping[str, str] | None: ...

    def fd_tables_readable(self, pid: int) -> bool:
        """Whether ``pid``'s fd table can be read here (same UID or CAP_SYS_PTRACE)."""
        ...

    def tracer(self, pid: int) -> int | None:
        """The pid tracing ``pid`` (its TracerPid), None when none does or it cannot be read."""
        ...


class TrainerMemory(Protocol):
    """Memory of the trainer's tree beyond RSS: the launcher's memory cgroup (resolved once, before
    the go-ahead) and what the trainer's UID left in /dev/shm. Never raises: what cannot be read is
    reported as such."""

    @property
    def cgroup(self) -> MemoryCgroupInfo: ...

    def sample(self) -> CgroupMemorySample | None:
        """The cgroup now; None when it is unavailable (``cgroup`` says why)."""
        ...

    def shm_leftovers(self, since_unix: float) -> ShmLeftovers: ...


class ProgressProbe(Protocol):
    def sample(self) -> ProgressSample: ...

    def read_file(self, name: str, max_bytes: int) -> tuple[bytes, float] | None:
        """Up to ``max_bytes + 1`` bytes of a trainer-written file and its mtime; None when absent,
        OSError when unreadable."""
        ...


class GpuBackend(Protocol):
    def devices(self) -> list[GpuDevice]: ...
    def sample(self, tree_pids: set[int], now_monotonic: float) -> GpuSample: ...
    def look(self, tree_pids: set[int]) -> GpuSample:
        """Everything now (the process lists too), outside the sampling cadence and keeping the
        events for the next sample: before the trainer starts and once its tree is gone."""
        ...

    def close(self) -> None: ...


class MetricsSink(Protocol):
    """Live metrics of the run (Prometheus), fed once per sample and told the verdict."""

    def observe(
        self,
        sample: Sample,
        *,
        budget_left_s: float | None,
        progress_age_s: float | None,
        duration_s: float,
        eta_s: float | None = None,
    ) -> None: ...
    def run_budget(self, goodput: float, used_s: Mapping[str, float]) -> None:
        """The run's goodput and the seconds spent by cause ("productive" among them), all attempts."""
        ...

    def verdict(self, status: str, classification: str | None, exit_code: int) -> None: ...
    def close(self) -> None: ...


class DeadlineStore(Protocol):
    """Durable storage of deadline records, one per run id.

    Locks and attempt numbers are per slot (``sidecar.core.identity.run_slot``): the run id, or one
    index of a multi-pod soak. Every slot of a run shares its one record."""

    @property
    def location(self) -> str:
        """Human-readable location of the store (for messages and the trainer's env)."""
        ...

    def lock(self, slot: str) -> AbstractContextManager[None]:
        """Held for the supervisor's lifetime; raises AlreadySupervisedError if held elsewhere."""
        ...

    def load(self, run_id: str) -> bytes | None:
        """The stored record, or None when there is none."""
        ...

    def create(self, run_id: str, payload: bytes) -> None:
        """Exclusive, durable create; raises RecordExistsError when a record already exists."""
        ...

    def store_clock(self, run_id: str) -> StoreClock | None:
        """The store's own time: when it wrote the run's record, and now (a write made to read
        it). None when the store cannot tell (no record yet)."""
        ...

    def attempt_claims(self, run_id: str) -> list[float | None]:
        """When each attempt claimed so far, in every slot of the run, was claimed (the claimer's
        ``claimed_unix``, or the store's own time of the claim; None when a claim cannot be read):
        the ledger the record is checked against."""
        ...

    def claim_attempt(self, slot: str) -> int:
        """Number this attempt durably: 1 + the slot's attempts claimed before (exclusive creates)."""
        ...

    def inheritable_lock_fd(self, slot: str) -> int | None:
        """The descriptor that holds the run's lock, for a local launcher to inherit (so the run stays
        locked while the launcher may still kill the trainer after the sidecar died); None where the
        lock is not a descriptor (an S3 lease)."""
        ...


@dataclass(frozen=True)
class UploadedObject:
    """One file as stored: its URI and the sha256 the store verified against the local bytes."""

    path: Path
    uri: str
    sha256: str
    size: int
    parts: int
    # True when the key already held exactly these bytes (an earlier attempt's upload).
    already_present: bool


class LedgerStore(Protocol):
    """Where a run's ledger lives (the bucket beside its attempts, or the run's local directory)."""

    def location(self, run_id: str, runs_prefix: str) -> str: ...
    def read(self, run_id: str, runs_prefix: str) -> Ledger | None:
        """The ledger, None when there is none; ConfigError when it cannot be parsed, UploadError
        when it cannot be read."""
        ...

    def update(self, run_id: str, runs_prefix: str, change: Callable[[Ledger | None], Ledger]) -> Ledger:
        """``change`` applied to the ledger as it is now, never losing another writer's entries; the
        ledger as this writer saw it, its entries in. ``change`` must only add entries: a store may
        apply it to no ledger and merge the result (the bucket's, whose writers each land their own
        piece first). UploadError or ConfigError (an unreadable ledger, left as it is) on failure."""
        ...


class ArtifactSink(Protocol):
    @property
    def location(self) -> str:
        """Where uploads go (for messages), e.g. ``s3://bucket``."""
        ...

    def upload(self, files: Sequence[Path], key_prefix: str) -> list[UploadedObject]:
        """Upload files under key_prefix (their bare names appended), never overwriting.

        Stops at the first failure with UploadError; files uploaded before it stay uploaded.
        """
        ...

    def upload_bytes(self, name: str, data: bytes, key_prefix: str) -> UploadedObject:
        """One object ``<key_prefix><name>`` from memory, never overwriting; UploadError on failure."""
        ...
