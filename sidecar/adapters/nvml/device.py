"""Reading one GPU through pynvml: its memory, utilisation, clocks and health per sample, its
process lists and error counters at the slower cadence.

NOT_SUPPORTED/FUNCTION_NOT_FOUND make a metric unavailable for good, GPU_IS_LOST/RESET_REQUIRED set
the device's fault, and any other error is recorded against the metric for that sample only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import pynvml

from sidecar.adapters.nvml.errors import FAULTS, MIB, UNSUPPORTED, describe
from sidecar.core.gpu_health import clock_reason_names
from sidecar.core.samples import GpuDevice

T = TypeVar("T")
ProcessKind = Literal["compute", "graphics"]
_PROCESS_LISTS: tuple[tuple[ProcessKind, str, Callable[[Any], list[Any]]], ...] = (
    ("compute", "compute_processes", pynvml.nvmlDeviceGetComputeRunningProcesses_v3),
    ("graphics", "graphics_processes", pynvml.nvmlDeviceGetGraphicsRunningProcesses_v3),
)


class DeviceFaultError(Exception):
    """A device lost or needing a reset (``FAULTS``): ``text`` says which."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


@dataclass
class Device:
    """One selected GPU: its handle, identity, and what is known to fail on it."""

    index: int
    uuid: str
    name: str
    handle: Any
    memory_total_mib: float | None
    unsupported: set[str] = field(default_factory=set)
    # The fault that lost the device (reads then stop): every later sample names it.
    fault: DeviceFaultError | None = None
    # Slow-cadence figures, carried between process-list queries.
    processes: list[tuple[int, float | None, ProcessKind]] = field(default_factory=list)
    process_problem: str | None = None
    ecc_uncorrected: int | None = None
    retired_pages: int | None = None
    health: dict[str, Any] = field(default_factory=dict)  # GpuDevice health fields, slow cadence
    nvlink_links: int | None = None  # links the device has, once scanned

    @property
    def fault_text(self) -> str | None:
        return None if self.fault is None else self.fault.text


def sample_device(dev: Device, slow_due: bool) -> GpuDevice:
    """One sample of ``dev``; ``slow_due``: its process lists and counters are read again too."""
    record = GpuDevice(index=dev.index, uuid=dev.uuid, name=dev.name, memory_total_mib=dev.memory_total_mib)
    if dev.fault is None:
        try:
            _read_fast(dev, record)
            _read_clock_reasons(dev, record)
            if slow_due:
                _read_slow(dev, record)
        except DeviceFaultError as fault:
            dev.fault = fault
            dev.processes = []
    record.fault = dev.fault_text
    record.ecc_uncorrected = dev.ecc_uncorrected
    record.retired_pages = dev.retired_pages
    for name, value in dev.health.items():
        setattr(record, name, value)
    record.unavailable = sorted(dev.unsupported)
    return record


def _query(dev: Device, record: GpuDevice, metric: str, call: Callable[[], T]) -> T | None:
    if metric in dev.unsupported:
        return None
    try:
        return call()
    except pynvml.NVMLError as exc:
        if exc.value in FAULTS:
            raise DeviceFaultError(FAULTS[exc.value]) from exc
        if exc.value in UNSUPPORTED:
            dev.unsupported.add(metric)
        else:
            record.errors[metric] = describe(exc)
        return None


def _read_fast(dev: Device, record: GpuDevice) -> None:
    handle = dev.handle
    memory = _query(
        dev,
        record,
        "memory_reserved",
        lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2),
    )
    if memory is not None:
        record.memory_reserved_mib = memory.reserved / MIB
    else:
        # Without v2 (older drivers) "used" includes the driver's reservation.
        memory = _query(dev, record, "memory", lambda: pynvml.nvmlDeviceGetMemoryInfo(handle))
    if memory is not None:
        dev.memory_total_mib = record.memory_total_mib = memory.total / MIB
        record.memory_used_mib = memory.used / MIB
    utilization = _query(dev, record, "utilization", lambda: pynvml.nvmlDeviceGetUtilizationRates(handle))
    if utilization is not None:
        record.utilization_gpu_pct = float(utilization.gpu)
        record.utilization_memory_pct = float(utilization.memory)
    temperature = _query(
        dev,
        record,
        "temperature_v",
        lambda: pynvml.nvmlDeviceGetTemperatureV(handle, pynvml.NVML_TEMPERATURE_GPU),
    )
    if temperature is None:
        temperature = _query(
            dev,
            record,
            "temperature",
            lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        )
    if temperature is not None:
        record.temperature_c = float(temperature)
    power = _query(dev, record, "power", lambda: pynvml.nvmlDeviceGetPowerUsage(handle))
    if power is not None:
        record.power_w = power / 1000.0
    sm_clock = _query(
        dev,
        record,
        "sm_clock",
        lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
    )
    if sm_clock is not None:
        record.sm_clock_mhz = float(sm_clock)
    mem_clock = _query(
        dev,
        record,
        "mem_clock",
        lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
    )
    if mem_clock is not None:
        record.mem_clock_mhz = float(mem_clock)


