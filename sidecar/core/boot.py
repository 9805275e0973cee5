"""A reading of CLOCK_BOOTTIME: real time since boot, suspend included, never set back."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BootClock:
    """CLOCK_BOOTTIME now, and the boot it counts from (the kernel's boot id)."""

    boot_id: str
    boottime_s: float
