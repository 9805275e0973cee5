"""The GPU backends: NVML over the selected GPUs, and the null backend that says why there is no
GPU data."""

from __future__ import annotations

import contextlib
import time
from typing import Literal

import pynvml

from sidecar.adapters.nvml.device import Device, DeviceFaultError, sample_device
from sidecar.adapters.nvml.errors import FAULTS, describe
from sidecar.adapters.nvml.events import EventWatcher
from sidecar.core.errors import GpuUnavailableError
from sidecar.core.gpu_select import DeviceSelection, attribute, resolve_selection
from sidecar.core.samples import GpuDevice, GpuProcess, GpuSample


class NullGpuBackend:
    """No GPU data, with the reason in every sample (backend none, no library, no trainer GPUs)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def devices(self) -> list[GpuDevice]:
        return []

    def sample(self, tree_pids: set[int], now_monotonic: float) -> GpuSample:
        return GpuSample(available=False, reason=self.reason)

    def look(self, tree_pids: set[int]) -> GpuSample:
        return GpuSample(available=False, reason=self.reason)

    def close(self) -> None:
        return None


class NvmlGpuBackend:
    """Samples the selected GPUs through pynvml; :meth:`open` it, :meth:`close` it."""

    def __init__(
        self,
        devices: list[Device],
        driver_version: str | None,
        process_interval_s: float,
        notes: list[str],
    ) -> None:
        self._devices = devices
        self._driver_version = driver_version
        self._process_interval_s = process_interval_s
        self._notes = notes
        self._last_slow: float | None = None
        self._closed = False
        self._events = EventWatcher([(d.index, d.uuid, d.handle) for d in devices if d.handle is not None])

    @classmethod
    def open(cls, selection: DeviceSelection, process_interval_s: float) -> NvmlGpuBackend:
        """Initialise NVML and bind the selected devices; GpuUnavailableError says why it cannot."""
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise GpuUnavailableError(f"NVML unavailable: {describe(exc)}") from exc
        try:
            return cls._bind(selection, process_interval_s)
        except BaseException:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            raise

    @classmethod
    def _bind(cls, selection: DeviceSelection, process_interval_s: float) -> NvmlGpuBackend:
        try:
            driver = str(pynvml.nvmlSystemGetDriverVersion())
            count = int(pynvml.nvmlDeviceGetCount())
        except pynvml.NVMLError as exc:
            raise GpuUnavailableError(f"NVML cannot list devices: {describe(exc)}") from exc
        notes = [f"{selection.source}: {selection.note}"] if selection.note else []
        found: dict[int, Device] = {}
        for index in range(count):
            try:
                found[index] = cls._identify(index)
            except pynvml.NVMLError as exc:
                # Often a GPU of the node this container may not open: only a problem if selected.
                notes.append(f"GPU {index} not identified: {describe(exc)}")
        resolved = resolve_selection(selection, [(dev.index, dev.uuid) for dev in found.values()])
        if resolved.missing:
            notes.append(f"selected GPUs not visible to NVML: {', '.join(resolved.missing)}")
        if not resolved.indices:
            raise GpuUnavailableError(
                f"none of the trainer's GPUs ({selection.source}) is visible to NVML"
                + (f" ({'; '.join(notes)})" if notes else "")
            )
        chosen = [found[index] for index in resolved.indices]
        return cls(chosen, driver, process_interval_s, notes)

    @staticmethod
    def _identify(index: int) -> Device:
        """Handle and identity of GPU ``index``; a GPU already faulted stays listed, as faulted.

        Raises the NVMLError of any other failure.
        """
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = str(pynvml.nvmlDeviceGetUUID(handle))
            name = str(pynvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as exc:
            fault = FAULTS.get(exc.value)
            if fault is None:
                raise
            return Device(index, "unknown", "unknown", None, None, fault=DeviceFaultError(fault))
        # Memory is left to the samples: exactly one memory query per device per sample.
        return Device(index, uuid, name, handle, None)

    def devices(self) -> list[GpuDevice]:
        """The selected GPUs' identity; memory_total_mib is known once a sample has read it."""
        return [
            GpuDevice(
                index=d.index,
                uuid=d.uuid,
                name=d.name,
                memory_total_mib=d.memory_total_mib,
                fault=d.fault_text,
            )
            for d in self._devices
        ]

    def look(self, tree_pids: set[int]) -> GpuSample:
        return self.sample(tree_pids, time.monotonic(), look=True)

    def sample(self, tree_pids: set[int], now_monotonic: float, *, look: bool = False) -> GpuSample:
        if self._closed:
            return GpuSample(available=False, reason="GPU backend closed")
        started = time.perf_counter()
        slow_due = (
            look or self._last_slow is None or now_monotonic - self._last_slow >= self._process_interval_s
        )
        records = [sample_device(dev, slow_due) for dev in self._devices]
        if slow_due and not look:  # a look leaves the cadence as it was
            self._last_slow = now_monotonic
        nvml_time_ms = (time.perf_counter() - started) * 1000.0

        processes = [
            GpuProcess(pid=p, device_uuid=dev.uuid, used_memory_mib=used, kind=kind, in_tree=p in tree_pids)
            for dev in self._devices
            if dev.fault is None
            for p, used, kind in dev.processes
        ]
        reasons = list(self._notes)
        problems = [
            f"GPU {d.index}: {d.process_problem}"
            for d in self._devices
            if d.fault is None and d.process_problem
        ]
        attribution_mode: Literal["pid", "unavailable"]
        if problems:
            # A missing list on one GPU could hide the trainer's processes there: no partial claims.
            attribution_mode = "unavailable"
            reasons.append(f"compute process list unavailable ({'; '.join(problems)})")
        else:
            attribution = attribute(
                [(p.pid, p.used_memory_mib) for p in processes], tree_pids, self._driver_version
            )
            attribution_mode = attribution.mode
            if attribution.reason:
                reasons.append(attribution.reason)
        if attribution_mode == "pid":
            total: float | None = sum(p.used_memory_mib or 0.0 for p in processes if p.in_tree)
        else:
            used = [rec.memory_used_mib for rec in records if rec.memory_used_mib is not None]
            total = sum(used) if used else None
        faults = [f"GPU {rec.index} ({rec.uuid}): {rec.fault}" for rec in records if rec.fault]
        return GpuSample(
            available=True,
            reason="; ".join(reasons) or None,
            devices=records,
            processes=processes,
            attribution=attribution_mode,
            used_memory_mib_total=total,
            fault="; ".join(faults) or None,
            nvml_time_ms=nvml_time_ms,
            processes_age_s=None if self._last_slow is None else max(0.0, now_monotonic - self._last_slow),
            driver_version=self._driver_version,
            events=[] if look else self._events.drain(),
            events_unavailable=self._events.unavailable,
        )

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._events.close()
        # Shutting down a library that already failed changes nothing for the run.
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
