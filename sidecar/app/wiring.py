"""The adapters of a run, chosen by the settings: the one place that builds ports."""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from sidecar.adapters.artifact_dir import ArtifactDir
from sidecar.adapters.filestore import FileDeadlineStore, file_store_location
from sidecar.adapters.identity_files import IdentityFileReader
from sidecar.adapters.nvml import MockNvml, open_gpu_backend
from sidecar.adapters.procfs import ProcfsProcessTable, ProcfsTrainerMemory
from sidecar.adapters.progress import DirectoryProgressProbe
from sidecar.adapters.provenance import HostClock, HostProvenance
from sidecar.adapters.rundir.channel import RunDir
from sidecar.adapters.rundir.local import LocalLauncherSpawner
from sidecar.adapters.validators import resolve_manifest_validator
from sidecar.adapters.workdirs import LocalWorkDirs
from sidecar.app.ports import AttemptHistory, LockLoss, Ports, StoreCheck, Strays
from sidecar.core.disruption import StopEvidence
from sidecar.core.errors import (
    ConfigError,
    ForbiddenError,
    NotFoundError,
    RefusedError,
    SoakError,
    TransientError,
)
from sidecar.core.pod_facts import ContainerState, PodFacts, PodMoments, pod_moments
from sidecar.core.ports import ArtifactSink, Clock, DeadlineStore, GpuBackend, LedgerStore, MetricsSink
from sidecar.core.publication import Publication
from sidecar.core.running_annotations import ProgressFigures
from sidecar.launcher.protocol.names import CONSOLE_LOG, CONSOLE_LOG_ROTATED
from sidecar.nvml_mock.build import mock_library
from sidecar.nvml_mock.bundled import BUNDLED
from sidecar.nvml_mock.scenario import compile_scenario, load_scenario
from sidecar.settings import GpuSettings, Settings

if TYPE_CHECKING:
    from sidecar.adapters.kube.client import KubeClient
    from sidecar.adapters.kube.publisher import PodPublisher

# How long the cause of a stop may take to show in the pod's and the Job's status.
CAUSE_WAIT_S = 3.0
JOB_STATUS_WAIT_S = 10.0


@dataclass(frozen=True)
class Wiring:
    ports: Ports
    # What the pod says about the run (job, node, image), recorded in the artifact.
    context: Mapping[str, Any] = field(default_factory=dict)
    attempt_label: str | None = None


def build_ports(settings: Settings, *, pod: bool, status_stream: IO[str] | None = sys.stderr) -> Wiring:
    check_mock_scenario(settings.gpu)
    run_dir = settings.launcher.run_dir
    lock_loss = LockLoss()
    channel = RunDir(run_dir, settings.redaction.rules())
    clock = HostClock()
    ports = Ports(
        channel=channel,
        spawner=LocalLauncherSpawner(run_dir, keep_env=settings.launcher.keep_env),
        processes=ProcfsProcessTable(redaction=settings.redaction.rules(), fd_reports=channel.fd_report),
        progress=DirectoryProgressProbe(
            settings.monitor.progress_dir,
            exclude=[
                run_dir / CONSOLE_LOG,
                run_dir / CONSOLE_LOG_ROTATED,
                settings.monitor.progress_dir / "soak-console.log",
            ],
        ),
        open_gpu=_gpu_opener(settings),
        store=_deadline_store(settings, lock_loss),
        artifact_files=ArtifactDir,
        provenance=HostProvenance(Path.cwd()),
        clock=clock,
        identity_files=IdentityFileReader(),
        workdirs=LocalWorkDirs(),
        sink=_artifact_sink(settings),
        manifest_validator=resolve_manifest_validator(settings.summary.manifest_validator),
        lock_loss=lock_loss,
        store_check=_store_check(settings),
        status_stream=status_stream,
        metrics=_metrics(settings, pod=pod),
        histories=_histories(settings),
        ledgers=_ledgers(settings, clock),
        trainer_memory=ProcfsTrainerMemory,
    )
    if not pod:
        return Wiring(ports)
    return _pod_wiring(settings, ports)


def local_strays(settings: Settings) -> Strays:
    """The CLI's local runs: the sidecar becomes a subreaper, and what escapes the launcher's tree
    to it is found at the end (adapters.procfs.strays)."""
    from sidecar.adapters.procfs.strays import SubreaperStrays

    return SubreaperStrays(settings.redaction.rules())


