"""Where a run runs: the source checkout, the software versions, the host and its clocks."""

from __future__ import annotations

import platform
import socket
import subprocess
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from sidecar import __version__
from sidecar.core.boot import BootClock

PACKAGES = ("psutil", "nvidia-ml-py", "boto3", "kubernetes", "torch")
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


class HostProvenance:
    """Implements the Provenance port for the machine (or container) the sidecar runs on."""

    def __init__(self, source_dir: Path) -> None:
        self._source_dir = source_dir

    def describe(self) -> dict[str, Any]:
        return {
            "source": git_snapshot(self._source_dir),
            "software": software(),
            "hostname": socket.gethostname(),
            "boot_id": boot_id(),
        }


def git_snapshot(path: Path) -> dict[str, Any]:
    def git(*args: str) -> str:
        try:
            result = subprocess.run(
                ["git", *args], cwd=path, check=False, capture_output=True, text=True, timeout=2.0
            )
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return result.stdout.strip() if result.returncode == 0 else ""

    return {
        "path": str(path),
        "commit": git("rev-parse", "HEAD") or None,
        "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None,
        "dirty_files": len(git("status", "--porcelain").splitlines()),
    }


def software() -> dict[str, str | None]:
    def package(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "soak-sidecar": __version__,
        **{name: package(name) for name in PACKAGES},
    }


def boot_id() -> str | None:
    try:
        return BOOT_ID.read_text(encoding="utf-8").strip()
    except OSError:
        return None


class HostClock:
    """Implements the NodeClock port with this host's clocks: wall, monotonic, and the boot clock
    (CLOCK_BOOTTIME, which counts suspended time) under the kernel's boot id."""

    def wall(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def boot(self) -> BootClock | None:
        current = boot_id()
        return None if current is None else BootClock(current, time.clock_gettime(time.CLOCK_BOOTTIME))
