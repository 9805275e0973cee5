"""In-memory fakes of every port a run uses, driven by one simulated clock.

``World`` holds the simulated time and a scripted launcher: the supervisor's sleeps advance the
clock, and the launcher reacts to the go-ahead and to stop requests the way the real one does
(docs/run-dir-protocol.md). No process, thread or socket is involved.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, Any

from sidecar.adapters.identity_files import IdentityFileReader
from sidecar.adapters.workdirs import LocalWorkDirs
from sidecar.app.ports import LockLoss, Ports, StopRequest
from sidecar.core.boot import BootClock, ReferenceTime, StoreClock
from sidecar.core.disruption import StopEvidence
from sidecar.core.errors import LauncherError, RecordExistsError, UploadError
from sidecar.core.pod_facts import ContainerState, PodMoments
from sidecar.core.ports import UploadedObject
from sidecar.core.publication import Publication
from sidecar.core.running_annotations import ProgressFigures
from sidecar.core.samples import GpuDevice, GpuSample, ProcessInfo, ProcessTreeSample, ProgressSample
from sidecar.launcher.protocol.exit import ExitRecord, MemoryReport, OomKill
from sidecar.launcher.protocol.go import GoRequest
from sidecar.launcher.protocol.records import LauncherInfo, TrainerInfo
from sidecar.launcher.protocol.stacks import ProcessStack, StacksRecord

LAUNCH_ID = "0123456789abcdef0123456789abcdef"
LAUNCHER_PID, TRAINER_PID = 100, 101
EPOCH = 1_700_000_000.0
# What py-spy shows of a trainer stuck in a collective.
STALLED_STACK = 'Thread 101 (idle): "MainThread"\n    all_reduce (torch/distributed/c10d.py:2050)\n'


def process(pid: int, command: str, ppid: int) -> ProcessInfo:
    return ProcessInfo(
        pid=pid,
        ppid=ppid,
        start_time=EPOCH,
        start_ticks=pid,
        rss_kib=1024,
        fd_count=4,
        fd_classes={},
        threads=1,
        state="sleeping",
        command=command,
    )


@dataclass
class Script:
    """How the simulated trainer behaves once it has its go-ahead."""

    runs_s: float = 3.0  # then exits 0 with a run_summary
    returncode: int = 0
    progresses: bool = True
    writes_summary: bool = True
    obeys_stop: bool = True  # the launcher acts on terminate/kill requests
    subreaper: bool = True
    appears: bool = True
    command_problem: str | None = None  # what the launcher found wrong with the command
    leaves_orphan: bool = False  # a worker that outlives the trainer
    gpu_fault_at_s: float | None = None
    interrupt_at_s: float | None = None  # a Ctrl-C reaches the sidecar
    # What a hostile trainer writes into trainer.json instead of itself: (pid, pgid).
    forged_trainer: tuple[int, int] | None = None
    forges_at_s: float = 0.0  # when the trainer rewrites trainer.json (the launcher's until then)
    # The kernel's OOM killer kills the trainer after runs_s (the launcher's cgroup counter rose).
    oom_killed: bool = False
    # The trainer writes checkpoint.json ({"step": 7}) this long after its go-ahead.
    checkpoint_at_s: float | None = None


class World:
    """Simulated time plus the launcher's side of the run dir."""

    def __init__(self, script: Script, summary: bytes) -> None:
        self.script = script
        self.summary = summary
        self.now = 0.0
        self.go: GoRequest | None = None
        self.go_at: float | None = None
        self.exit_record: ExitRecord | None = None
        self.requests: list[tuple[StopRequest, str]] = []
        self.stacks_timeouts: list[float] = []
        self.stacks: StacksRecord | None = None
        self.request_times: list[float] = []
        self.aborted: tuple[str, int] | None = None
        self.alive: dict[int, ProcessInfo] = {}
        self.killed: list[int] = []
        self.interrupted = False
        self.boot_id = "boot"

    # -- the clock

    def wall(self) -> float:
        return EPOCH + self.now

    def monotonic(self) -> float:
        return self.now

    def boot(self) -> BootClock | None:
        return BootClock(self.boot_id, 1000.0 + self.now)

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.tick()

    # -- the launcher

    def tick(self) -> None:
        if self.go_at is None or self.exit_record is not None:
            return
        ran = self.now - self.go_at
        interrupt_at = self.script.interrupt_at_s
        if interrupt_at is not None and ran >= interrupt_at and not self.interrupted:
            self.interrupted = True
            raise KeyboardInterrupt
        if ran >= self.script.runs_s and self.script.oom_killed:
            self.trainer_exits("exited", returncode=None, signal=9, memory=OOM_KILLED)
        elif ran >= self.script.runs_s:
            self.trainer_exits("exited", returncode=self.script.returncode)

    def started(self, go: GoRequest) -> None:
        self.go, self.go_at = go, self.now
        self.alive[TRAINER_PID] = process(TRAINER_PID, "python3 train.py", ppid=LAUNCHER_PID)
        if self.script.leaves_orphan:
            self.alive[TRAINER_PID + 1] = process(TRAINER_PID + 1, "python3 worker.py", ppid=TRAINER_PID)

    def stop(self, action: StopRequest, reason: str, stacks_timeout_s: float = 0.0) -> None:
        self.requests.append((action, reason))
        self.request_times.append(self.now)
        self.stacks_timeouts.append(stacks_timeout_s)
        if not (self.script.obeys_stop and self.exit_record is None and self.go_at is not None):
            return
        if stacks_timeout_s > 0:  # as the launcher does before the TERM
            self.stacks = StacksRecord(
                launch_id=LAUNCH_ID,
                tool="py-spy",
                requested_unix=EPOCH + self.now,
                started_unix=EPOCH + self.now,
                captured_unix=EPOCH + self.now,
                timeout_s=stacks_timeout_s,
                processes=(ProcessStack(TRAINER_PID, ("python3", "train.py"), STALLED_STACK),),
            )
        if action == "soft_stop":  # the trainer checkpoints and exits 0, as the example trainer does
            self.trainer_exits("exited", returncode=0, soft_stop_reason=f"control: {reason}")
        else:
            self.trainer_exits("control", returncode=None, signal=15 if action == "terminate" else 9)

    def trainer_exits(
        self,
        reason: str,
        *,
        returncode: int | None,
        signal: int | None = None,
        soft_stop_reason: str | None = None,
        memory: MemoryReport | None = None,
    ) -> None:
        self.alive.pop(TRAINER_PID, None)
        self.exit_record = ExitRecord(
            launch_id=LAUNCH_ID,
            exit_code=returncode if returncode is not None else 128 + (signal or 0),
            reason=reason,
            returncode=returncode,
            signal=signal,
            trainer_pid=TRAINER_PID,
            soft_stop_sent=soft_stop_reason is not None,
            soft_stop_reason=soft_stop_reason,
            memory=memory,
            ended_unix=self.wall(),
        )


