"""No wall clock can stretch the budget across attempts: the real CLI, the real launcher and the file
store, with the wall clock moved by the LD_PRELOAD shim (tests/clockshim) on this same boot; and the
S3 store's clock for an attempt on another boot (the kernel's boot id bind-mounted over in a mount
namespace), where CLOCK_BOOTTIME no longer applies."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.fixtures.s3 import REGION, SeaweedServer

pytestmark = pytest.mark.integration

RUN_ID = "6d1f3a52-2f0e-4c59-9d3e-2b1f0c1d2e3f"


def attempt(
    tmp_path: Path,
    clockshim: Path,
    offset_s: float,
    *,
    env: dict[str, str] | None = None,
    boot_id: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """One attempt of the same run, its wall clock (and its launcher's and trainer's) moved; with
    ``boot_id``, as if on another boot."""
    env = {**os.environ, **(env or {}), "LD_PRELOAD": str(clockshim), "CLOCKSHIM_OFFSET_S": repr(offset_s)}
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--run-id", RUN_ID, "--budget", "600",
        "--checkpoint-margin", "10", "--sample-interval", "0.2", "--post-shutdown-grace", "0.2",
        "--gpu-backend", "none", "--status", "off",
        "--", sys.executable, "-m", "sidecar.examples.trainer", "--steps", "3", "--step-s", "0.05",
    ]  # fmt: skip
    if boot_id is not None:
        fake = tmp_path / "boot_id"
        fake.write_text(boot_id + "\n", encoding="utf-8")
        remount = 'mount --bind "$0" /proc/sys/kernel/random/boot_id && exec "$@"'
        argv = ["unshare", "--mount", "sh", "-c", remount, str(fake), *argv]
    return subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def artifacts(tmp_path: Path) -> list[dict[str, object]]:
    found = sorted((tmp_path / "soak-output" / "runs").glob("*/*/artifact.json"), key=os.path.getmtime)
    return [json.loads(path.read_text(encoding="utf-8")) for path in found]


def test_a_wall_clock_set_back_before_a_resume_is_refused_with_the_figures(
    tmp_path: Path, clockshim: Path
) -> None:
    first = attempt(tmp_path, clockshim, 0.0)
    assert first.returncode == 0, first.stderr
    back = attempt(tmp_path, clockshim, -3600.0)
    assert back.returncode == 15, back.stderr
    assert "the wall clock was set back" in back.stderr
    assert "CLOCK_BOOTTIME on the same boot says" in back.stderr
    record = json.loads((tmp_path / "soak-output" / "deadlines" / f"{RUN_ID}.json").read_text())
    assert record["boot"]["id"] and record["boot"]["boottime_s"] > 0


def test_a_wall_clock_jumped_past_the_deadline_is_expired_not_a_new_budget(
    tmp_path: Path, clockshim: Path
) -> None:
    assert attempt(tmp_path, clockshim, 0.0).returncode == 0
    ahead = attempt(tmp_path, clockshim, 10_000.0)
    assert ahead.returncode == 18, ahead.stderr  # insufficient_budget: the deadline passed
    assert "original job deadline expired" in ahead.stderr


def test_a_wall_clock_slightly_behind_never_yields_more_than_the_record_allows(
    tmp_path: Path, clockshim: Path
) -> None:
    assert attempt(tmp_path, clockshim, 0.0).returncode == 0
    behind = attempt(tmp_path, clockshim, -30.0)  # within the 60 s tolerance: runs, on the least
    assert behind.returncode == 0, behind.stderr
    deadline = artifacts(tmp_path)[-1]["deadline"]
    assert isinstance(deadline, dict)
    # The wall clock alone would say 600 s less the time since the record, plus 30 s: over 600 s.
    assert float(deadline["remaining_at_start_s"]) < 600


@pytest.mark.needs_root
def test_a_node_behind_the_s3_servers_clock_cannot_gain_time_on_another_boot(
    tmp_path: Path, clockshim: Path, seaweedfs: SeaweedServer, s3_prefix: str
) -> None:
    env = {
        "SOAK_DEADLINE__STORE": "s3",
        "SOAK_S3__BUCKET": seaweedfs.bucket,
        "SOAK_S3__ENDPOINT_URL": seaweedfs.endpoint,
        "SOAK_S3__REGION": REGION,
        "SOAK_S3__ADDRESSING_STYLE": "path",
        "SOAK_S3__DEADLINE_PREFIX": f"{s3_prefix}deadlines",
        "AWS_ACCESS_KEY_ID": seaweedfs.access_key,
        "AWS_SECRET_ACCESS_KEY": seaweedfs.secret_key,
    }
    first = attempt(tmp_path, clockshim, 0.0, env=env)
    assert first.returncode == 0, first.stderr
    # Ten minutes behind: past the 60 s tolerance, inside S3's 15-minute request-signature window.
    behind = attempt(tmp_path, clockshim, -600.0, env=env, boot_id=str(uuid.uuid4()))
    assert behind.returncode == 15, behind.stderr
    assert "the deadline store's clock (S3 LastModified) says" in behind.stderr
    assert "CLOCK_BOOTTIME" not in behind.stderr  # another boot: only the server's clock caught it
