"""Durable writes: a reader sees the old or the new file, never a part, and no temp file stays;
nothing is written through a link."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import pytest

from sidecar.adapters.artifact_dir import ArtifactDir
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


def test_nothing_the_sidecar_writes_goes_through_a_planted_link(tmp_path: Path) -> None:
    """A trainer that can reach the attempt dir plants links at the names the sidecar writes: the
    artifact (and every temp name the old scheme used), the samples file, a console-log copy."""
    attempt, outside = tmp_path / "attempt-1", tmp_path / "outside"
    attempt.mkdir()
    outside.mkdir()
    victim = outside / "victim"
    victim.write_bytes(b"keep")
    for name in ("artifact.json", f".artifact.json.{os.getpid()}.tmp", "samples.jsonl.gz"):
        (attempt / name).symlink_to(victim)
    (attempt / "console.log").symlink_to(outside / "created-by-the-sidecar")  # dangling
    files = ArtifactDir(attempt)
    files.write("artifact.json", b"{}")
    samples = files.open_samples("samples.jsonl.gz")
    samples.write_line('{"t": 1}')
    samples.close()
    console = tmp_path / "run" / "console.log"
    console.parent.mkdir()
    console.write_bytes(b"step 1\n")
    assert files.keep_copies([console]) == [attempt / "console.log"]
    assert victim.read_bytes() == b"keep" and list(outside.iterdir()) == [victim]
    assert (attempt / "artifact.json").read_bytes() == b"{}"
    assert gzip.decompress((attempt / "samples.jsonl.gz").read_bytes()) == b'{"t": 1}\n'
    assert (attempt / "console.log").read_bytes() == b"step 1\n"
    assert samples.error is None
