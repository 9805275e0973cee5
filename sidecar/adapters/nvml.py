"""GPU sampling through NVML (pynvml), and the mock-library loader for backend ``mock``.

The mock library and its compiled scenario are handed in by the caller that wires the adapters
(``MockNvml``): building them is the mock package's business, not the adapter's.

Every pynvml error stops here: a missing library or driver becomes "no GPU data" with the reason
(``GpuUnavailableError`` only when ``gpu.require`` is set), NOT_SUPPORTED/FUNCTION_NOT_FOUND make a
metric unavailable for good, GPU_IS_LOST/RESET_REQUIRED set the device's fault, and any other error
is recorded against the metric for that sample only.
"""

from __future__ import annotations

import contextlib
import ctypes
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import pynvml

from sidecar.adapters.nvml_events import EventWatcher
from sidecar.core.errors import ConfigError, GpuUnavailableError
from sidecar.core.gpu_health import clock_reason_names
from sidecar.core.gpu_select import DeviceSelection, attribute, resolve_selection, select_devices
from sidecar.core.ports import GpuBackend
from sidecar.core.samples import GpuDevice, GpuProcess, GpuSample
from sidecar.settings import GpuSettings

_MIB = 1024.0 * 1024.0
_UNSUPPORTED = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
_FAULTS = {
    pynvml.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    pynvml.NVML_ERROR_RESET_REQUIRED: "GPU requires a reset",
}

T = TypeVar("T")
ProcessKind = Literal["compute", "graphics"]
_PROCESS_LISTS: tuple[tuple[ProcessKind, str, Callable[[Any], list[Any]]], ...] = (
    ("compute", "compute_processes", pynvml.nvmlDeviceGetComputeRunningProcesses_v3),
    ("graphics", "graphics_processes", pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3),
)


def _describe(exc: pynvml.NVMLError) -> str:
    return f"{exc} (NVML error {exc.value})"


class _DeviceFaultError(Exception):
    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass
class _Device:
    """One selected GPU: its handle, identity, and what is known to fail on it."""

    index: int
    uuid: str
    name: str
    handle: Any
    memory_total_mib: float | None
    unsupported: set[str] = field(default_factory=set)
    fault: str | None = None
    # Slow-cadence figures, carried between process-list queries.
    processes: list[tuple[int, float | None, ProcessKind]] = field(default_factory=list)
    process_problem: str | None = None
    ecc_uncorrected: int | None = None
    retired_pages: int | None = None
    health: dict[str, Any] = field(default_factory=dict)  # GpuDevice health fields, slow cadence
    nvlink_links: int | None = None  # links the device has, once scanned