def _metrics(settings: Settings, *, pod: bool) -> MetricsSink | None:
    """The Prometheus endpoint, serving from now on (ConfigError when the port is taken)."""
    mset = settings.metrics
    if not mset.port:
        return None
    from sidecar.adapters.metrics import PrometheusMetrics

    kube = settings.kube
    labels = (
        {"namespace": kube.namespace or "", "pod": kube.pod_name or "", "container": kube.trainer_container}
        if pod
        else {}
    )
    metrics = PrometheusMetrics(labels)
    metrics.start(mset.address, mset.port)
    return metrics


def _gpu_opener(settings: Settings) -> Callable[[Mapping[str, str] | None], GpuBackend]:
    gpu, index = settings.gpu, settings.kube.completion_index

    def open_for(env: Mapping[str, str] | None) -> GpuBackend:
        return open_gpu(gpu, env, index=index)

    return open_for


def open_gpu(
    settings: GpuSettings, trainer_env: Mapping[str, str] | None, *, index: int | None = None
) -> GpuBackend:
    """The GPU backend the settings ask for; backend mock's library and scenario come from
    sidecar.nvml_mock, prepared only if GPUs are opened at all (the scenario's devices of the pod of
    completion ``index``)."""
    return open_gpu_backend(settings, trainer_env, mock=lambda scratch: _mock_nvml(settings, scratch, index))


def check_mock_scenario(settings: GpuSettings) -> None:
    """A mock scenario that cannot be used is a usage error before anything of the run exists (no
    deadline record, no attempt), naming the bundled scenarios."""
    if settings.backend != "mock" or settings.mock_scenario is None:
        return
    if not settings.mock_scenario.exists():
        names = ", ".join(scenario.name for scenario in BUNDLED)
        raise ConfigError(
            f"NVML mock scenario {settings.mock_scenario}: no such file (bundled scenarios: {names})"
        )
    load_scenario(settings.mock_scenario)


def _mock_nvml(settings: GpuSettings, scratch: Path, index: int | None) -> MockNvml:
    if settings.mock_scenario is None:
        raise ConfigError("gpu.backend=mock needs gpu.mock_scenario")
    library = mock_library(settings.mock_library_dir)
    return MockNvml(library, compile_scenario(settings.mock_scenario, scratch, index=index))


def deadline_store_location(settings: Settings) -> str:
    """The location the deadline store of ``settings`` reports (``DeadlineStore.location``), without
    opening it: what ``approve`` binds, equal to what ``run`` checks from any working directory."""
    if settings.deadline.store == "s3":
        from sidecar.adapters.s3_store.records import s3_store_location

        if not settings.s3.bucket:
            raise ConfigError("the S3 deadline store needs s3.bucket")
        return s3_store_location(settings.s3.bucket, settings.s3.deadline_prefix)
    return file_store_location(settings.deadline.store_dir)


def _deadline_store(settings: Settings, lock_loss: LockLoss) -> DeadlineStore:
    if settings.deadline.store == "s3":
        from sidecar.adapters.s3_store import S3DeadlineStore

        return S3DeadlineStore(settings.s3, on_lock_lost=lock_loss)
    return FileDeadlineStore(settings.deadline.store_dir)


def _store_check(settings: Settings) -> StoreCheck | None:
    if not settings.s3.bucket:
        return None
    from sidecar.adapters.s3_store.probe import S3StoreCheck

    return S3StoreCheck(settings.s3)


def _histories(settings: Settings) -> tuple[AttemptHistory, ...]:
    """Where earlier attempts' evidence is: the bucket (named first: its copy outlives the node),
    and the local output dir (a pod's is new unless its sidecar restarted)."""
    from sidecar.adapters.attempt_history import LocalAttemptHistory, S3AttemptHistory

    local = LocalAttemptHistory(settings.artifact.output_dir / "runs")
    return (S3AttemptHistory(settings.s3), local) if settings.s3.bucket else (local,)


def _ledgers(settings: Settings, clock: Clock) -> tuple[LedgerStore, ...]:
    """The run's ledger in the bucket (named first: it outlives the node) and in the local output dir."""
    from sidecar.adapters.ledger_store import LocalLedgerStore, S3LedgerStore

    local = LocalLedgerStore(settings.artifact.output_dir / "runs", clock)
    return (S3LedgerStore(settings.s3, clock), local) if settings.s3.bucket else (local,)


def _artifact_sink(settings: Settings) -> ArtifactSink | None:
    if not settings.s3.bucket:
        return None
    from sidecar.adapters.s3_sink import S3ArtifactSink

    return S3ArtifactSink(settings.s3)


