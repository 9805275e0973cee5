"""Which checkpoint an attempt resumes from (--resume-checkpoint, --auto-resume), and where the run's
checkpoint record may live, with the real identity-file adapter on real paths."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from sidecar.adapters.identity_files import IdentityFileReader
from sidecar.app.preflight import check_checkpoint_location, resume_request
from sidecar.core.errors import ConfigError, RefusedError
from sidecar.settings import DeadlineSettings, Settings

FILES = IdentityFileReader()


def deadline(**values: object) -> DeadlineSettings:
    return DeadlineSettings.model_validate(values)


def test_a_named_checkpoint_is_asked_for_whether_or_not_it_exists(tmp_path: Path) -> None:
    named = deadline(resume_checkpoint=tmp_path / "ck.json")
    assert resume_request(named, FILES, starting=True) == str(tmp_path / "ck.json")


def test_auto_resume_asks_for_the_record_only_once_it_exists(tmp_path: Path) -> None:
    record = tmp_path / "volume" / "checkpoint.json"
    auto = deadline(checkpoint_path=record, auto_resume=True)
    assert resume_request(auto, FILES, starting=True) is None  # the first attempt starts afresh
    record.parent.mkdir()
    record.write_text('{"step": 3}', encoding="utf-8")
    assert resume_request(auto, FILES, starting=True) == str(record)
    assert resume_request(deadline(checkpoint_path=record), FILES, starting=True) is None  # not asked


def test_a_sidecar_restarted_beside_its_running_trainer_decides_no_resume(tmp_path: Path) -> None:
    """The record it finds is one the running trainer wrote since: this attempt did not resume."""
    record = tmp_path / "checkpoint.json"
    record.write_text('{"step": 3}', encoding="utf-8")
    auto = deadline(checkpoint_path=record, auto_resume=True)
    assert resume_request(auto, FILES, starting=False) is None


def test_a_record_that_is_a_folder_or_a_fifo_is_no_record(tmp_path: Path) -> None:
    record = tmp_path / "checkpoint.json"
    record.mkdir()
    assert resume_request(deadline(checkpoint_path=record, auto_resume=True), FILES, starting=True) is None
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert resume_request(deadline(checkpoint_path=fifo, auto_resume=True), FILES, starting=True) is None


def test_a_record_planted_as_a_symlink_loop_refuses_the_run(tmp_path: Path) -> None:
    record = tmp_path / "checkpoint.json"
    record.symlink_to(record)
    with pytest.raises(RefusedError, match="cannot resolve"):
        resume_request(deadline(checkpoint_path=record, auto_resume=True), FILES, starting=True)


def test_a_record_the_sidecar_may_not_check_refuses_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EACCES from a folder the trainer made unsearchable (root, which runs the tests, is never
    refused one: the error is raised where the kernel would raise it)."""

    def refused(self: Path) -> bool:
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(Path, "is_file", refused)
    auto = deadline(checkpoint_path=tmp_path / "checkpoint.json", auto_resume=True)
    with pytest.raises(RefusedError, match=r"cannot check .*Permission denied .*readable by the sidecar"):
        resume_request(auto, FILES, starting=True)


@pytest.mark.parametrize("folder", ["run", "deadlines"])
def test_the_record_may_not_live_in_a_folder_of_the_sidecars(tmp_path: Path, folder: str) -> None:
    settings = Settings.model_validate(
        {
            "deadline": {
                "checkpoint_path": tmp_path / folder / "ck.json",
                "store_dir": tmp_path / "deadlines",
            },
            "launcher": {"run_dir": tmp_path / "run"},
        }
    )
    with pytest.raises(ConfigError, match=r"is inside the (run dir|deadline store)"):
        check_checkpoint_location(settings, FILES)
    elsewhere = settings.model_copy(
        update={
            "deadline": settings.deadline.model_copy(update={"checkpoint_path": tmp_path / "ck" / "c.json"})
        }
    )
    check_checkpoint_location(elsewhere, FILES)