def _read_clock_reasons(dev: Device, record: GpuDevice) -> None:
    handle = dev.handle
    reasons = _query(
        dev, record, "clock_event_reasons", lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle)
    )
    if reasons is None and "clock_event_reasons" in dev.unsupported:
        # Drivers before 535 name it "throttle reasons"; the bits are the same.
        reasons = _query(
            dev,
            record,
            "clock_throttle_reasons",
            lambda: pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle),
        )
    if reasons is not None:
        record.clock_event_reasons = clock_reason_names(int(reasons))


def _read_slow(dev: Device, record: GpuDevice) -> None:
    handle = dev.handle
    dev.ecc_uncorrected = _query(
        dev,
        record,
        "ecc",
        lambda: int(
            pynvml.nvmlDeviceGetTotalEccErrors(
                handle, pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC
            )
        ),
    )
    dev.retired_pages = _query(
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
    _read_health(dev, record)
    processes: list[tuple[int, float | None, ProcessKind]] = []
    for kind, metric, query in _PROCESS_LISTS:
        entries = _query(dev, record, metric, lambda query=query: query(handle))  # type: ignore[misc]
        if kind == "compute":
            if metric in dev.unsupported:
                dev.process_problem = "not supported"
            elif metric in record.errors:
                dev.process_problem = record.errors[metric]
            else:
                dev.process_problem = None
        for entry in entries or []:
            used = None if entry.usedGpuMemory is None else entry.usedGpuMemory / MIB
            processes.append((int(entry.pid), used, kind))
    dev.processes = processes


def _read_health(dev: Device, record: GpuDevice) -> None:
    """Row remapping, pending retirements, PCIe replays, NVLink errors (NOT_SUPPORTED: unavailable)."""
    handle, health = dev.handle, dev.health
    rows = _query(dev, record, "remapped_rows", lambda: pynvml.nvmlDeviceGetRemappedRows(handle))
    if rows is not None:
        corr, unc, pending, failure = (int(value) for value in rows)
        health.update(
            remapped_rows_correctable=corr,
            remapped_rows_uncorrectable=unc,
            row_remap_pending=bool(pending),
            row_remap_failure=bool(failure),
        )
    pending_pages = _query(
        dev,
        record,
        "retired_pages_pending",
        lambda: pynvml.nvmlDeviceGetRetiredPagesPendingStatus(handle),
    )
    if pending_pages is not None:
        health["retired_pages_pending"] = bool(pending_pages)
    corrected = _query(
        dev,
        record,
        "ecc_corrected",
        lambda: pynvml.nvmlDeviceGetTotalEccErrors(
            handle, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC
        ),
    )
    if corrected is not None:
        health["ecc_corrected"] = int(corrected)
    action = _query(dev, record, "recovery_action", lambda: _recovery_action(handle))
    if action is not None:
        health["recovery_action"] = action
    replays = _query(dev, record, "pcie_replay", lambda: pynvml.nvmlDeviceGetPcieReplayCounter(handle))
    if replays is not None:
        health["pcie_replay_count"] = int(replays)
    nvlink = _query(dev, record, "nvlink", lambda: _nvlink_errors(dev))
    if nvlink is not None:
        active, crc, replay, recovery = nvlink
        health.update(
            nvlink_active_links=active,
            nvlink_crc_errors=crc,
            nvlink_replay_errors=replay,
            nvlink_recovery_errors=recovery,
        )


RECOVERY_ACTIONS = {0: "none", 1: "gpu_reset", 2: "node_reboot", 3: "drain_p2p", 4: "drain_and_reset"}


def _recovery_action(handle: Any) -> str:
    """What the driver says the GPU needs (NVML_FI_DEV_GET_GPU_RECOVERY_ACTION); a driver that does
    not report it answers NOT_SUPPORTED in the field, raised as the call's error."""
    (field,) = pynvml.nvmlDeviceGetFieldValues(handle, [pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
    if field.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(field.nvmlReturn)
    value = int(field.value.uiVal)
    return RECOVERY_ACTIONS.get(value, f"action {value}")


_NVLINK_CRC = (pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA)


def _nvlink_errors(dev: Device) -> tuple[int, int, int, int]:
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