class _PodPublication:
    """The Publisher port over the pod's own annotations."""

    def __init__(self, publisher: PodPublisher, *, progress_notes: bool) -> None:
        self._publisher = publisher
        self._progress_notes = progress_notes

    def publish(self, publication: Publication) -> list[str]:
        return [str(error) for error in self._publisher.publish(publication).errors]

    def progress(
        self, state: str, now_wall: float, now_monotonic: float, figures: ProgressFigures | None = None
    ) -> object:
        return self._progress_notes and self._publisher.progress(state, now_wall, now_monotonic, figures)

    def evidence(self, uri: str, at_unix: float) -> object:
        return self._publisher.evidence(uri, at_unix)


class _PodStatusReader:
    """The PodStatus port: the sidecar's own pod and Job through the API, errors told, not raised."""

    def __init__(
        self, client: KubeClient, namespace: str, pod: str, job: str | None, *, indexes: int, trainer: str
    ) -> None:
        self._client, self._namespace, self._pod, self._job = client, namespace, pod, job
        self._trainer = trainer
        # A multi-pod Job fails on another index first: its controller's status may lag its stop.
        self.cause_wait_s = JOB_STATUS_WAIT_S if indexes > 1 else CAUSE_WAIT_S

    def stop_evidence(self, signal: str | None) -> StopEvidence:
        from sidecar.adapters.kube.reads import read_job

        pod = self._read_pod()
        job, gone = None, False
        if self._job is not None:
            try:
                job = read_job(self._client, self._namespace, self._job)
            except NotFoundError:
                gone = True
            except SoakError as exc:
                print(f"soak-sidecar: cannot read the Job's status: {exc}", file=sys.stderr)
        return StopEvidence(signal, pod=pod, job=job, job_gone=gone)

    def trainer_ended(self) -> ContainerState | None:
        pod = self._read_pod()
        trainer = None if pod is None else pod.container(self._trainer)
        state = None if trainer is None else trainer.state
        return state if state is not None and state.kind == "terminated" else None

    def moments(self) -> PodMoments | None:
        pod = self._read_pod()
        return None if pod is None else pod_moments(pod)

    def _read_pod(self) -> PodFacts | None:
        from sidecar.adapters.kube.reads import read_pod

        try:
            return read_pod(self._client, self._namespace, self._pod)
        except SoakError as exc:
            print(f"soak-sidecar: cannot read pod {self._namespace}/{self._pod}: {exc}", file=sys.stderr)
            return None


def _pod_wiring(settings: Settings, ports: Ports) -> Wiring:
    from sidecar.adapters.kube.client import KubeClient
    from sidecar.adapters.kube.clock import ApiserverClock
    from sidecar.adapters.kube.publisher import PodPublisher
    from sidecar.adapters.kube.reads import get_pod, wait_for_trainer_digest

    kube = settings.kube
    client = KubeClient.from_settings(kube)
    publisher = PodPublisher.from_settings(client, kube)  # ConfigError without the downward API
    namespace, pod_name, container = kube.namespace or "", kube.pod_name or "", kube.trainer_container
    context: dict[str, Any] = {"namespace": namespace, "pod": pod_name, "pod_uid": kube.pod_uid}
    job_name: str | None = None
    try:
        identity = get_pod(client, namespace, pod_name, container)
        job_name = identity.job_name
        context.update(
            job=identity.job_name,
            job_uid=identity.job_uid,
            node=identity.node_name,
            trainer_image=identity.trainer_image,
        )
    except SoakError as exc:
        # Context only; the digest below is what the run identity needs, and it fails closed.
        print(f"soak-sidecar: cannot read pod {namespace}/{pod_name}: {exc}", file=sys.stderr)

    def image_digest() -> str | None:
        # Asked once the launcher has announced itself: the trainer container runs, so the
        # kubelet reports (or is about to report) its image digest.
        try:
            pod = wait_for_trainer_digest(client, namespace, pod_name, container)
        except ForbiddenError as exc:
            # RBAC that forbids reading our own pod will not heal on a retry.
            raise RefusedError(f"cannot read the trainer image digest: {exc}") from exc
        if pod.trainer_image_digest is None:
            # The digest joins the identity: running without it would change the identity later.
            raise TransientError(f"no image digest reported for container {container!r}")
        return pod.trainer_image_digest

    pod_ports = replace(
        ports,
        publisher=_PodPublication(publisher, progress_notes=kube.progress_annotations_s > 0),
        image_digest=image_digest,
        reference_clock=ApiserverClock(client),
        pod_status=_PodStatusReader(
            client, namespace, pod_name, job_name, indexes=kube.completions, trainer=container
        ),
    )
    return Wiring(pod_ports, context=context, attempt_label=pod_name)
