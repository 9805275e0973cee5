"""A node left clean (pure): once the trainer's tree is gone, its GPUs as they were before it started.

Compared with a sample taken before the go-ahead: a process of the run still listed on a GPU (it holds
memory or a context: a leak of the run); a device whose used memory stayed above its level before the
soak by more than the tolerance while no process at all is listed on it (the device, or its driver,
kept it); a row remapping or a page retirement still pending (the device needs a reset). A device
that already faulted is judged by its fault instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.samples import GpuSample


@dataclass(frozen=True)
class GpuLeftover:
    held_by_run: tuple[str, ...] = ()  # processes of the run still on a GPU
    on_device: tuple[str, ...] = ()  # memory not returned, resets pending: the device's

    @property
    def findings(self) -> tuple[str, ...]:
        return (*self.held_by_run, *self.on_device)


def gpu_leftovers(
    before: GpuSample, after: GpuSample, run_pids: set[int], tolerance_mib: float
) -> GpuLeftover:
    if not after.available:
        return GpuLeftover()
    earlier = {d.uuid: d.memory_used_mib for d in before.devices}
    held = tuple(
        f"{_name(after, p.device_uuid)}: process {p.pid} of the run is still listed"
        + ("" if p.used_memory_mib is None else f" ({p.used_memory_mib:.0f} MiB)")
        for p in after.processes
        if p.pid in run_pids
    )
    device: list[str] = []
    for d in after.devices:
        if d.fault is not None:
            continue
        name = f"GPU {d.index} ({d.uuid})"
        was, now = earlier.get(d.uuid), d.memory_used_mib
        listed = any(p.device_uuid == d.uuid for p in after.processes)
        if was is not None and now is not None and now - was > tolerance_mib and not listed:
            device.append(
                f"{name}: {now:.0f} MiB in use with no process listed, {now - was:.0f} MiB above the "
                f"{was:.0f} MiB before the soak (tolerance {tolerance_mib:g} MiB)"
            )
        if d.row_remap_pending:
            device.append(f"{name}: a row remapping is pending (the GPU needs a reset)")
        if d.retired_pages_pending:
            device.append(f"{name}: a page retirement is pending (the GPU needs a reset)")
        if d.recovery_action not in (None, "none"):
            device.append(f"{name}: NVML's recovery action is {d.recovery_action}")
    return GpuLeftover(held, tuple(device))


def _name(sample: GpuSample, uuid: str) -> str:
    index = next((d.index for d in sample.devices if d.uuid == uuid), None)
    return f"GPU {index} ({uuid})"
