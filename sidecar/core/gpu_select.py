"""Which GPUs belong to the trainer, and whether NVML's process list can be attributed to it. Pure.

Selection follows the NVIDIA container runtime's reading of ``NVIDIA_VISIBLE_DEVICES``: "all",
"none"/"void"/empty (no GPU), or a comma list of indices and UUIDs. A sidecar that requests no GPU
sees every GPU of the node, so without this it would report its neighbours' GPUs as the trainer's.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

VISIBLE_DEVICES_VAR = "NVIDIA_VISIBLE_DEVICES"

# From this driver on, NVML reports PIDs in the caller's PID namespace; older ones report host PIDs.
NAMESPACE_PIDS_DRIVER = (535, 113)

_MIG_INDEX = re.compile(r"^(\d+):\d+$")


@dataclass(frozen=True)
class DeviceSelection:
    """The trainer's GPUs as named by configuration, before they are matched against NVML."""

    mode: Literal["all", "none", "listed"]
    ids: tuple[str, ...]
    source: str
    note: str | None = None


@dataclass(frozen=True)
class ResolvedSelection:
    """NVML indices to sample, and the selected ids no visible device matched."""

    indices: tuple[int, ...]
    missing: tuple[str, ...]


@dataclass(frozen=True)
class Attribution:
    mode: Literal["pid", "unavailable"]
    reason: str | None


def _split(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def _from_ids(ids: tuple[str, ...], source: str) -> DeviceSelection:
    lowered = {item.lower() for item in ids}
    if "all" in lowered:
        return DeviceSelection("all", (), source)
    if not ids or lowered <= {"none", "void"}:
        return DeviceSelection("none", (), source)
    return DeviceSelection("listed", ids, source)


def select_devices(explicit: Sequence[str] | None, trainer_env: Mapping[str, str] | None) -> DeviceSelection:
    """The explicit ``gpu.devices`` list wins; else the trainer's NVIDIA_VISIBLE_DEVICES.

    ``trainer_env`` None means the trainer's environment could not be read: all GPUs are sampled
    and the selection says why.
    """
    if explicit is not None:
        return _from_ids(tuple(item.strip() for item in explicit if item.strip()), "gpu.devices")
    if trainer_env is None:
        return DeviceSelection(
            "all", (), "trainer environment not readable", note="sampling every visible GPU"
        )
    value = trainer_env.get(VISIBLE_DEVICES_VAR)
    if value is None:
        return DeviceSelection("all", (), f"{VISIBLE_DEVICES_VAR} unset")
    source = f"{VISIBLE_DEVICES_VAR}={value}"
    if value.strip().startswith("/"):
        # deviceListStrategy volume-mounts: the list lives in the trainer's mounts, not its env.
        return DeviceSelection(
            "all",
            (),
            source,
            note="device list passed as volume mounts; sampling every visible GPU",
        )
    return _from_ids(_split(value), source)


def resolve_selection(selection: DeviceSelection, visible: Sequence[tuple[int, str]]) -> ResolvedSelection:
    """Match selected ids to NVML's (index, uuid) pairs; a MIG 'gpu:instance' id selects its GPU.

    UUIDs match exactly (case-insensitive), never by prefix: a near miss must show up as missing.
    """
    if selection.mode == "none":
        return ResolvedSelection((), ())
    if selection.mode == "all":
        return ResolvedSelection(tuple(index for index, _ in visible), ())
    by_index = {str(index): index for index, _ in visible}
    by_uuid = {uuid.lower(): index for index, uuid in visible}
    chosen: list[int] = []
    missing: list[str] = []
    for item in selection.ids:
        mig = _MIG_INDEX.match(item)
        key = mig.group(1) if mig else item
        index = by_index.get(key) if key.isdigit() else by_uuid.get(key.lower())
        if index is None:
            missing.append(item)
        elif index not in chosen:
            chosen.append(index)
    return ResolvedSelection(tuple(chosen), tuple(missing))


def parse_driver_version(text: str | None) -> tuple[int, ...] | None:
    if not text:
        return None
    parts = text.strip().split(".")
    if not all(part.isdigit() for part in parts):
        return None
    return tuple(int(part) for part in parts)


def attribute(
    reported: Sequence[tuple[int, float | None]],
    tree_pids: Collection[int],
    driver_version: str | None,
) -> Attribution:
    """Whether NVML's (pid, used MiB) process entries can be attributed to the trainer by PID.

    Attribution needs at least one reported PID in the trainer's tree, and a memory figure for each
    matching PID. Anything else is "unavailable" with the reason; nothing is inferred from sizes or
    counts, because a wrong attribution would blame or clear the wrong process.
    """
    if not reported:
        return Attribution("unavailable", "NVML reports no processes on the selected GPUs")
    tree = set(tree_pids)
    matched = [(pid, used) for pid, used in reported if pid in tree]
    if not matched:
        version = parse_driver_version(driver_version)
        if version is not None and version[:2] < NAMESPACE_PIDS_DRIVER:
            why = f"driver {driver_version} predates 535.113 and reports host PIDs"
        else:
            why = "they may be host PIDs or processes outside the trainer"
        return Attribution("unavailable", f"no PID reported by NVML is in the trainer's tree ({why})")
    if any(used is None for _, used in matched):
        return Attribution(
            "unavailable", "NVML does not report per-process memory for the trainer's processes"
        )
    return Attribution("pid", None)
