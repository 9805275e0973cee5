"""Durable writes: a reader sees the old or the new file, never a part, and no temp file stays."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.adapters.fsutil import fsync_dir, write_atomic, write_fsync


def test_write_atomic_replaces_the_file_and_leaves_nothing_behind(tmp_path: Path) -> None:
    target = tmp_path / "artifact.json"
    write_atomic(target, b"old")
    write_atomic(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["artifact.json"]


def test_a_failed_write_atomic_keeps_the_old_file_and_removes_its_temp(tmp_path: Path) -> None:
    target = tmp_path / "artifact.json"
    write_atomic(target, b"old")
    (tmp_path / "in-the-way").mkdir()
    with pytest.raises(OSError):
        write_atomic(tmp_path / "in-the-way", b"new")  # a rename cannot replace a directory
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["artifact.json", "in-the-way"]


def test_write_fsync_writes_everything(tmp_path: Path) -> None:
    data = os.urandom(1 << 20)
    fd = os.open(tmp_path / "blob", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        write_fsync(fd, data)
    finally:
        os.close(fd)
    assert (tmp_path / "blob").read_bytes() == data
    fsync_dir(tmp_path)
