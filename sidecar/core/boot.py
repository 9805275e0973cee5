"""Clocks a node cannot set back: CLOCK_BOOTTIME, and the deadline store's own time."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BootClock:
    """CLOCK_BOOTTIME now, and the boot it counts from (the kernel's boot id)."""

    boot_id: str
    boottime_s: float


@dataclass(frozen=True)
class StoreClock:
    """The deadline store's own time (epoch seconds, its server's clock): when it wrote the record,
    and now, read off a write made for the purpose."""

    record_written: float
    now: float
    source: str  # e.g. "the deadline store's clock (S3 LastModified)", for messages


@dataclass(frozen=True)
class ReferenceTime:
    """A time (epoch seconds) read off a clock outside this node, e.g. the Kubernetes apiserver's,
    and which clock it was: a node whose own clock is wrong cannot move it."""

    source: str
    unix: float
