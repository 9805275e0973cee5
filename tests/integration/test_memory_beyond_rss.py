"""Memory outside RSS: a trainer that holds memory in a memfd and a /dev/shm file (neither mapped, so
its RSS does not grow) and exits 0 with a valid run_summary, under the real CLI, launcher and cgroup.

The trainer fills its memory only once a steady sample (progress written) is on disk, and exits only
once two more samples were taken: a handshake through the samples file, not a timing."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.procfs.memory import CGROUP_ROOT
from tests.fixtures.processes import Spawner

pytestmark = pytest.mark.integration

MIB = 1 << 20
FILL_MIB = 64
FAST = {
    "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
    "SOAK_MONITOR__POST_SHUTDOWN_GRACE_S": "0.2",
    "SOAK_MONITOR__STATUS_LINE": "off",
    "SOAK_LAUNCHER__KILL_GRACE_S": "1",
}

# argv: the output dir, the /dev/shm file, MiB to hold in each of a memfd and that file.
TRAINER = textwrap.dedent(
    """
    import glob, json, os, sys, time, zlib
    from pathlib import Path
    from sidecar.examples.replay_summary import run_summary, write_atomic

    output, shm_path, mib = sys.argv[1], sys.argv[2], int(sys.argv[3])
    progress = Path(os.environ["SOAK_PROGRESS_DIR"])

    def steady_samples():
        paths = glob.glob(os.path.join(output, "runs", "*", "*", "samples.jsonl.gz"))
        if not paths:
            return 0
        with open(paths[0], "rb") as handle:  # a stream without its trailer yet: decompress what is there
            text = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(handle.read())
        lines = text.split(b"\\n")[:-1]
        return sum(1 for line in lines if json.loads(line)["progress"]["bytes_total"] > 0)

    def wait_for(count):
        end = time.monotonic() + 60
        while steady_samples() < count:
            if time.monotonic() > end:
                sys.exit(f"no sample {count} within 60 s")
            time.sleep(0.05)

    write_atomic(progress / "step.json", {"step": 1})
    wait_for(1)
    seen = steady_samples()
    chunk = b"\\1" * (1 << 20)
    memfd = os.memfd_create("held")
    with open(shm_path, "wb") as shm:
        for _ in range(mib):
            os.write(memfd, chunk)
            shm.write(chunk)
    write_atomic(progress / "step.json", {"step": 2, "pad": "x" * 64})
    wait_for(seen + 2)
    summary = run_summary(steps=2, completed=True, classification="normal_completion", error=None)
    write_atomic(progress / "run_summary.json", summary)
    """
)


def _v1_memory_cgroup() -> Path | None:
    """This process's cgroup v1 memory hierarchy folder, when it has one."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            return Path(CGROUP_ROOT) / "memory" / path.lstrip("/")
    return None


@contextlib.contextmanager
def _child_cgroup() -> Iterator[list[str]]:
    """The argv prefix that runs the sidecar in a memory cgroup of its own, removed afterwards: the
    test's own cgroup also holds the other tests (and CI's builds), whose memory comes and goes.
    Under cgroup v1 a child of this process's memory cgroup; under v2 a child of the root with the
    memory controller enabled (a v2 cgroup with processes may not have children that hold any)."""
    if os.geteuid() != 0:
        pytest.skip("making a memory cgroup for the sidecar needs root")
    v1 = _v1_memory_cgroup()
    if v1 is not None:
        parent = v1
    else:
        parent = Path(CGROUP_ROOT)
        if "memory" not in (parent / "cgroup.controllers").read_text().split():
            pytest.skip("the kernel's cgroup v2 has no memory controller")
        (parent / "cgroup.subtree_control").write_text("+memory")
    child = parent / f"soak-test-{uuid.uuid4().hex[:8]}"
    child.mkdir()
    try:
        yield ["sh", "-c", f'echo $$ > {child}/cgroup.procs && exec "$@"', "sh"]
    finally:
        with contextlib.suppress(OSError):
            child.rmdir()


@pytest.fixture
def shm_file() -> Iterator[Path]:
    path = Path("/dev/shm") / f"soak-test-{uuid.uuid4().hex}"
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def run_cli(spawn: Spawner, tmp: Path, shm: Path, *flags: str) -> tuple[int, dict[str, Any], str]:
    output = tmp / "soak-output"
    with _child_cgroup() as prefix:
        proc = spawn(
            [
                *prefix, sys.executable, "-m", "sidecar.cli", "run", "--local", *flags,
                "--", sys.executable, "-c", TRAINER, str(output), str(shm), str(FILL_MIB),
            ],
            cwd=tmp,
            env={**os.environ, **FAST},
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )  # fmt: skip
        _, err = proc.communicate(timeout=180)
    (path,) = (output / "runs").glob("*/*/artifact.json")
    return proc.returncode, json.loads(path.read_text(encoding="utf-8")), err.decode(errors="replace")


def test_memory_held_in_a_memfd_and_dev_shm_fails_the_cgroup_leak_limit(
    tmp_path: Path, spawn: Spawner, shm_file: Path
) -> None:
    """Locally the launcher's cgroup is the sidecar's own: judged when the limit is asked for."""
    code, found, err = run_cli(
        spawn, tmp_path, shm_file, "--max-rss-growth", "16", "--max-cgroup-memory-growth", "16"
    )
    summary = found["resource_summary"]
    assert code == 13, (err, found["failure_reason"])
    assert found["failure_classification"] == "resource_leak"
    # RSS did not see it: only the cgroup did.
    assert summary["rss_growth_kib"] < 16 * 1024, summary
    assert "process tree RSS grew" not in found["failure_reason"]
    assert "cgroup memory (anon+shmem)" in found["failure_reason"]
    assert summary["memory_cgroup"]["available"] is True, summary["memory_cgroup"]
    assert summary["cgroup_memory_growth_bytes"] >= 2 * FILL_MIB * MIB - 16 * MIB, summary
    # The /dev/shm file outlived the trainer: still charged, and named.
    assert summary["cgroup_memory_left_bytes"] > 16 * MIB, summary  # net of the trainer's own memory freed
    assert str(shm_file) in found["failure_reason"]
    (left,) = [f for f in found["post_shutdown"]["shm_left"]["files"] if f["path"] == str(shm_file)]
    assert left["bytes"] == FILL_MIB * MIB
    assert any(t["series"] == "cgroup memory (anon+shmem)" for t in summary["trends"]), summary["trends"]


def test_a_file_left_in_dev_shm_is_named_without_failing_a_soak_without_limits(
    tmp_path: Path, spawn: Spawner, shm_file: Path
) -> None:
    code, found, err = run_cli(spawn, tmp_path, shm_file)
    assert code == 0, (err, found["failure_reason"])
    assert found["resource_summary"]["cgroup_memory_growth_bytes"] > FILL_MIB * MIB
    names = [f["path"] for f in found["post_shutdown"]["shm_left"]["files"]]
    assert str(shm_file) in names
    assert str(shm_file) in err  # a passed soak has no reason text: the sidecar says it on stderr
