"""The terminal status line stays below the trainer's output instead of being clobbered by it."""

from __future__ import annotations

import io
import os

from sidecar.app.console import TerminalStatus

CLEAR = "\r\x1b[2K"


def screen(raw: str) -> list[str]:
    """What a terminal shows: each line's text after its last carriage-return-and-clear."""
    return [line.rsplit(CLEAR, 1)[-1] for line in raw.split("\n")]


def test_output_lines_scroll_above_the_status_line() -> None:
    stream = io.StringIO()
    terminal = TerminalStatus(stream)
    terminal.output("before any status\n")
    terminal.status("elapsed 0:01")
    terminal.output("step 1\n")
    terminal.output("step 2")
    terminal.status("elapsed 0:02")
    terminal.close()
    assert screen(stream.getvalue()) == ["before any status", "step 1", "step 2", "elapsed 0:02", ""]


def test_pump_copies_a_pipe_until_eof() -> None:
    stream = io.StringIO()
    terminal = TerminalStatus(stream)
    terminal.status("status")
    read_fd, write_fd = os.pipe()
    with os.fdopen(read_fd, "rb") as source:
        thread = terminal.pump(source)
        os.write(write_fd, b"line one\nline \xff two\n")
        os.close(write_fd)
        thread.join(timeout=10)
    assert not thread.is_alive()
    terminal.close()
    assert screen(stream.getvalue()) == ["line one", "line \ufffd two", "status", ""]
