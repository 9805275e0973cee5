"""A memory cgroup of the test's own, under the one this process runs in (root; v1 or v2)."""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")


def _own_memory_cgroup() -> tuple[str, Path]:
    """("v1"|"v2", the directory of this process's memory cgroup)."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return "v1", ROOT / "memory" / path.lstrip("/")
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "" and "memory" in (ROOT / "cgroup.controllers").read_text().split():
            return "v2", ROOT / path.lstrip("/")
    raise RuntimeError("no memory cgroup controller is mounted here (cgroup v1 memory or v2 with memory)")


@contextlib.contextmanager
def memory_limited(limit_bytes: int) -> Iterator[Path]:
    """A new child memory cgroup limited to ``limit_bytes``: its cgroup.procs path, for a child's
    ``preexec_fn`` to join. Removed afterwards (once its processes are gone)."""
    version, parent = _own_memory_cgroup()
    group = parent / f"soak-test-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        if version == "v1":
            (group / "memory.limit_in_bytes").write_text(str(limit_bytes))
            # No swap to spill into: the limit is the limit.
            with contextlib.suppress(OSError):
                (group / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        else:
            (group / "memory.max").write_text(str(limit_bytes))
            with contextlib.suppress(OSError):
                (group / "memory.swap.max").write_text("0")
        yield group / "cgroup.procs"
    finally:
        end = time.monotonic() + 10
        while True:
            try:
                group.rmdir()
                break
            except OSError:
                if time.monotonic() > end:
                    raise
                time.sleep(0.1)


def join(procs: Path) -> None:
    """In a child before exec: move it into the cgroup."""
    with open(procs, "w") as handle:
        handle.write(str(os.getpid()))
