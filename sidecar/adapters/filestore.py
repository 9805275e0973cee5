"""Deadline records in a local directory, plus the file reads the run identity needs.

Layout: ``<dir>/<run_id>.json`` (the record, never rewritten) and ``<dir>/<run_id>.lock``
(flock held by the supervising process; never deleted, since deleting a lock file lets a
second process lock a fresh inode while the first still holds the old one).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import stat
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sidecar.adapters.fsutil import fsync_dir, write_fsync
from sidecar.core.boot import StoreClock
from sidecar.core.deadline import MAX_ATTEMPTS, MAX_RECORD_BYTES
from sidecar.core.errors import (
    AlreadySupervisedError,
    ConfigError,
    RecordExistsError,
    RefusedError,
    SoakError,
    StoreUnavailableError,
)
from sidecar.core.identity import parse_run_id, parse_slot
from sidecar.launcher.protocol.files import UnsafeFileError, open_regular


def file_store_location(directory: Path) -> str:
    """What names a file deadline store in a run's identity and approval: its absolute path with
    symlinks resolved, the same whatever directory the path was given from."""
    return str(directory.resolve())


class FileDeadlineStore:
    """``DeadlineStore`` over one directory (a PVC or a local dir)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.resolve()
        self._held: dict[str, int] = {}

    @property
    def location(self) -> str:
        return file_store_location(self.directory)

    def record_path(self, run_id: str) -> Path:
        # parse_run_id admits only UUIDs, so the name can never leave the directory.
        return self.directory / f"{parse_run_id(run_id)}.json"

    def lock_path(self, slot: str) -> Path:
        return self.directory / f"{parse_slot(slot)}.lock"

    def _ensure_dir(self) -> None:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            message = f"cannot create deadline store {self.directory}: {exc}"
            # mkdir -p creates missing parents, so ENOENT means the filesystem refuses directories
            # there (/proc, /sys): no retry can help.
            if exc.errno == errno.ENOENT:
                raise ConfigError(message) from exc
            raise _store_error(message, exc) from exc

    @contextmanager
    def lock(self, slot: str) -> Iterator[None]:
        """Exclusive flock on ``<slot>.lock`` (``<run_id>.lock``, or ``<run_id>.index-<n>.lock`` for
        one pod of a multi-pod soak) until the block exits.

        flock belongs to the open file description: a second open in this process would also be
        refused, and a child that inherits ``inheritable_lock_fd`` keeps the lock if this process dies.
        """
        path = self.lock_path(slot)
        self._ensure_dir()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            raise _store_error(f"cannot open lock {path}: {exc}", exc) from exc
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                    raise AlreadySupervisedError(
                        f"another supervisor holds run {slot} ({path}; {_holder(fd)})"
                    ) from exc
                raise _store_error(f"cannot lock {path}: {exc}", exc) from exc
            _note_holder(fd)
            self._held[slot] = fd
            try:
                yield
            finally:
                del self._held[slot]
        finally:
            # Closing the last descriptor releases the flock.
            os.close(fd)

    def inheritable_lock_fd(self, slot: str) -> int:
        """The descriptor holding the slot's lock (to pass to a child with ``pass_fds``)."""
        try:
            return self._held[slot]
        except KeyError:
            raise ConfigError(f"run {slot} is not locked by this store") from None

    def load(self, run_id: str) -> bytes | None:
        """The record's bytes, read only from what the store itself would have written: a regular
        file (no symlink followed), owned by this process's user, writable by no one else, readable
        by its owner. Anything else is refused (15): a hand-made record could stretch the budget."""
        path = self.record_path(run_id)
        try:
            fd, info = open_regular(path)
        except FileNotFoundError:
            return None
        except UnsafeFileError as exc:
            raise RefusedError(
                f"deadline record {path} is not a regular file the store wrote: {exc}"
            ) from exc
        except OSError as exc:
            raise _store_error(f"cannot read deadline record {path}: {exc}", exc) from exc
        try:
            _require_stored_by_us(path, info)
            # One byte over the cap is enough for the parser to refuse it.
            return os.read(fd, MAX_RECORD_BYTES + 1)
        except OSError as exc:
            raise _store_error(f"cannot read deadline record {path}: {exc}", exc) from exc
        finally:
            os.close(fd)

    def store_clock(self, run_id: str) -> StoreClock | None:
        """The file system's time: the record's mtime, and that of a probe file written now. On an
        NFS volume both come from the server's clock, not this node's."""
        record = self.record_path(run_id)
        probe = self.directory / f".clock-{uuid.uuid4().hex}"
        try:
            written = os.stat(record, follow_symlinks=False).st_mtime
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                os.write(fd, b"now")
                now = os.fstat(fd).st_mtime
            finally:
                os.close(fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            message = f"cannot read the deadline store's clock in {self.directory}: {exc}"
            raise _store_error(message, exc) from exc
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
        return StoreClock(
            record_written=written, now=now, source="the deadline store's clock (file modification times)"
        )

    def attempt_claims(self, run_id: str) -> list[float | None]:
        """Every slot's claims: the run's own and those of each index of a multi-pod soak."""
        run = parse_run_id(run_id)
        try:
            ledgers = [
                self.directory / name
                for name in sorted(os.listdir(self.directory))
                if name.endswith(".attempts") and _slot_of(name.removesuffix(".attempts"), run)
            ]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _store_error(f"cannot list the deadline store {self.directory}: {exc}", exc) from exc
        return [claim for ledger in ledgers for claim in self._ledger(ledger)]

    @staticmethod
    def _ledger(directory: Path) -> list[float | None]:
        try:
            names = [name for name in os.listdir(directory) if name.isdigit()]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise _store_error(f"cannot list the attempt ledger {directory}: {exc}", exc) from exc
        return [_claimed_unix(directory / name) for name in sorted(names, key=int)]

    def create(self, run_id: str, payload: bytes) -> None:
        """Publish the record with link(2): exclusive like O_EXCL, and no reader ever sees a
        partly written record (a crash leaves only a temp file, never a corrupt record)."""
        path = self.record_path(run_id)
        self._ensure_dir()
        tmp = self.directory / f".{path.name}.{uuid.uuid4().hex}.tmp"
        try:
            # Read-only: a record is never rewritten, and editing it by hand fails closed anyway.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o444)
            try:
                write_fsync(fd, payload)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)
            except FileExistsError as exc:
                raise RecordExistsError(f"deadline record {path} already exists") from exc
            fsync_dir(self.directory)
        except OSError as exc:
            raise _store_error(f"cannot create deadline record {path}: {exc}", exc) from exc
        finally:
            # A stray temp file is harmless: readers only open <run_id>.json.
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)

    def claim_attempt(self, slot: str) -> int:
        """``<slot>.attempts/<n>``, the first n whose exclusive create succeeds."""
        directory = self.directory / f"{parse_slot(slot)}.attempts"
        note = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "claimed_unix": time.time()})
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for attempt in range(1, MAX_ATTEMPTS + 1):
                try:
                    fd = os.open(directory / str(attempt), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o444)
                except FileExistsError:
                    continue
                try:
                    write_fsync(fd, note.encode())
                finally:
                    os.close(fd)
                fsync_dir(directory)
                return attempt
        except OSError as exc:
            raise _store_error(f"cannot claim an attempt number in {directory}: {exc}", exc) from exc
        raise StoreUnavailableError(f"more than {MAX_ATTEMPTS} attempts recorded in {directory}")


