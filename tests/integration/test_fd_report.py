"""The launcher's fd report (fds.json) on this process's real fd table: exact counts every report,
classes re-read when the count changes and at least every FD_CLASSES_EVERY reports."""

from __future__ import annotations

import os

import pytest

from sidecar.launcher.fdreport import FD_CLASSES_EVERY, FdReporter

pytestmark = pytest.mark.integration


def table(reporter: FdReporter) -> dict[str, object]:
    (found,) = reporter.tables([os.getpid()])
    return found


def test_counts_are_exact_and_classes_follow_within_the_refresh_interval() -> None:
    reporter = FdReporter()
    pipes = [os.pipe() for _ in range(5)]
    try:
        first = table(reporter)
        pipe_count = first["fd_classes"]["pipe"]  # type: ignore[index]
        assert pipe_count >= 10
        extra = os.pipe()
        grown = table(reporter)  # the count changed: classes re-read at once
        assert grown["fd_count"] == first["fd_count"] + 2  # type: ignore[operator]
        assert grown["fd_classes"]["pipe"] == pipe_count + 2  # type: ignore[index]
        # Same count, other classes: two eventfds replace one pipe.
        os.close(extra[0])
        os.close(extra[1])
        swapped = [os.eventfd(0), os.eventfd(0)]
        seen = [table(reporter) for _ in range(FD_CLASSES_EVERY)]
        assert all(t["fd_count"] == grown["fd_count"] for t in seen)
        assert seen[-1]["fd_classes"]["eventfd"] >= 2  # type: ignore[index]
        assert seen[-1]["fd_classes"]["pipe"] == pipe_count  # type: ignore[index]
        for fd in swapped:
            os.close(fd)
    finally:
        for read_end, write_end in pipes:
            os.close(read_end)
            os.close(write_end)


def test_a_process_that_is_gone_is_left_out() -> None:
    assert FdReporter().tables([2**22 + 12345]) == []