class NullGpuBackend:
    """No GPU data, with the reason in every sample (backend none, no library, no trainer GPUs)."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def devices(self) -> list[GpuDevice]:
        return []

    def sample(self, tree_pids: set[int], now_monotonic: float) -> GpuSample:
        return GpuSample(available=False, reason=self.reason)

    def close(self) -> None:
        return None


class NvmlGpuBackend:
    """Samples the selected GPUs through pynvml; :meth:`open` it, :meth:`close` it."""

    def __init__(
        self,
        devices: list[_Device],
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
            raise GpuUnavailableError(f"NVML unavailable: {_describe(exc)}") from exc
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
            raise GpuUnavailableError(f"NVML cannot list devices: {_describe(exc)}") from exc
        notes = [f"{selection.source}: {selection.note}"] if selection.note else []
        found: dict[int, _Device] = {}
        for index in range(count):
            try:
                found[index] = cls._identify(index)
            except pynvml.NVMLError as exc:
                # Often a GPU of the node this container may not open: only a problem if selected.
                notes.append(f"GPU {index} not identified: {_describe(exc)}")
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
    def _identify(index: int) -> _Device:
        """Handle and identity of GPU ``index``; a GPU already faulted stays listed, as faulted.

        Raises the NVMLError of any other failure.
        """
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            uuid = str(pynvml.nvmlDeviceGetUUID(handle))
            name = str(pynvml.nvmlDeviceGetName(handle))
        except pynvml.NVMLError as exc:
            fault = _FAULTS.get(exc.value)
            if fault is None:
                raise
            return _Device(index, "unknown", "unknown", None, None, fault=fault)
        # Memory is left to the samples: exactly one memory query per device per sample.
        return _Device(index, uuid, name, handle, None)

    def devices(self) -> list[GpuDevice]:
        """The selected GPUs' identity; memory_total_mib is known once a sample has read it."""
        return [
            GpuDevice(
                index=d.index,
                uuid=d.uuid,
                name=d.name,
                memory_total_mib=d.memory_total_mib,
                fault=d.fault,
            )
            for d in self._devices
        ]

    def sample(self, tree_pids: set[int], now_monotonic: float) -> GpuSample:
        if self._closed:
            return GpuSample(available=False, reason="GPU backend closed")
        started = time.perf_counter()
        slow_due = self._last_slow is None or now_monotonic - self._last_slow >= self._process_interval_s
        records = [self._sample_device(dev, slow_due) for dev in self._devices]
        if slow_due:
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
            events=self._events.drain(),
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

    # -- per device -----------------------------------------------------------------------------

    def _sample_device(self, dev: _Device, slow_due: bool) -> GpuDevice:
        record = GpuDevice(
            index=dev.index, uuid=dev.uuid, name=dev.name, memory_total_mib=dev.memory_total_mib
        )
        if dev.fault is None:
            try:
                self._read_fast(dev, record)
                self._read_clock_reasons(dev, record)
                if slow_due:
                    self._read_slow(dev, record)
            except _DeviceFaultError as fault:
                dev.fault = fault.text
                dev.processes = []
        record.fault = dev.fault
        record.ecc_uncorrected = dev.ecc_uncorrected
        record.retired_pages = dev.retired_pages
        for name, value in dev.health.items():
            setattr(record, name, value)
        record.unavailable = sorted(dev.unsupported)
        return record

    def _query(self, dev: _Device, record: GpuDevice, metric: str, call: Callable[[], T]) -> T | None:
        if metric in dev.unsupported:
            return None
        try:
            return call()
        except pynvml.NVMLError as exc:
            if exc.value in _FAULTS:
                raise _DeviceFaultError(_FAULTS[exc.value]) from exc
            if exc.value in _UNSUPPORTED:
                dev.unsupported.add(metric)
            else:
                record.errors[metric] = _describe(exc)
            return None

    def _read_fast(self, dev: _Device, record: GpuDevice) -> None:
        handle = dev.handle
        memory = self._query(
            dev,
            record,
            "memory_reserved",
            lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2),
        )
        if memory is not None:
            record.memory_reserved_mib = memory.reserved / _MIB
        else:
            # Without v2 (older drivers) "used" includes the driver's reservation.
            memory = self._query(dev, record, "memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
        if memory is not None:
            dev.memory_total_mib = record.memory_total_mib = memory.total / _MIB
            record.memory_used_mib = memory.used / _MIB
        utilization = self._query(
            dev, record, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle)
        )
        if utilization is not None:
            record.utilization_gpu_pct = float(utilization.gpu)
            record.utilization_memory_pct = float(utilization.memory)
        temperature = self._query(
            dev,
            record,
            "temperature_v",
            lambda: pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU),
        )
        if temperature is None:
            temperature = self._query(
                dev,
                record,
                "temperature",
                lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
            )
        if temperature is not None:
            record.temperature_c = float(temperature)
        power = self._query(dev, record, "power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
        if power is not None:
            record.power_w = power / 1000.0
        sm_clock = self._query(
            dev,
            record,
            "sm_clock",
            lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        )
        if sm_clock is not None:
            record.sm_clock_mhz = float(sm_clock)
        mem_clock = self._query(
            dev,
            record,
            "mem_clock",
            lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        )
        if mem_clock is not None:
            record.mem_clock_mhz = float(mem_clock)

    def _read_clock_reasons(self, dev: _Device, record: GpuDevice) -> None:
        handle = dev.handle
        reasons = self._query(
            dev, record, "clock_event_reasons", lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
        )
        if reasons is None and "clock_event_reasons" in dev.unsupported:
            # Drivers before 535 name it "throttle reasons"; the bits are the same.
            reasons = self._query(
                dev,
                record,
                "clock_throttle_reasons",
                lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
            )
        if reasons is not None:
            record.clock_event_reasons = clock_reason_names(int(reasons))

    def _read_slow(self, dev: _Device, record: GpuDevice) -> None:
        handle = dev.handle
        dev.ecc_uncorrected = self._query(
            dev,
            record,
            "ecc",
            lambda: int(
                pynvml.nvmlDeviceGetTotalEccErrors(
                    handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
                )
            ),
        )
        dev.retired_pages = self._query(
            dev,
            record,
            "retired_pages",
            lambda: sum(
                len(pynvml.nvmlDeviceGetRetiredPages(handle, cause))
                for cause in (
                    pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                    pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR,
                )
            ),
        )
        self._read_health(dev, record)
        processes: list[tuple[int, float | None, ProcessKind]] = []
        for kind, metric, query in _PROCESS_LISTS:
            entries = self._query(dev, record, metric, lambda query=query: query(handle))  # type: ignore[misc]
            if kind == "compute":
                if metric in dev.unsupported:
                    dev.process_problem = "not supported"
                elif metric in record.errors:
                    dev.process_problem = record.errors[metric]
                else:
                    dev.process_problem = None
            for entry in entries or []:
                used = None if entry.usedGpuMemory is None else entry.usedGpuMemory / _MIB
                processes.append((int(entry.pid), used, kind))
        dev.processes = processes

    def _read_health(self, dev: _Device, record: GpuDevice) -> None:
        """Row remapping, pending retirements, PCIe replays, NVLink errors (NOT_SUPPORTED: unavailable)."""
        handle, health = dev.handle, dev.health
        rows = self._query(dev, record, "remapped_rows", lambda: pynvml.nvmlDeviceGetRemappedRows(handle))
        if rows is not None:
            corr, unc, pending, failure = (int(value) for value in rows)
            health.update(
                remapped_rows_correctable=corr,
                remapped_rows_uncorrectable=unc,
                row_remap_pending=bool(pending),
                row_remap_failure=bool(failure),
            )
        pending_pages = self._query(
            dev,
            record,
            "retired_pages_pending",
            lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle),
        )
        if pending_pages is not None:
            health["retired_pages_pending"] = bool(pending_pages)
        replays = self._query(
            dev, record, "pcie_replay", lambda: pynvml.nvmlDeviceGetPcieReplayCounter(handle)
        )
        if replays is not None:
            health["pcie_replay_count"] = int(replays)
        nvlink = self._query(dev, record, "nvlink", lambda: _nvlink_errors(dev))
        if nvlink is not None:
            active, crc, replay, recovery = nvlink
            health.update(
                nvlink_active_links=active,
                nvlink_crc_errors=crc,
                nvlink_replay_errors=replay,
                nvlink_recovery_errors=recovery,
            )


