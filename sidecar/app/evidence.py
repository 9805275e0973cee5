"""The attempt's evidence on its way out while the trainer runs, so that a hard stop (a SIGKILL, the
node lost) loses at most one flush interval of it.

- The provisional artifact (status ``running``) is written beside the samples and uploaded as soon
  as the attempt has its number. A stop from outside records ``stopping`` with its cause at once.
- Every ``evidence.flush_s`` the samples and console bytes written since the last flush go to the
  store as segments: objects numbered in order, each checksummed, never rewritten. A file's segments
  concatenated are its bytes up to the last flush.

Locally ``artifact.json`` is replaced in place (atomically) by each record and then by the final
artifact; in the store every record is a new object (``provisional-0001.json``, ...): nothing
there is ever overwritten. Uploads run on one worker thread, so a slow store never delays a sample.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.app.ports import ArtifactFiles, Publisher, SampleLog
from sidecar.core.artifact import Artifact, Segment, UploadInfo, dumps_artifact, utc_timestamp
from sidecar.core.artifact.objects import (
    ARTIFACT_FILE,
    CONSOLE_STEM,
    SAMPLES_FILE,
    provisional_name,
    segment_name,
)
from sidecar.core.classification import Classification
from sidecar.core.errors import ConfigError, ObjectConflictError, UploadError
from sidecar.core.ports import ArtifactSink, Clock, UploadedObject

# One segment at most; what is left goes out in the next one, in the same flush.
SEGMENT_LIMIT_BYTES = 8 * 1024 * 1024
# The console sent in segments, in all: what the launcher keeps of it (launcher.console_log_bytes'
# default) and what the final upload copies (sidecar.adapters.artifact_dir.COPY_LIMIT_BYTES).
CONSOLE_LIMIT_BYTES = 64 * 1024 * 1024
# Names passed over in a row when each is taken by other bytes, before the flush gives up.
MAX_TAKEN_NAMES = 16
# How long the end of an attempt waits for an upload in flight (the final upload sends it all anyway).
CLOSE_WAIT_S = 30.0


@dataclass
class _Outbox:
    """Where the evidence goes: the local directory and the store (None locally without S3)."""

    files: ArtifactFiles
    sink: ArtifactSink | None
    key_prefix: str
    clock: Clock
    publisher: Publisher | None
    error: str | None = None
    announced: str | None = None  # the latest provisional record's URI
    lock: threading.Lock = field(default_factory=threading.Lock)

    def put(
        self, name_of: Callable[[int], str], number: int, data: bytes
    ) -> tuple[UploadedObject | None, int]:
        """(the object stored, else None; the number to use next). A name already taken by other
        bytes (planted, or left by a sidecar before us) is passed over: the numbers only order the
        objects, and nothing is overwritten. Any other failure keeps the number for the next try."""
        if self.sink is None:
            return None, number
        for tried in range(number, number + MAX_TAKEN_NAMES):
            try:
                return self.sink.upload_bytes(name_of(tried), data, self.key_prefix), tried + 1
            except ObjectConflictError as exc:
                self.note(f"{name_of(tried)}: {exc}")
            except (UploadError, ConfigError) as exc:
                self.note(f"{name_of(tried)}: {exc}")
                return None, tried
        return None, number + MAX_TAKEN_NAMES

    def announce(self, record_uri: str | None = None) -> None:
        """Where the evidence is and when it last reached the store, for ``soak-sidecar verdict``."""
        self.announced = record_uri or self.announced
        if self.publisher is not None and self.announced is not None:
            self.publisher.evidence(self.announced, self.clock.wall())

    def note(self, problem: str) -> None:
        with self.lock:
            self.error = self.error or problem

    def now_utc(self) -> str:
        return utc_timestamp(self.clock.wall())


class _Records:
    """The provisional artifact: replaced in place locally, a new numbered object in the store."""

    def __init__(self, outbox: _Outbox) -> None:
        self._outbox = outbox
        self._doc: Artifact | None = None
        self._next = 1
        self._lock = threading.Lock()

    def write(self, doc: Artifact) -> None:
        """Locally, at once; OSError when the directory is unusable."""
        with self._lock:
            self._doc = doc
        self._outbox.files.write(ARTIFACT_FILE, dumps_artifact(doc).encode())

    def stopping(self, classification: Classification, reason: str) -> bool:
        with self._lock:
            if self._doc is None:
                return False
            doc = self._doc.model_copy(
                update={
                    "status": "stopping",
                    "failure_classification": classification,
                    "failure_reason": reason,
                    "ended_at_utc": self._outbox.now_utc(),
                }
            )
        try:
            self.write(doc)
        except OSError as exc:
            self._outbox.note(f"the provisional artifact was not written: {exc}")
        return True

    def upload(self) -> None:
        with self._lock:
            doc, number = self._doc, self._next
        if doc is None:
            return
        stored, following = self._outbox.put(provisional_name, number, dumps_artifact(doc).encode())
        with self._lock:
            self._next = following
        if stored is not None:
            self._outbox.announce(stored.uri)


@dataclass(frozen=True)
class _Sent:
    """How much of one console file went out, and how it began: an inode number the kernel gave
    again to a new file (the launcher's rotation frees one) holds other first bytes."""

    inode: int
    size: int
    head: bytes


class _Segments:
    """The bytes of the samples file and the console logs written since the last flush."""

    def __init__(self, outbox: _Outbox, console_logs: Callable[[], Sequence[Path]]) -> None:
        self._outbox = outbox
        self._console_logs = console_logs
        self.samples: SampleLog | None = None
        self._samples_sent = 0
        self._console: dict[str, _Sent] = {}  # by name: console.log, console.log.1
        self._console_total = 0
        self._next: dict[str, int] = {}
        self.sent: list[Segment] = []

    def flush(self) -> None:
        sent = False
        if self.samples is not None:
            upto = self.samples.flushed_bytes
            while self._samples_sent < upto:
                limit = min(SEGMENT_LIMIT_BYTES, upto - self._samples_sent)
                span = self._read(
                    self._outbox.files.path / SAMPLES_FILE, lambda _i, _h: self._samples_sent, limit
                )
                if span is None or not self._send(SAMPLES_FILE, SAMPLES_FILE, span[2], span[3]):
                    break
                self._samples_sent += len(span[3])
                sent = True
        for log in self._console_logs():
            sent = self._flush_console(log) or sent
        if sent:
            self._outbox.announce()

    def _console_offset(self, name: str, inode: int, head: bytes) -> int:
        """Where this file's unsent bytes begin: after what went out of it under this name, or
        under console.log before the launcher rotated it to console.log.1; else at 0."""
        for known in (self._console.get(name), self._console.get(CONSOLE_STEM)):
            if known is not None and known.inode == inode and _same_start(known.head, head):
                return known.size
        return 0

    def _flush_console(self, log: Path) -> bool:
        sent = False
        # A full segment means more is waiting; a short one is all there was (a trainer that keeps
        # printing must not hold the flush forever). The run dir is the trainer's to write: whatever
        # it puts at the console's name, at most CONSOLE_LIMIT_BYTES go out in all.
        full = True
        while full and (left := CONSOLE_LIMIT_BYTES - self._console_total) > 0:
            span = self._read(
                log,
                lambda inode, head: self._console_offset(log.name, inode, head),
                min(SEGMENT_LIMIT_BYTES, left),
            )
            if span is None or not span[3]:
                break
            inode, head, offset, data = span
            if not self._send(CONSOLE_STEM, log.name, offset, data):
                break
            self._console[log.name] = _Sent(inode, offset + len(data), head)
            self._console_total += len(data)
            sent, full = True, len(data) == SEGMENT_LIMIT_BYTES
        return sent

    def _read(
        self, path: Path, offset_for: Callable[[int, bytes], int], limit: int
    ) -> tuple[int, bytes, int, bytes] | None:
        try:
            return self._outbox.files.read_span(path, offset_for, limit)
        except OSError as exc:
            self._outbox.note(f"cannot read {path.name} for a segment: {exc}")
            return None

    def _send(self, stem: str, file: str, offset: int, data: bytes) -> bool:
        stored, self._next[stem] = self._outbox.put(
            lambda number: segment_name(stem, number), self._next.get(stem, 1), data
        )
        if stored is None:
            return False
        self.sent.append(
            Segment(
                name=stored.path.name,
                file=file,
                offset=offset,
                size=len(data),
                sha256=stored.sha256,
                uri=stored.uri,
                uploaded_at_utc=self._outbox.now_utc(),
            )
        )
        return True


def _same_start(first: bytes, second: bytes) -> bool:
    shared = min(len(first), len(second))
    return first[:shared] == second[:shared]


class EvidenceTrail:
    """One attempt's provisional records and segments. ``begin`` before the trainer starts,
    ``follow`` once samples are written, ``stopping`` on a stop from outside, ``close`` at the end."""

    def __init__(
        self,
        *,
        files: ArtifactFiles,
        sink: ArtifactSink | None,
        publisher: Publisher | None,
        key_prefix: str,
        flush_s: float,
        clock: Clock,
        console_logs: Callable[[], Sequence[Path]],
    ) -> None:
        self._outbox = _Outbox(files, sink, key_prefix, clock, publisher)
        self._records = _Records(self._outbox)
        self._segments = _Segments(self._outbox, console_logs)
        self._flush_s = flush_s
        self._wake = threading.Condition()
        self._record_due = False
        self._closing = False
        self._thread: threading.Thread | None = None

    def begin(self, provisional: Artifact) -> None:
        """Written here, then uploaded now: the trainer has not started yet. A failure to write
        locally is the caller's (OSError: an unusable directory); an upload failure is kept."""
        self._records.write(provisional)
        self._records.upload()

    def follow(self, samples: SampleLog) -> None:
        """Start flushing the samples (and the console) every flush_s."""
        self._segments.samples = samples
        if self._outbox.sink is None:
            return
        self._thread = threading.Thread(target=self._run, name="soak-evidence", daemon=True)
        self._thread.start()

    def stopping(self, classification: Classification, reason: str) -> None:
        """A stop from outside has begun: the record says so here at once, and in the store as
        soon as the worker can send it, then the evidence up to now."""
        if not self._records.stopping(classification, reason):
            return
        if self._thread is None:  # no worker (no store, or monitoring not begun): send it now
            self._records.upload()
            return
        with self._wake:
            self._record_due = True
            self._wake.notify()

    def close(self) -> UploadInfo:
        """Stop the worker; the segments sent so far and the first upload that failed (later
        flushes try again; the final upload sends it all): the final artifact's upload record."""
        with self._wake:
            self._closing = True
            self._wake.notify()
        thread = self._thread
        if thread is not None:
            thread.join(CLOSE_WAIT_S)
            if thread.is_alive():
                self._outbox.note(f"an upload was still running after {CLOSE_WAIT_S:g}s at the end")
                return UploadInfo(segments_error=self._outbox.error)
        return UploadInfo(segments=list(self._segments.sent), segments_error=self._outbox.error)

    def _run(self) -> None:
        clock = self._outbox.clock
        next_flush = clock.monotonic() + self._flush_s
        while True:
            with self._wake:
                while not (self._closing or self._record_due):
                    left = next_flush - clock.monotonic()
                    if left <= 0:
                        break
                    self._wake.wait(left)
                closing, record_due = self._closing, self._record_due
                self._record_due = False
            if record_due:
                self._records.upload()
            if closing:
                return
            self._segments.flush()
            next_flush = clock.monotonic() + self._flush_s
