"""GPU health (pure): NVIDIA's Xid catalog, clock-event reasons, and the rules that make a GPU fault.

The one table of which XIDs blame the GPU (or its node) and which the application
(docs/gpu-health.md prints it). A fault is retryable (``gpu_fault``, 150): the Job retries on another
node. The tracker is fed every sample in order and keeps the figures the artifact reports.

Rules, each the first time it holds:

- an XID of cause ``gpu`` (the catalog below), or a double-bit ECC event;
- a pending row remap, a row-remapping failure, or pending page retirements;
- uncorrected ECC errors that grow during the run (the volatile count at the first sample is the
  baseline: errors from before the soak are not this soak's);
- a hardware slowdown (``hw_slowdown``, ``hw_thermal``, ``hw_power_brake``) held without a break
  for ``fail_on_slowdown_s`` seconds, only when that setting is given (otherwise it is reported).

XIDs of cause ``application`` are recorded against the trainer and never blame the GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.samples import GpuDevice, GpuEvent, GpuSample

XidCause = Literal["gpu", "application", "unclassified"]


@dataclass(frozen=True)
class Xid:
    cause: Literal["gpu", "application"]
    meaning: str


# NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors): the XIDs whose recommended action is to
# reset the GPU, drain the node or replace hardware blame the GPU; those it attributes to the
# application's own faults do not.
XID_CATALOG: Mapping[int, Xid] = MappingProxyType(
    {
        13: Xid("application", "graphics engine exception (illegal instruction or address, out of range)"),
        31: Xid("application", "GPU memory page fault (an illegal address)"),
        43: Xid("application", "GPU stopped processing (the application faulted)"),
        45: Xid("application", "preemptive cleanup after earlier errors (the processes were stopped)"),
        48: Xid("gpu", "double-bit ECC error"),
        63: Xid("gpu", "ECC page retirement or row remapping event"),
        64: Xid("gpu", "ECC page retirement or row remapping failure"),
        68: Xid("application", "video processor (NVDEC) exception"),
        74: Xid("gpu", "NVLink error"),
        79: Xid("gpu", "GPU has fallen off the bus"),
        92: Xid("gpu", "high single-bit ECC error rate"),
        94: Xid("gpu", "contained ECC error"),
        95: Xid("gpu", "uncontained ECC error"),
        109: Xid("application", "context switch timeout"),
        119: Xid("gpu", "GSP RPC timeout"),
        120: Xid("gpu", "GSP error"),
        140: Xid("gpu", "unrecovered ECC error"),
    }
)

# nvmlClocksEventReason* bits, by the names the samples and the artifact use.
CLOCK_EVENT_REASONS: Mapping[str, int] = MappingProxyType(
    {
        "gpu_idle": 0x1,
        "applications_clocks": 0x2,
        "sw_power_cap": 0x4,
        "hw_slowdown": 0x8,
        "sync_boost": 0x10,
        "sw_thermal": 0x20,
        "hw_thermal": 0x40,
        "hw_power_brake": 0x80,
        "display_clocks": 0x100,
    }
)
HARDWARE_SLOWDOWN = ("hw_slowdown", "hw_thermal", "hw_power_brake")
EVENT_LIMIT = 1000  # events kept in the artifact; the count covers all


def gpu_fault(reason: str) -> Finding:
    """A GPU lost, needing a reset, or failing a health rule (``reason``), as the sidecar saw it."""
    return Finding(Classification.GPU_FAULT, f"GPU fault: {reason}", Source.SIDECAR)


def clock_reason_names(mask: int) -> list[str]:
    """The names of the bits set in an nvmlClocksEventReason mask (unknown bits as hex)."""
    names = [name for name, bit in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS.values())
    return names + ([f"0x{unknown:x}"] if unknown else [])


def xid_cause(xid: int) -> XidCause:
    entry = XID_CATALOG.get(xid)
    return "unclassified" if entry is None else entry.cause


def describe_event(event: GpuEvent) -> str:
    where = f"GPU {event.device_index} ({event.device_uuid})"
    if event.kind == "xid":
        entry = XID_CATALOG.get(event.data)
        meaning = f": {entry.meaning}" if entry else ""
        return f"{where}: XID {event.data}{meaning}"
    return f"{where}: {event.kind.replace('_', ' ')} ECC event"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DeviceHealth(_Model):
    uuid: str
    clock_event_reason_s: dict[str, float] = Field(
        default_factory=dict, description="Seconds spent with each clock-event reason active."
    )
    longest_hw_slowdown_s: float = Field(0.0, description="Longest unbroken hardware slowdown, seconds.")
    uncorrected_ecc_growth: int | None = None
    max_pcie_replay_count: int | None = None
    max_nvlink_crc_errors: int | None = None
    max_nvlink_replay_errors: int | None = None
    max_nvlink_recovery_errors: int | None = None
    row_remap_pending: bool = False
    row_remap_failure: bool = False
    retired_pages_pending: bool = False


class GpuHealthSummary(_Model):
    events: list[GpuEvent] = Field(default_factory=list, description=f"The first {EVENT_LIMIT} events.")
    event_count: int = 0
    gpu_xids: list[int] = Field(default_factory=list, description="XIDs that blame the GPU, in order.")
    application_xids: list[int] = Field(
        default_factory=list, description="XIDs the application caused: the trainer's, not the GPU's."
    )
    unclassified_xids: list[int] = Field(default_factory=list)
    events_unavailable: str | None = Field(None, description="Why no events could be watched.")
    devices: list[DeviceHealth] = Field(default_factory=list)
    fault: str | None = Field(None, description="The first rule that found the GPU faulty.")


@dataclass
class _Slowdown:
    since: float | None = None
    last_t: float | None = None


class GpuHealthTracker:
    """Feed every sample in order; ``fault`` is the first GPU fault a rule found."""

    def __init__(self, fail_on_slowdown_s: float | None = None) -> None:
        self._fail_on_slowdown_s = fail_on_slowdown_s
        self._summary = GpuHealthSummary()
        self._devices: dict[str, DeviceHealth] = {}
        self._ecc_baseline: dict[str, int] = {}
        self._slowdown: dict[str, _Slowdown] = {}

    @property
    def fault(self) -> str | None:
        return self._summary.fault

    @property
    def observed(self) -> bool:
        """Whether any GPU sample was taken (no GPUs, no health figures)."""
        return bool(self._devices) or self._summary.event_count > 0

    def trainer_xids(self) -> list[str]:
        """The XIDs the application caused, described once each: evidence against the trainer."""
        caused = [e for e in self._summary.events if e.kind == "xid" and xid_cause(e.data) == "application"]
        return list(dict.fromkeys(describe_event(event) for event in caused))

    def summary(self) -> GpuHealthSummary:
        return self._summary.model_copy(update={"devices": list(self._devices.values())}, deep=True)

    def observe(self, gpu: GpuSample, t: float) -> str | None:
        """Take one sample at monotonic time ``t``; returns the fault once one is found."""
        if gpu.events_unavailable and self._summary.events_unavailable is None:
            self._summary.events_unavailable = gpu.events_unavailable
        for event in gpu.events:
            self._event(event)
        for device in gpu.devices:
            self._device(device, t)
        return self._summary.fault

    def _found(self, reason: str) -> None:
        if self._summary.fault is None:
            self._summary.fault = reason

    def _event(self, event: GpuEvent) -> None:
        summary = self._summary
        summary.event_count += 1
        if len(summary.events) < EVENT_LIMIT:
            summary.events.append(event)
        if event.kind == "ecc_double_bit":
            self._found(describe_event(event))
        if event.kind != "xid":
            return
        cause = xid_cause(event.data)
        {"gpu": summary.gpu_xids, "application": summary.application_xids}.get(
            cause, summary.unclassified_xids
        ).append(event.data)
        if cause == "gpu":
            self._found(describe_event(event))

    def _device(self, device: GpuDevice, t: float) -> None:
        health = self._devices.setdefault(device.uuid, DeviceHealth(uuid=device.uuid))
        where = f"GPU {device.index} ({device.uuid})"
        self._counters(device, health)
        if device.row_remap_pending and not health.row_remap_pending:
            self._found(f"{where}: row remapping pending (the GPU needs a reset)")
        if device.row_remap_failure and not health.row_remap_failure:
            self._found(f"{where}: row remapping failed")
        if device.retired_pages_pending and not health.retired_pages_pending:
            self._found(f"{where}: page retirement pending (the GPU needs a reset)")
        health.row_remap_pending |= bool(device.row_remap_pending)
        health.row_remap_failure |= bool(device.row_remap_failure)
        health.retired_pages_pending |= bool(device.retired_pages_pending)
        if device.ecc_uncorrected is not None:
            baseline = self._ecc_baseline.setdefault(device.uuid, device.ecc_uncorrected)
            health.uncorrected_ecc_growth = device.ecc_uncorrected - baseline
            if health.uncorrected_ecc_growth > 0:
                self._found(
                    f"{where}: {health.uncorrected_ecc_growth} uncorrected ECC errors during the soak"
                )
        self._clock_reasons(device, health, t, where)

    @staticmethod
    def _counters(device: GpuDevice, health: DeviceHealth) -> None:
        for name, value in (
            ("max_pcie_replay_count", device.pcie_replay_count),
            ("max_nvlink_crc_errors", device.nvlink_crc_errors),
            ("max_nvlink_replay_errors", device.nvlink_replay_errors),
            ("max_nvlink_recovery_errors", device.nvlink_recovery_errors),
        ):
            current = getattr(health, name)
            if value is not None and (current is None or value > current):
                setattr(health, name, value)

    def _clock_reasons(self, device: GpuDevice, health: DeviceHealth, t: float, where: str) -> None:
        state = self._slowdown.setdefault(device.uuid, _Slowdown())
        reasons = device.clock_event_reasons
        if state.last_t is not None and reasons is not None:
            # The reasons seen now are taken to have held since the previous sample.
            for name in reasons:
                spent = health.clock_event_reason_s.get(name, 0.0) + (t - state.last_t)
                health.clock_event_reason_s[name] = round(spent, 6)
        slowed = reasons is not None and any(name in HARDWARE_SLOWDOWN for name in reasons)
        if not slowed:
            state.since = None
        elif state.since is None:
            state.since = state.last_t if state.last_t is not None else t
        state.last_t = t
        if state.since is None:
            return
        held = t - state.since
        health.longest_hw_slowdown_s = max(health.longest_hw_slowdown_s, round(held, 6))
        limit = self._fail_on_slowdown_s
        if limit is not None and held >= limit:
            active = ", ".join(name for name in reasons or [] if name in HARDWARE_SLOWDOWN)
            self._found(f"{where}: hardware slowdown ({active}) for {held:.0f} s (limit {limit:g} s)")
