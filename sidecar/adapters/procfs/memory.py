"""Memory of the trainer's tree beyond RSS: the launcher's memory cgroup, and the files the trainer's
UID left in /dev/shm.

The cgroup is the one ``/proc/<launcher pid>/cgroup`` names (v1's ``memory`` controller line first: a
hybrid host also has a v2 line, without memory), resolved once, before the go-ahead, when only the
verified launcher runs in it. Its memory is read under the controller's mount, every path component
opened relative to its parent with O_NOFOLLOW, every file a regular one read up to a bound, every
number parsed defensively: the trainer cannot write these files, but it chooses what it charges to
them, and a file system that is not what it should be must end in "unavailable", never in a crash.

In a pod the sidecar's cgroup namespace may hide the trainer's cgroup: its path then leaves the
namespace (``/../...``) or is not under the mount. The series is then unavailable, with the reason.

/dev/shm is the trainer's to fill with anything: it is walked through directory descriptors (no
symlink followed), up to a bound of entries and depth, and only metadata is read.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Literal

from sidecar.core.samples import CgroupMemorySample, MemoryCgroupInfo, ShmFile, ShmLeftovers
from sidecar.launcher.protocol.files import read_regular

PROC = "/proc"
CGROUP_ROOT = "/sys/fs/cgroup"
SHM_DIR = "/dev/shm"
READ_LIMIT = 64 * 1024
PATH_LIMIT = 4096
# Larger than any memory a machine has: a value past it is not a reading.
MAX_BYTES = 1 << 62
SHM_MAX_ENTRIES = 4096
SHM_MAX_DEPTH = 8
SHM_MAX_LISTED = 64
SHOWN_PATH_CHARS = 512

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Version = Literal["v1", "v2"]
# The files each version keeps the figures in: (usage file, stat keys in order of preference).
_USAGE = {"v1": "memory.usage_in_bytes", "v2": "memory.current"}
_STAT_KEYS: dict[Version, dict[str, tuple[bytes, ...]]] = {
    # v1's total_* keys count the cgroup's children too, as memory.usage_in_bytes does.
    "v1": {
        "anon": (b"total_rss", b"rss"),
        "shmem": (b"total_shmem", b"shmem"),
        "file": (b"total_cache", b"cache"),
        "inactive_file": (b"total_inactive_file", b"inactive_file"),
    },
    "v2": {
        "anon": (b"anon",),
        "shmem": (b"shmem",),
        "file": (b"file",),
        "inactive_file": (b"inactive_file",),
    },
}


def read_at(dir_fd: int | None, name: str, limit: int = READ_LIMIT) -> bytes:
    """A regular file's bytes (through no link, up to ``limit``); OSError otherwise."""
    return read_regular(name, limit, dir_fd=dir_fd)


def _number(value: bytes) -> int | None:
    value = value.strip()
    if not value.isdigit() or len(value) > 20:  # bytes.isdigit: ASCII digits only
        return None
    number = int(value)
    return number if number <= MAX_BYTES else None


def parse_stat(data: bytes) -> dict[bytes, int]:
    """``key value`` lines; the first of a key counts, a line that is not one is skipped."""
    values: dict[bytes, int] = {}
    for line in data.splitlines():
        key, _, value = line.partition(b" ")
        number = _number(value)
        if number is not None and key not in values:
            values[key] = number
    return values


def parse_membership(data: bytes) -> tuple[Version, str] | None:
    """The memory cgroup a ``/proc/<pid>/cgroup`` file names: v1's memory line, else v2's."""
    v1 = v2 = None
    for line in data.decode("utf-8", "replace").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        if "memory" in controllers.split(",") and v1 is None:
            v1 = path
        elif hierarchy == "0" and controllers == "" and v2 is None:
            v2 = path
    if v1 is not None:
        return "v1", v1
    return None if v2 is None else ("v2", v2)


def path_parts(path: str) -> list[str] | str:
    """The components of a cgroup path, or why it cannot be followed."""
    if len(path) > PATH_LIMIT or "\0" in path or not path.startswith("/"):
        return f"the cgroup path {shown(path[:80])!r} is not one"
    parts = [part for part in path.split("/") if part]
    if ".." in parts or "." in parts:
        return (
            f"the launcher's cgroup {shown(path[:200])!r} is outside the sidecar's cgroup namespace "
            "(in a pod: another container's cgroup, not visible from the sidecar)"
        )
    return parts


