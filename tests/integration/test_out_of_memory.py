"""A trainer the kernel's OOM killer kills at its cgroup's limit: a real local soak in a real
memory cgroup, classified out_of_memory (exit 20) with the limit, the victim and the peak RSS."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.launcher.memory import find_memory_cgroup
from tests.cgroups import join, memory_limited

pytestmark = pytest.mark.integration

LIMIT = 256 * 2**20
GROWS = "import time\nx = []\nwhile True:\n    x.append(bytearray(8 * 2**20)); time.sleep(0.02)\n"
FAST = ["--sample-interval", "0.1", "--post-shutdown-grace", "0.1", "--gpu-backend", "none"]


def soak(
    tmp_path: Path, trainer: list[str], procs: Path
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    script = shutil.which("soak-sidecar")
    argv = [script] if script else [sys.executable, "-m", "sidecar.cli"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    done = subprocess.run(
        [*argv, "run", "--local", *FAST, "--", *trainer],
        cwd=tmp_path,
        env=clean,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        preexec_fn=lambda: join(procs),
    )
    (found,) = tmp_path.glob("soak-output/runs/*/attempt-1/artifact.json")
    return done, json.loads(found.read_text())


def test_a_trainer_killed_at_its_memory_limit_is_out_of_memory(tmp_path: Path) -> None:
    with memory_limited(LIMIT) as procs:
        done, artifact = soak(tmp_path, [sys.executable, "-c", GROWS], procs)
    assert done.returncode == 20, done.stderr
    assert artifact["failure_classification"] == "out_of_memory"
    reason = artifact["failure_reason"]
    assert reason.startswith("out of memory: the kernel's OOM killer killed the trainer (pid "), reason
    assert "at its memory limit of 256.0 MiB; peak RSS sampled " in reason
    memory = artifact["post_shutdown"]["launcher_exit"]["memory"]
    assert memory["limit_bytes"] == LIMIT and memory["oom_kills_at_end"] > memory["oom_kills_at_start"]
    assert "[out_of_memory]" in done.stderr


def test_a_worker_killed_and_survived_is_recorded_not_failed(tmp_path: Path) -> None:
    """A child the OOM killer takes while the trainer itself finishes well: counted, no failure."""
    child = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {GROWS!r}])"
    trainer = [sys.executable, "-m", "sidecar.examples.trainer", "--steps", "3", "--step-s", "0.1"]
    wrapper = f"{child}\nimport os; os.execvp({trainer[0]!r}, {trainer!r})"
    with memory_limited(LIMIT) as procs:
        done, artifact = soak(tmp_path, [sys.executable, "-c", wrapper], procs)
    assert done.returncode == 0, done.stderr
    memory = artifact["post_shutdown"]["launcher_exit"]["memory"]
    assert memory["oom_kills_at_end"] - memory["oom_kills_at_start"] == 1
    assert memory["oom_killed"] == []  # its parent reaped it, not the launcher


def test_the_launcher_finds_the_cgroup_it_runs_in(tmp_path: Path) -> None:
    with memory_limited(LIMIT) as procs:
        probe = "from sidecar.launcher.memory import find_memory_cgroup as f; g = f(); "
        probe += "print(g.limit_bytes(), g.oom_kills())"
        done = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            check=True,
            preexec_fn=lambda: join(procs),
        )
    assert done.stdout.split() == [str(LIMIT), "0"]
    assert find_memory_cgroup() is not None  # and the test's own, unlimited one