_NVLINK_CRC = (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)


def _nvlink_errors(dev: _Device) -> tuple[int, int, int, int]:
    """Active links and their CRC, replay and recovery errors, summed. NOT_SUPPORTED (no NVLink)
    propagates; a link past the device's last ends the scan (INVALID_ARGUMENT)."""
    active = crc = replay = recovery = 0
    links = dev.nvlink_links if dev.nvlink_links is not None else pynvml.NVML_NVLINK_MAX_LINKS
    for link in range(links):
        try:
            up = pynvml.nvmlDeviceGetNvLinkState(dev.handle, link)
        except pynvml.NVMLError as exc:
            if exc.value != pynvml.NVML_ERROR_INVALID_ARGUMENT or link == 0:
                raise
            links = link
            break
        if not up:
            continue
        active += 1
        count = pynvml.nvmlDeviceGetNvLinkErrorCounter
        crc += sum(int(count(dev.handle, link, counter)) for counter in _NVLINK_CRC)
        replay += int(count(dev.handle, link, pynvml.NVML_NVLINK_ERROR_DL_REPLAY))
        recovery += int(count(dev.handle, link, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY))
    dev.nvlink_links = links
    return active, crc, replay, recovery


@dataclass(frozen=True)
class MockNvml:
    """Backend ``mock``'s inputs: the mock libnvidia-ml.so.1 and the compiled scenario it reads."""

    library: Path
    scenario: Path


