"""The artifact directory copies what the trainer could have planted in the run dir safely."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sidecar.adapters import artifact_dir
from sidecar.adapters.artifact_dir import ArtifactDir

pytestmark = pytest.mark.integration


def test_console_logs_are_copied_only_when_they_are_regular_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "console.log").symlink_to("/proc/self/environ")  # the sidecar's own environment
    os.mkfifo(run_dir / "console.log.1")  # no writer: a blocking open would hang
    (run_dir / "big.log").write_bytes(b"x" * 100)
    monkeypatch.setattr(artifact_dir, "COPY_LIMIT_BYTES", 10)
    files = ArtifactDir(tmp_path / "out")
    kept = files.keep_copies([run_dir / "console.log", run_dir / "console.log.1", run_dir / "big.log"])
    assert [path.name for path in kept] == ["big.log"]
    assert (tmp_path / "out" / "big.log").read_bytes() == b"x" * 10  # capped
    assert not (tmp_path / "out" / "console.log").exists()