def _open_dir(base: str, parts: list[str]) -> int:
    fd = os.open(base, _DIR_FLAGS)
    for part in parts:
        try:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
        finally:
            os.close(fd)
        fd = child
    return fd


@dataclass(frozen=True)
class _Located:
    version: Version
    base: str
    parts: list[str]


class ProcfsTrainerMemory:
    """Implements ``sidecar.core.ports.TrainerMemory`` for the launcher ``launcher_pid``."""

    def __init__(
        self,
        launcher_pid: int,
        *,
        proc: str = PROC,
        cgroup_root: str = CGROUP_ROOT,
        shm_dir: str = SHM_DIR,
        self_pid: int | None = None,
    ) -> None:
        self._shm_dir = shm_dir
        self.uid = _real_uid(proc, launcher_pid)
        own = self_pid if self_pid is not None else os.getpid()
        self._located: _Located | None = None
        self._info = self._locate(proc, cgroup_root, launcher_pid, own)

    @property
    def cgroup(self) -> MemoryCgroupInfo:
        return self._info

    def _locate(self, proc: str, root: str, pid: int, own_pid: int) -> MemoryCgroupInfo:
        def unavailable(
            reason: str, version: Version | None = None, path: str | None = None
        ) -> MemoryCgroupInfo:
            shown_path = None if path is None else shown(path)
            return MemoryCgroupInfo(available=False, reason=reason, version=version, path=shown_path)

        try:
            membership = parse_membership(read_at(None, f"{proc}/{pid}/cgroup"))
        except OSError as exc:
            return unavailable(f"/proc/{pid}/cgroup cannot be read: {_why(exc)}")
        if membership is None:
            return unavailable(f"/proc/{pid}/cgroup names no memory cgroup (no memory controller)")
        version, path = membership
        try:
            mine = parse_membership(read_at(None, f"{proc}/{own_pid}/cgroup"))
        except OSError:
            mine = None
        sidecar_own = mine == membership
        parts = path_parts(path)
        if isinstance(parts, str):
            return unavailable(parts, version, path)
        if not parts:
            return unavailable(
                "the launcher runs in the root cgroup (the whole machine): no memory of its own to judge",
                version,
                path,
            )
        base = os.path.join(root, "memory") if version == "v1" else root
        candidates = [parts]
        if sidecar_own:
            # A container without a cgroup namespace sees its own cgroup at the mount's root while
            # /proc names it by the host's path: only the sidecar's own cgroup can be found there.
            candidates.append([])
        problem = "not found"
        for candidate in candidates:
            located = _Located(version, base, candidate)
            try:
                self._read(located)
            except OSError as exc:
                problem = _why(exc)
                continue
            self._located = located
            return MemoryCgroupInfo(
                available=True, version=version, path=shown(path), sidecar_own=sidecar_own
            )
        return unavailable(
            f"the launcher's memory cgroup is not readable under {base}: {problem} (in a pod the "
            "sidecar may not see the trainer container's cgroup)",
            version,
            path,
        )

    def _read(self, located: _Located) -> CgroupMemorySample:
        fd = _open_dir(located.base, located.parts)
        try:
            current = _number(read_at(fd, _USAGE[located.version]))
            values = parse_stat(read_at(fd, "memory.stat"))
        finally:
            os.close(fd)
        figures = {
            name: next((values[key] for key in keys if key in values), None)
            for name, keys in _STAT_KEYS[located.version].items()
        }
        return CgroupMemorySample(
            current_bytes=current,
            anon_bytes=figures["anon"],
            shmem_bytes=figures["shmem"],
            file_bytes=figures["file"],
            inactive_file_bytes=figures["inactive_file"],
        )

    def sample(self) -> CgroupMemorySample | None:
        if self._located is None:
            return None
        try:
            return self._read(self._located)
        except OSError as exc:
            return CgroupMemorySample(available=False, reason=f"cannot be read: {_why(exc)}")

    def shm_leftovers(self, since_unix: float) -> ShmLeftovers:
        return scan_shm(self._shm_dir, self.uid, since_unix)


