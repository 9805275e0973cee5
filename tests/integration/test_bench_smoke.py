"""Every benchmark under bench/ runs end to end with ``--smoke`` (tiny sizes, seconds), so none rots.

The benchmarks are found at collection, so a new one without ``--smoke`` fails here. Nothing is
asserted about time: a smoke run only has to finish and print its figures.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.components import require
from tests.fixtures.processes import Spawner

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
# The project's markers for what a benchmark starts, so `-m "not trainers"` leaves it out too.
MARKS = {
    "real_trainers": [pytest.mark.trainers],
    "upload": [pytest.mark.s3],
    "evidence_segments": [pytest.mark.s3],
    "scale": [pytest.mark.s3],
    "apiserver": [pytest.mark.s3, pytest.mark.kube, pytest.mark.needs_root],
    "gpu_device_check": [pytest.mark.trainers],
    "kit_step_cost": [pytest.mark.trainers],
}
BENCHMARKS = [
    pytest.param(path, id=path.stem, marks=MARKS.get(path.stem, []))
    for path in sorted((REPO / "bench").glob("*.py"))
    if not path.name.startswith("_")  # a helper the benchmarks share, not one of them
]


def needs(name: str) -> list[str]:
    """The arguments that hand a benchmark the external component it needs, found through the one
    rule (``require``: a skip with an install hint here, a failure in CI)."""
    if name == "sampler":
        return ["--seed", str(require("seed-sampler"))]
    if name in ("real_trainers", "kit_step_cost"):
        return ["--python", str(require("trainer-venv"))]
    if name == "gpu_device_check":
        require("gcc")  # the mock NVML the check runs on in CI is built with it
        return ["--python", str(require("trainer-venv"))]
    if name == "apiserver":
        require("pidns")  # the attempts run in emulated pods (unshare)
        require("kube-binaries")
        require("weed")
    if name in ("upload", "evidence_segments", "scale"):
        require("weed")  # run_seaweedfs finds the same one: SOAK_WEED_BIN, beside the interpreter, PATH
    if name == "gpu":
        require("gcc")  # build_mock_library compiles the mock NVML with the gcc on PATH
    return []


@pytest.mark.parametrize("script", BENCHMARKS)
def test_benchmark_runs_with_smoke(script: Path, spawn: Spawner) -> None:
    argv = [sys.executable, str(script.relative_to(REPO)), "--smoke", *needs(script.stem)]
    # spawn reaps the benchmark and everything it started at teardown, after a timeout too.
    proc = spawn(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = (stream.decode(errors="replace") for stream in proc.communicate(timeout=TIMEOUT_S))
    assert proc.returncode == 0, f"{' '.join(argv)} exited {proc.returncode}:\n{out[-3000:]}\n{err[-3000:]}"
    assert any(char.isdigit() for char in out), f"{script.name} --smoke printed no figures:\n{out}"