OOM_KILLED = MemoryReport(
    cgroup="v2",
    limit_bytes=192 * 2**20,
    oom_kills_at_start=0,
    oom_kills_at_end=1,
    oom_killed=(OomKill(pid=TRAINER_PID, command=("python3", "train.py")),),
)


class FakePodStatus:
    """The PodStatus port: the pod's and the Job's status as scripted, one answer per read (the
    last one repeats)."""

    cause_wait_s = 3.0

    def __init__(
        self, *answers: StopEvidence, ended: ContainerState | None = None, moments: PodMoments | None = None
    ) -> None:
        self.answers = list(answers)
        self.ended = ended
        self.pod_moments = moments
        self.reads = 0

    def stop_evidence(self, signal: str | None) -> StopEvidence:
        self.reads += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return replace(answer, signal=signal)

    def trainer_ended(self) -> ContainerState | None:
        return self.ended

    def moments(self) -> PodMoments | None:
        return self.pod_moments


class FakeChannel:
    def __init__(self, world: World, *, go_given: bool = False) -> None:
        self.world = world
        self._go_given = go_given
        self.launch_id: str | None = None
        self.heartbeats = 0
        self.resets = 0
        self.unwritten: list[str] = []  # no simulated heartbeat fails
        self.longest_gap_s = 0.0

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[None]:
        yield

    def reset(self) -> None:
        self.resets += 1

    def wait_for_launcher(self, timeout_s: float, *, alive: Callable[[], bool] | None = None) -> LauncherInfo:
        if not self.world.script.appears:
            raise LauncherError(f"no launcher.json after {timeout_s:g}s")
        self.launch_id = LAUNCH_ID
        return LauncherInfo(
            launch_id=LAUNCH_ID,
            pid=LAUNCHER_PID,
            start_ticks=LAUNCHER_PID,
            boot_id="boot",
            hostname="node-1",
            command=("python3", "train.py"),
            command_problem=self.world.script.command_problem,
            python="python3",
            python_version="3.11.7",
            subreaper=self.world.script.subreaper,
            owner_pid=None,
            go_timeout_s=300.0,
            started_unix=EPOCH,
        )

    def go_given(self) -> bool:
        return self._go_given or self.world.go is not None

    def give_go(self, go: GoRequest, record: Mapping[str, Any] | None = None) -> None:
        assert go.launch_id == self.launch_id and record is not None
        self.world.started(go)

    def abort(self, reason: str, exit_code: int) -> None:
        self.world.aborted = (reason, exit_code)

    def request(self, action: StopRequest, reason: str, *, stacks_timeout_s: float = 0.0) -> int:
        self.world.stop(action, reason, stacks_timeout_s)
        return len(self.world.requests)

    def stacks(self) -> StacksRecord | None:
        return self.world.stacks

    @contextlib.contextmanager
    def heartbeat(self, interval_s: float) -> Iterator[FakeChannel]:
        self.heartbeats += 1
        yield self

    def trainer(self) -> TrainerInfo | None:
        if self.world.go_at is None:
            return None
        script = self.world.script
        forged = script.forged_trainer if self.world.now >= script.forges_at_s else None
        pid, pgid = forged or (TRAINER_PID, TRAINER_PID)
        return TrainerInfo(
            launch_id=LAUNCH_ID,
            pid=pid,
            pgid=pgid,
            start_ticks=None if forged else TRAINER_PID,
            started_unix=EPOCH,
        )

    def read_exit(self) -> ExitRecord | None:
        return self.world.exit_record

    def wait_exit(self, timeout_s: float) -> ExitRecord | None:
        return self.world.exit_record

    def console_logs(self) -> list[Path]:
        return []

    def redact_commands(self) -> None:
        """The simulated run dir holds no command lines."""