def _real_uid(proc: str, pid: int) -> int | None:
    """The real UID on the ``Uid:`` line of /proc/<pid>/status; None when it cannot be read."""
    try:
        data = read_at(None, f"{proc}/{pid}/status")
    except OSError:
        return None
    for line in data.splitlines():
        if line.startswith(b"Uid:"):
            fields = line[4:].split()
            return _number(fields[0]) if fields else None
    return None


def _why(exc: OSError) -> str:
    return exc.strerror or str(exc)


def shown(path: str) -> str:
    """A name as it may be stored and printed: bytes that are not UTF-8 and control or invisible
    characters escaped, cut to SHOWN_PATH_CHARS."""
    text = os.fsencode(path).decode("utf-8", "backslashreplace")
    escaped = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return escaped[:SHOWN_PATH_CHARS]


def scan_shm(
    directory: str,
    uid: int | None,
    since_unix: float,
    *,
    max_entries: int = SHM_MAX_ENTRIES,
    max_depth: int = SHM_MAX_DEPTH,
    max_listed: int = SHM_MAX_LISTED,
) -> ShmLeftovers:
    """Regular files under ``directory`` owned by ``uid`` and created or changed at or after
    ``since_unix`` (the later of mtime and ctime: a trainer can set a file's mtime back, not its
    ctime). No symlink is followed; at most ``max_entries`` entries and ``max_depth`` levels."""
    if uid is None:
        return ShmLeftovers(directory=directory, uid=None, error="the trainer's UID is unknown")
    try:
        top = os.open(directory, _DIR_FLAGS)
    except OSError as exc:
        return ShmLeftovers(directory=directory, uid=uid, error=f"{directory}: {_why(exc)}")
    walk = _ShmWalk(uid, since_unix, max_entries, max_depth, max_listed)
    pending: list[tuple[int, str, int]] = [(top, directory.rstrip("/") or "/", 0)]
    try:
        while pending and not walk.truncated:
            fd, path, depth = pending.pop()
            try:
                pending.extend(walk.directory(fd, path, depth))
            finally:
                os.close(fd)
    finally:
        for fd, _, _ in pending:
            os.close(fd)
    found = sorted(walk.found, key=lambda f: f.path)
    return ShmLeftovers(directory=directory, uid=uid, files=found, more=walk.more, truncated=walk.truncated)


class _ShmWalk:
    def __init__(
        self, uid: int, since_unix: float, max_entries: int, max_depth: int, max_listed: int
    ) -> None:
        self._uid, self._since = uid, since_unix
        self._max_entries, self._max_depth, self._max_listed = max_entries, max_depth, max_listed
        self.found: list[ShmFile] = []
        self.more = self._seen = 0
        self.truncated = False

    def directory(self, fd: int, path: str, depth: int) -> list[tuple[int, str, int]]:
        """The matching files of one directory; its subdirectories, opened, to walk next."""
        subdirectories: list[tuple[int, str, int]] = []
        try:
            with os.scandir(fd) as entries:
                for entry in entries:
                    self._seen += 1
                    if self._seen > self._max_entries:
                        self.truncated = True
                        break
                    opened = self._entry(fd, entry, f"{path}/{entry.name}", depth)
                    if opened is not None:
                        subdirectories.append(opened)
        except OSError:
            pass  # vanished or unreadable: what was found stands
        return subdirectories

    def _entry(self, fd: int, entry: os.DirEntry[str], path: str, depth: int) -> tuple[int, str, int] | None:
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            return None
        if stat.S_ISDIR(info.st_mode):
            if depth + 1 >= self._max_depth:
                self.truncated = True
                return None
            try:
                return os.open(entry.name, _DIR_FLAGS, dir_fd=fd), path, depth + 1
            except OSError:
                return None
        if (
            entry.is_file(follow_symlinks=False)
            and info.st_uid == self._uid
            and max(info.st_mtime, info.st_ctime) >= self._since
        ):
            if len(self.found) >= self._max_listed:
                self.more += 1
            else:
                self.found.append(
                    ShmFile(
                        path=shown(path),
                        bytes=info.st_size,
                        allocated_bytes=info.st_blocks * 512,
                        mtime_unix=info.st_mtime,
                    )
                )
        return None
