"""What the user sees while a soak runs: a status line under the trainer's output, or JSON lines."""

from __future__ import annotations

import shutil
import threading
from typing import IO, Literal

from sidecar.core.samples import Sample
from sidecar.core.status import status_json, status_line

StatusMode = Literal["auto", "tty", "json", "off"]


class TerminalStatus:
    """A status line kept at the bottom of a terminal, with the trainer's output scrolling above.

    Local mode pipes the launcher's output through here; writes from the sampling loop and the
    output reader are serialised so neither clobbers the other.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._status = ""
        self._lock = threading.Lock()
        self._pumps: list[threading.Thread] = []

    def status(self, line: str) -> None:
        with self._lock:
            self._status = line
            self._stream.write("\r\x1b[2K" + line)
            self._stream.flush()

    def output(self, line: str) -> None:
        with self._lock:
            self._stream.write("\r\x1b[2K" + line.rstrip("\n") + "\n" + self._status)
            self._stream.flush()

    def pump(self, source: IO[bytes]) -> threading.Thread:
        """Copy ``source`` line by line above the status line, on a daemon thread, until EOF."""

        def copy() -> None:
            for raw in iter(source.readline, b""):
                self.output(raw.decode("utf-8", errors="replace"))
            source.close()

        thread = threading.Thread(target=copy, name="soak-console", daemon=True)
        thread.start()
        self._pumps.append(thread)
        return thread

    def close(self) -> None:
        for thread in self._pumps:
            thread.join(timeout=2.0)  # the launcher has exited: the pipe is at EOF or soon
        with self._lock:
            if self._status:
                self._stream.write("\n")
                self._stream.flush()
            self._status = ""


class Console:
    """The run's status output as configured (monitor.status_line) on ``stream``."""

    def __init__(self, stream: IO[str] | None, mode: StatusMode) -> None:
        self._stream = None if mode == "off" else stream
        terminal = stream is not None and (mode == "tty" or (mode == "auto" and stream.isatty()))
        self.terminal = TerminalStatus(stream) if terminal and stream is not None else None

    def report(
        self,
        sample: Sample,
        *,
        budget_left_s: float,
        progress_age_s: float | None,
        eta_s: float | None = None,
    ) -> None:
        figures = {"budget_left_s": budget_left_s, "progress_age_s": progress_age_s, "eta_s": eta_s}
        if self.terminal is not None:
            width = shutil.get_terminal_size().columns
            self.terminal.status(status_line(sample, **figures, width=width))
        elif self._stream is not None:
            self._stream.write(status_json(sample, **figures) + "\n")
            self._stream.flush()

    def close(self) -> None:
        if self.terminal is not None:
            self.terminal.close()