# Prepares the mock for one opening, writing the compiled scenario into the scratch directory.
MockPreparer = Callable[[Path], MockNvml]


def load_mock_library(library: Path) -> ctypes.CDLL:
    """Load the mock libnvidia-ml.so.1 so that pynvml's dlopen("libnvidia-ml.so.1") finds it.

    The mock's soname is libnvidia-ml.so.1 and the dynamic loader matches a bare dlopen name against
    the sonames of objects already loaded, so preloading it by path is enough; LD_LIBRARY_PATH is
    only read at process start. Refuses when a real NVML is already loaded in this process.
    """
    if not library.is_file():
        raise ConfigError(f"NVML mock library not found: {library}")
    loaded = pynvml.nvmlLib
    if loaded is not None:
        # NVML is loaded once per process; an earlier mock (of any directory) is reused.
        if not hasattr(loaded, "soak_nvml_mock_version"):
            raise ConfigError(
                "a real NVML library is already loaded in this process; the mock cannot replace it"
            )
        return loaded  # type: ignore[no-any-return]
    try:
        return ctypes.CDLL(str(library.resolve()))
    except OSError as exc:
        raise ConfigError(f"cannot load the NVML mock library {library}: {exc}") from exc


def _open_mock(
    prepare: MockPreparer, selection: DeviceSelection, process_interval_s: float
) -> NvmlGpuBackend:
    with tempfile.TemporaryDirectory(prefix="soak-nvml-mock-") as scratch:
        mock = prepare(Path(scratch))
        library = load_mock_library(mock.library)
        # The mock reads its scenario at the first nvmlInit only; the override is dropped after it.
        library.soak_nvml_mock_set_scenario(str(mock.scenario).encode())
        try:
            return NvmlGpuBackend.open(selection, process_interval_s)
        finally:
            library.soak_nvml_mock_set_scenario(None)


def open_gpu_backend(
    settings: GpuSettings,
    trainer_env: Mapping[str, str] | None,
    *,
    mock: MockPreparer | None = None,
) -> GpuBackend:
    """The GPU backend the settings ask for, or a NullGpuBackend saying why there is no GPU data.

    ``trainer_env`` is the trainer's environment (None when unreadable); ``mock`` is called only
    when backend ``mock`` opens GPUs. Raises GpuUnavailableError when ``settings.require`` is set
    and no GPU data can be had; ConfigError for a broken or missing mock.
    """
    if settings.backend == "none":
        return NullGpuBackend("GPU sampling is off (gpu.backend=none)")
    selection = select_devices(settings.devices, trainer_env)
    if selection.mode == "none":
        reason = f"the trainer has no GPUs ({selection.source})"
        if settings.require:
            raise GpuUnavailableError(reason)
        return NullGpuBackend(reason)
    try:
        if settings.backend == "mock":
            if mock is None:
                raise ConfigError("gpu.backend=mock, but no mock NVML library was provided")
            return _open_mock(mock, selection, settings.process_interval_s)
        return NvmlGpuBackend.open(selection, settings.process_interval_s)
    except GpuUnavailableError as exc:
        if settings.require:
            raise
        return NullGpuBackend(str(exc))