class FakeLocalLauncher:
    def __init__(self, world: World) -> None:
        self.world = world
        self.pid = LAUNCHER_PID
        self.stdout: IO[bytes] | None = None
        self.killed = False

    def poll(self) -> int | None:
        """The launcher exits with its record's code, or dies of the SIGKILL it was sent."""
        record = self.world.exit_record
        if record is not None:
            return record.exit_code
        return -9 if self.killed else None

    def wait(self, timeout: float | None = None) -> int:
        return self.poll() or 0

    def kill(self) -> None:
        self.killed = True


class FakeSpawner:
    def __init__(self, world: World) -> None:
        self.world = world
        self.spawned: list[tuple[str, ...]] = []
        self.pass_fds: Sequence[int] = ()

    def spawn(
        self, command: Sequence[str], *, go_timeout_s: float, pass_fds: Sequence[int], capture_output: bool
    ) -> FakeLocalLauncher:
        self.spawned.append(tuple(command))
        self.pass_fds = pass_fds
        return FakeLocalLauncher(self.world)


class FakeProcesses:
    def __init__(self, world: World) -> None:
        self.world = world
        self.groups_killed: list[tuple[int, float]] = []

    def sample(self, root_pid: int) -> ProcessTreeSample:
        processes = [process(LAUNCHER_PID, "launcher", ppid=1), *self.world.alive.values()]
        return ProcessTreeSample(process_count=len(processes), processes=processes)

    def still_alive(self, known: Sequence[ProcessInfo]) -> list[ProcessInfo]:
        return [p for p in known if p.pid in self.world.alive]

    def kill(self, processes: Sequence[ProcessInfo]) -> None:
        for info in processes:
            if self.world.alive.pop(info.pid, None) is not None:
                self.world.killed.append(info.pid)

    def kill_group(self, leader_pid: int, leader_ticks: int) -> None:
        if leader_pid in self.world.alive:
            self.groups_killed.append((leader_pid, self.world.now))
            self.world.alive.pop(leader_pid)

    def is_alive(self, pid: int, start_ticks: int | None) -> bool:
        return pid == LAUNCHER_PID and self.world.exit_record is None

    def is_exiting(self, pid: int, start_ticks: int | None) -> bool:
        return False

    def tracer(self, pid: int) -> int | None:
        return None

    def fd_tables_readable(self, pid: int) -> bool:
        return True

    def environ(self, pid: int) -> Mapping[str, str] | None:
        return {"NVIDIA_VISIBLE_DEVICES": "0"}


