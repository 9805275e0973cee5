"""The launcher's memory cgroup: its limit and the kernel's OOM-kill counter.

The launcher runs in the trainer's container (locally: wherever it was started), so its memory
cgroup is the trainer's. The counter is read when the trainer starts, at every death the subreaper
reaps that the launcher did not cause (SIGKILL from the kernel), and at the end: a rise names the
process just reaped as the OOM killer's victim; a rise with no such death (a grandchild reaped by
its own parent, e.g. a torchrun worker) is still counted.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

from .protocol.exit import MemoryReport, OomKill
from .protocol.files import read_bytes

PROC_SELF_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
# v1's "no limit" is PAGE_COUNTER_MAX pages (about 2**63 bytes); anything this large is unlimited.
UNLIMITED_BYTES = 1 << 62
READ_LIMIT = 64 * 1024


@dataclass(frozen=True)
class MemoryCgroup:
    version: str  # "v1" or "v2"
    directory: str

    @property
    def counter_file(self) -> str:
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        return os.path.join(self.directory, name)

    def oom_kills(self) -> int | None:
        """The ``oom_kill`` counter (kernel 4.13+), None when it cannot be read."""
        data = read_bytes(self.counter_file, READ_LIMIT)
        for line in (data or b"").splitlines():
            key, _, value = line.partition(b" ")
            if key == b"oom_kill" and value.strip().isdigit():
                return int(value)
        return None

    def limit_bytes(self) -> int | None:
        name = "memory.limit_in_bytes" if self.version == "v1" else "memory.max"
        data = (read_bytes(os.path.join(self.directory, name), READ_LIMIT) or b"").strip()
        if not data.isdigit():
            return None  # v2's "max", or unreadable
        limit = int(data)
        return None if limit >= UNLIMITED_BYTES else limit


def find_memory_cgroup(proc_cgroup: str = PROC_SELF_CGROUP, root: str = CGROUP_ROOT) -> MemoryCgroup | None:
    """This process's memory cgroup, or None when none with an OOM counter is mounted here.

    v1 (a ``memory`` controller line) first: a hybrid host also has a v2 line, without memory.
    The path from /proc may be the host's while the container sees its own cgroup at the mount's
    root (cgroup v1 without a cgroup namespace), so the mount root is the fallback.
    """
    data = read_bytes(proc_cgroup, READ_LIMIT) or b""
    v1_path = v2_path = None
    for line in data.decode(errors="replace").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _, controllers, path = fields
        if "memory" in controllers.split(","):
            v1_path = path
        elif controllers == "":
            v2_path = path
    candidates: list[MemoryCgroup] = []
    if v1_path is not None:
        base = os.path.join(root, "memory")
        candidates += [MemoryCgroup("v1", _join(base, v1_path)), MemoryCgroup("v1", base)]
    if v2_path is not None:
        candidates += [MemoryCgroup("v2", _join(root, v2_path)), MemoryCgroup("v2", root)]
    return next((group for group in candidates if group.oom_kills() is not None), None)


def _join(base: str, cgroup_path: str) -> str:
    parts = [part for part in cgroup_path.split("/") if part not in ("", ".", "..")]
    return os.path.join(base, *parts)


@dataclass
class OomWatch:
    """The OOM-kill counter across the trainer's life, and the victims it names."""

    cgroup: MemoryCgroup | None
    at_start: int | None = None
    last: int | None = None
    victims: list[OomKill] = field(default_factory=list)

    @classmethod
    def here(cls) -> OomWatch:
        return cls(find_memory_cgroup())

    def start(self) -> None:
        if self.cgroup is not None:
            self.at_start = self.last = self.cgroup.oom_kills()

    def killed(self, pid: int, command: tuple[str, ...]) -> None:
        """A process the launcher did not kill died of SIGKILL: the kernel's, if the counter rose."""
        if self.cgroup is None or self.last is None:
            return
        now = self.cgroup.oom_kills()
        if now is not None and now > self.last:
            self.victims.append(OomKill(pid=pid, command=command, at_unix=time.time()))
            self.last = now

    def report(self) -> MemoryReport | None:
        if self.cgroup is None or self.at_start is None:
            return None
        at_end = self.cgroup.oom_kills()
        return MemoryReport(
            cgroup=self.cgroup.version,
            limit_bytes=self.cgroup.limit_bytes(),
            oom_kills_at_start=self.at_start,
            oom_kills_at_end=self.at_start if at_end is None else max(at_end, self.at_start),
            oom_killed=tuple(self.victims),
        )
