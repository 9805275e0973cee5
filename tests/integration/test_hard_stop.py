"""A sidecar SIGKILLed mid-run (docker stop's second signal, a CI runner's timeout, the OOM killer):
every sample it took is still on disk, readable, though the gzip stream was never closed, beside
the provisional artifact; and the launcher, its owner gone, ends the trainer. (With a bucket:
tests/integration/test_evidence_trail.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import psutil
import pytest

from tests.fixtures.processes import Spawner
from tests.integration.test_supervisor_rules import local_flags, trainer
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def samples_so_far(path: Path) -> list[dict[str, object]]:
    """The complete sample lines of a gzip stream that may lack its end (read as ``zcat`` would)."""
    if not path.is_file():
        return []
    text = zlib.decompressobj(wbits=31).decompress(path.read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


@pytest.mark.parametrize("after_samples", [1, 7])
def test_every_sample_taken_before_a_sigkill_is_on_disk(
    tmp_path: Path, spawn: Spawner, after_samples: int
) -> None:
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", *local_flags(tmp_path),
        "--", *trainer(tmp_path / "progress", steps=600, step_s=0.1),
    ]  # fmt: skip
    proc = spawn(argv, env=os.environ.copy(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until("the launcher", (tmp_path / "run" / "launcher.json").exists, 60)
    launcher = psutil.Process(json.loads((tmp_path / "run" / "launcher.json").read_text())["pid"])
    samples = tmp_path / "out" / "runs"
    found: list[Path] = []

    def taken() -> int:
        found[:] = list(samples.glob("*/attempt-1/samples.jsonl.gz"))
        return len(samples_so_far(found[0])) if found else 0

    wait_until(f"{after_samples} samples on disk", lambda: taken() >= after_samples, 60)
    seen = taken()
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    after = samples_so_far(found[0])
    assert len(after) >= seen >= after_samples
    assert all("process" in sample and "t_wall" in sample for sample in after)
    # The provisional artifact, without a verdict; and the trainer did not outlive its supervisor.
    (provisional,) = samples.glob("*/attempt-1/artifact.json")
    document = json.loads(provisional.read_text())
    assert document["status"] == "running" and document["exit_code"] is None
    wait_until(
        "the launcher, its owner gone, ends",
        lambda: not launcher.is_running() or launcher.status() == psutil.STATUS_ZOMBIE,
        30,
    )