class FakeProgress:
    def __init__(self, world: World) -> None:
        self.world = world

    def sample(self) -> ProgressSample:
        go_at = self.world.go_at
        if go_at is None:
            return ProgressSample()
        if not self.world.script.progresses:  # one write at the start, then nothing changes
            return ProgressSample(
                file_count=1, bytes_total=101, max_mtime=self.world.wall() - (self.world.now - go_at)
            )
        grown = int((self.world.now - go_at) * 10)
        return ProgressSample(file_count=1, bytes_total=100 + grown, max_mtime=self.world.wall())

    def read_file(self, name: str, max_bytes: int) -> tuple[bytes, float] | None:
        if name == "checkpoint.json":
            at, go_at = self.world.script.checkpoint_at_s, self.world.go_at
            if at is None or go_at is None or self.world.now < go_at + at:
                return None
            return b'{"step": 7, "path": "ckpt/7"}', self.world.wall()
        if not self.world.script.writes_summary or self.world.exit_record is None:
            return None
        return self.world.summary[: max_bytes + 1], self.world.wall()


class FakeGpu:
    def __init__(self, world: World) -> None:
        self.world = world
        self.closed = False
        self.env: Mapping[str, str] | None = None

    def devices(self) -> list[GpuDevice]:
        return []

    def sample(self, tree_pids: set[int], now_monotonic: float) -> GpuSample:
        at = self.world.script.gpu_fault_at_s
        go_at = self.world.go_at
        if at is not None and go_at is not None and self.world.now - go_at >= at:
            return GpuSample(fault="GPU 0 fell off the bus")
        return GpuSample()

    def look(self, tree_pids: set[int]) -> GpuSample:
        return GpuSample()

    def close(self) -> None:
        self.closed = True


@dataclass
class FakeReferenceClock:
    """A clock outside the node (the apiserver's) that runs ``offset_s`` ahead of the world's wall clock."""

    world: World
    offset_s: float = 0.0
    source: str = "the Kubernetes apiserver's clock (Date)"

    def now(self) -> ReferenceTime:
        return ReferenceTime(self.source, self.world.wall() + self.offset_s)


class MemoryStore:
    location = "memory://deadlines"

    def __init__(self) -> None:
        self.records: dict[str, bytes] = {}
        self.attempts: dict[str, int] = {}
        self.locked: list[str] = []

    @contextlib.contextmanager
    def lock(self, slot: str) -> Iterator[None]:
        self.locked.append(slot)
        yield

    def load(self, run_id: str) -> bytes | None:
        return self.records.get(run_id)

    def create(self, run_id: str, payload: bytes) -> None:
        if run_id in self.records:
            raise RecordExistsError(run_id)
        self.records[run_id] = payload

    def store_clock(self, run_id: str) -> StoreClock | None:
        return None  # an in-memory store has no clock of its own

    def attempt_claims(self, run_id: str) -> list[float | None]:
        return [EPOCH] * sum(n for slot, n in self.attempts.items() if slot.split(".")[0] == run_id)

    def claim_attempt(self, slot: str) -> int:
        self.attempts[slot] = self.attempts.get(slot, 0) + 1
        return self.attempts[slot]

    def inheritable_lock_fd(self, slot: str) -> int | None:
        return None


class MemorySampleLog:
    def __init__(self) -> None:
        self.error: str | None = None
        self.lines: list[str] = []
        self.flushed_bytes = 0

    def write_line(self, line: str) -> None:
        self.lines.append(line)
        self.flushed_bytes += len(line) + 1

    def close(self) -> None:
        pass


class MemoryArtifactFiles:
    """All attempts' files, keyed by directory then name."""

    def __init__(self) -> None:
        self.dirs: dict[Path, dict[str, bytes]] = {}
        self.samples: dict[Path, MemorySampleLog] = {}

    def __call__(self, path: Path) -> MemoryArtifactDir:
        return MemoryArtifactDir(self, path)

    def artifact(self) -> dict[str, Any]:
        (written,) = [files["artifact.json"] for files in self.dirs.values() if "artifact.json" in files]
        document: dict[str, Any] = json.loads(written)
        return document