def _slot_of(name: str, run_id: str) -> bool:
    """Whether ``name`` is ``run_id``'s slot (the run, or one of its indexes)."""
    try:
        return parse_slot(name).split(".", 1)[0] == run_id
    except ConfigError:
        return False


# A store the configuration points at something unusable will not heal on a retry.
_PERMANENT_ERRNOS = frozenset(
    {errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENAMETOOLONG, errno.ELOOP}
)


def _store_error(message: str, exc: OSError) -> SoakError:
    """A misconfigured store is a usage error (exit 64); anything else may pass (retryable)."""
    if exc.errno in _PERMANENT_ERRNOS:
        return ConfigError(message)
    return StoreUnavailableError(message)


def _require_stored_by_us(path: Path, info: os.stat_result) -> None:
    """A regular file (open_regular saw to it) the store itself wrote: its owner, its modes."""
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.geteuid():
        problem = f"is owned by uid {info.st_uid}, not the store's user (uid {os.geteuid()})"
    elif mode & 0o022:
        problem = f"is writable by others (mode {mode:04o}; records are written 0444)"
    elif not mode & 0o400:
        problem = f"is not readable by its owner (mode {mode:04o}; records are written 0444)"
    else:
        return
    raise RefusedError(f"deadline record {path} {problem}: refusing a record the store did not write")


def _claimed_unix(path: Path) -> float | None:
    """An attempt claim's time as its claimer wrote it; None when it cannot be read."""
    try:
        with path.open("rb") as handle:
            claimed = json.loads(handle.read(4096)).get("claimed_unix")
    except (OSError, ValueError, AttributeError):
        return None
    return float(claimed) if isinstance(claimed, (int, float)) and not isinstance(claimed, bool) else None


def _note_holder(fd: int) -> None:
    """Record who holds the lock, for the refusal message of the next supervisor."""
    note = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since_unix": time.time()})
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)
    except OSError:
        pass  # the note is informational; the flock alone is the lock


def _holder(fd: int) -> str:
    try:
        note = json.loads(os.pread(fd, 4096, 0).decode())
        return f"held by pid {note['pid']} on {note['host']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"
