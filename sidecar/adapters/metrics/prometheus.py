"""Prometheus metrics while the sidecar runs (prometheus_client, a registry of its own, served by
``server``).

Names follow Prometheus conventions: a ``soak_`` prefix, base units (bytes, seconds), ``_total``
for counters. Labels join the neighbours on a dashboard: ``namespace``, ``pod``, ``container`` as
kube-state-metrics names them (in a pod), ``gpu`` and ``UUID`` as dcgm-exporter does. Cardinality is
bounded: fd classes are a fixed set, GPUs are the trainer's, and per-process GPU memory keeps the
largest ``PROCESS_SERIES`` processes of the latest sample only.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, make_wsgi_app

from sidecar.adapters.metrics.server import BoundedHttpServer
from sidecar.core.errors import ConfigError
from sidecar.core.samples import FD_CLASSES, Sample

PROCESS_SERIES = 16
# name, help, labels beyond the join labels
GAUGES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("soak_processes", "Processes in the trainer's tree.", ()),
    ("soak_zombie_processes", "Zombie processes in the trainer's tree.", ()),
    ("soak_threads", "Threads in the trainer's tree.", ()),
    ("soak_resident_memory_bytes", "Resident memory of the trainer's tree.", ()),
    ("soak_open_fds", "Open file descriptors of the trainer's tree, by class.", ("class",)),
    ("soak_gpu_memory_used_bytes", "GPU memory in use, per device.", ("gpu", "UUID")),
    (
        "soak_gpu_process_memory_used_bytes",
        "GPU memory of the trainer's processes (the largest few).",
        ("gpu", "UUID", "pid"),
    ),
    ("soak_budget_remaining_seconds", "Seconds left before the total-job deadline.", ()),
    ("soak_progress_age_seconds", "Seconds since the trainer last made progress.", ()),
    ("soak_step", "The trainer's step, as its last progress record says.", ()),
    (
        "soak_eta_seconds",
        "Seconds until the trainer's declared total_steps at its recent step rate (sidecar.core.eta).",
        (),
    ),
    (
        "soak_goodput_ratio",
        "Productive share of the wall time since the deadline's start, all attempts (the run's ledger).",
        (),
    ),
    (
        "soak_budget_used_seconds",
        "Seconds of the deadline's budget spent by cause: productive, or what cost the rest (the ledger).",
        ("cause",),
    ),
)
# Causes are classifications, but the ledger is read from a bucket others can write: bounded.
CAUSE_SERIES = 32
JOIN_LABELS = ("namespace", "pod", "container")
_MIB = 1024.0 * 1024.0


class PrometheusMetrics:
    """Serves ``/metrics`` on ``address:port`` from :meth:`start` until :meth:`close`."""

    def __init__(self, labels: Mapping[str, str]) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # Always these labels (empty, i.e. absent, outside a pod): no series exists before its value.
        self._labels = {name: labels.get(name, "") for name in JOIN_LABELS}
        names = list(self._labels)
        self._gauges = {
            name: Gauge(name, doc, [*names, *extra], registry=self.registry) for name, doc, extra in GAUGES
        }
        self._samples = Counter("soak_samples", "Samples taken.", names, registry=self.registry)
        self._duration = Histogram(
            "soak_sample_duration_seconds",
            "Time one sample took (process tree, GPUs, progress).",
            names,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
            registry=self.registry,
        )
        self._verdict = Info(
            "soak_verdict", "The soak's verdict, once decided.", names, registry=self.registry
        )
        self._server: BoundedHttpServer | None = None

    def start(self, address: str, port: int) -> None:
        try:
            self._server = BoundedHttpServer(address, port, make_wsgi_app(self.registry))
        except OSError as exc:
            raise ConfigError(f"cannot serve metrics on {address}:{port}: {exc}") from exc

    @property
    def port(self) -> int | None:
        return None if self._server is None else self._server.port

    def _on(self, metric: Any, **extra: str) -> Any:
        return metric.labels(**self._labels, **extra)

    def _set(self, name: str, value: float, **extra: str) -> None:
        self._gauges[name].labels(**self._labels, **extra).set(value)

    def observe(
        self,
        sample: Sample,
        *,
        budget_left_s: float | None,
        progress_age_s: float | None,
        duration_s: float,
        eta_s: float | None = None,
    ) -> None:
        try:
            self._observe(sample, budget_left_s, progress_age_s, duration_s)
            self._progress(sample, eta_s)
        except ValueError as exc:  # a metric the sample cannot fill must not stop the soak
            print(f"soak-sidecar: metrics not updated: {exc}", file=sys.stderr)

    def _observe(
        self, sample: Sample, budget_left_s: float | None, progress_age_s: float | None, duration_s: float
    ) -> None:
        tree = sample.process
        self._set("soak_processes", tree.process_count)
        self._set("soak_zombie_processes", tree.zombie_count)
        self._set("soak_threads", tree.threads_total)
        self._set("soak_resident_memory_bytes", tree.rss_kib_total * 1024)
        for fd_class in FD_CLASSES:
            self._set("soak_open_fds", tree.fd_classes_total.get(fd_class, 0), **{"class": fd_class})
        for device in sample.gpu.devices:
            if device.memory_used_mib is not None:
                used = device.memory_used_mib * _MIB
                self._set("soak_gpu_memory_used_bytes", used, gpu=str(device.index), UUID=device.uuid)
        self._gpu_processes(sample)
        if budget_left_s is not None:
            self._set("soak_budget_remaining_seconds", max(0.0, budget_left_s))
        if progress_age_s is not None:
            self._set("soak_progress_age_seconds", progress_age_s)
        self._on(self._samples).inc()
        self._on(self._duration).observe(duration_s)

    def _progress(self, sample: Sample, eta_s: float | None) -> None:
        if sample.progress.step is not None:
            self._set("soak_step", sample.progress.step)
        if eta_s is not None:
            self._set("soak_eta_seconds", eta_s)

    def _gpu_processes(self, sample: Sample) -> None:
        index = {device.uuid: device.index for device in sample.gpu.devices}
        ours = [p for p in sample.gpu.processes if p.in_tree and p.used_memory_mib is not None]
        ours.sort(key=lambda p: -(p.used_memory_mib or 0.0))
        self._gauges["soak_gpu_process_memory_used_bytes"].clear()  # processes come and go
        for process in ours[:PROCESS_SERIES]:
            labels = {"gpu": str(index.get(process.device_uuid, "")), "UUID": process.device_uuid}
            used = (process.used_memory_mib or 0.0) * _MIB
            self._set("soak_gpu_process_memory_used_bytes", used, **labels, pid=str(process.pid))

    def run_budget(self, goodput: float, used_s: Mapping[str, float]) -> None:
        self._set("soak_goodput_ratio", goodput)
        gauge = self._gauges["soak_budget_used_seconds"]
        gauge.clear()
        for cause, seconds in sorted(used_s.items(), key=lambda item: -item[1])[:CAUSE_SERIES]:
            self._set("soak_budget_used_seconds", seconds, cause=cause[:64])

    def verdict(self, status: str, classification: str | None, exit_code: int) -> None:
        info = {"status": status, "classification": classification or "", "exit_code": str(exit_code)}
        self._on(self._verdict).info(info)

    def close(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.close()