class MemoryArtifactDir:
    def __init__(self, owner: MemoryArtifactFiles, path: Path) -> None:
        self._owner = owner
        self.path = path

    def create(self) -> None:
        self._owner.dirs.setdefault(self.path, {})

    def open_samples(self, name: str) -> MemorySampleLog:
        log = self._owner.samples.setdefault(self.path, MemorySampleLog())
        self._owner.dirs.setdefault(self.path, {})[name] = b""
        return log

    def write(self, name: str, data: bytes) -> Path:
        self._owner.dirs.setdefault(self.path, {})[name] = data
        return self.path / name

    def keep_copies(self, files: Sequence[Path]) -> list[Path]:
        return []

    def existing(self, names: Sequence[str]) -> list[Path]:
        files = self._owner.dirs.get(self.path, {})
        return [self.path / name for name in names if name in files]

    def sha256(self, name: str) -> str | None:
        data = self._owner.dirs.get(self.path, {}).get(name)
        return None if data is None else hashlib.sha256(data).hexdigest()

    def read_span(
        self, source: Path, offset_for: Callable[[int, bytes], int], limit: int
    ) -> tuple[int, bytes, int, bytes]:
        log = self._owner.samples.get(source.parent)
        data = "".join(line + "\n" for line in log.lines).encode() if log is not None else b""
        offset = offset_for(1, data[:256])
        return 1, data[:256], offset, data[offset : offset + limit]


class FakeProvenance:
    def describe(self) -> dict[str, Any]:
        return {"source": {}, "software": {"python": "3"}, "hostname": "test", "boot_id": "boot"}


@dataclass
class FakePublisher:
    published: list[Publication] = field(default_factory=list)
    notes: int = 0
    evidence_notes: list[str] = field(default_factory=list)
    figures: list[ProgressFigures | None] = field(default_factory=list)

    def publish(self, publication: Publication) -> list[str]:
        self.published.append(publication)
        return []

    def progress(
        self, state: str, now_wall: float, now_monotonic: float, figures: ProgressFigures | None = None
    ) -> object:
        self.notes += 1
        self.figures.append(figures)
        return True

    def evidence(self, uri: str, at_unix: float) -> object:
        self.evidence_notes.append(uri)
        return True


@dataclass
class FakeSink:
    fails: bool = False
    uploaded: list[tuple[str, str]] = field(default_factory=list)
    objects: dict[str, bytes] = field(default_factory=dict)
    location: str = "s3://soaks"

    def upload(self, files: Sequence[Path], key_prefix: str) -> list[UploadedObject]:
        if self.fails:
            raise UploadError("the bucket refused the upload")
        self.uploaded.extend((key_prefix, path.name) for path in files)
        return [
            UploadedObject(
                path=path,
                uri=f"s3://soaks/{key_prefix}/{path.name}",
                sha256="0" * 64,
                size=1,
                parts=1,
                already_present=False,
            )
            for path in files
        ]

    def upload_bytes(self, name: str, data: bytes, key_prefix: str) -> UploadedObject:
        if self.fails:
            raise UploadError("the bucket refused the upload")
        self.uploaded.append((key_prefix, name))
        self.objects[f"{key_prefix}{name}"] = data
        return UploadedObject(
            path=Path(name),
            uri=f"s3://soaks/{key_prefix}{name}",
            sha256=hashlib.sha256(data).hexdigest(),
            size=len(data),
            parts=1,
            already_present=False,
        )


@dataclass
class Fakes:
    world: World
    channel: FakeChannel
    spawner: FakeSpawner
    processes: FakeProcesses
    gpu: FakeGpu
    store: MemoryStore
    files: MemoryArtifactFiles
    publisher: FakePublisher
    sink: FakeSink
    lock_loss: LockLoss

    def ports(self) -> Ports:
        def open_gpu(env: Mapping[str, str] | None) -> FakeGpu:
            self.gpu.env = env
            return self.gpu

        return Ports(
            channel=self.channel,
            spawner=self.spawner,
            processes=self.processes,
            progress=FakeProgress(self.world),
            open_gpu=open_gpu,
            store=self.store,
            artifact_files=self.files,
            provenance=FakeProvenance(),
            # The real file adapters: the run's files are real files under the test's tmp_path.
            identity_files=IdentityFileReader(),
            workdirs=LocalWorkDirs(),
            sink=self.sink,
            publisher=self.publisher,
            lock_loss=self.lock_loss,
            clock=self.world,
            sleep=self.world.sleep,
        )


def fakes(script: Script, summary: bytes, *, go_given: bool = False, upload_fails: bool = False) -> Fakes:
    world = World(script, summary)
    return Fakes(
        world=world,
        channel=FakeChannel(world, go_given=go_given),
        spawner=FakeSpawner(world),
        processes=FakeProcesses(world),
        gpu=FakeGpu(world),
        store=MemoryStore(),
        files=MemoryArtifactFiles(),
        publisher=FakePublisher(),
        sink=FakeSink(fails=upload_fails),
        lock_loss=LockLoss(),
    )
