"""The mock library itself, as pynvml sees it; and the two ways a process can load it.

In-process tests preload the mock (as backend ``mock`` does); the subprocess tests start fresh
interpreters so that pynvml's own dlopen runs: without the library, and through LD_LIBRARY_PATH.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from sidecar.adapters.nvml import load_mock_library
from sidecar.nvml_mock.build import LIBRARY_NAME, build_mock_library
from sidecar.nvml_mock.scenario import Scenario, compile_scenario
from tests.fixtures.nvml import UUID0, UUID1

pytestmark = pytest.mark.integration

REPO = Path(__file__).parents[2]

SCENARIO: dict[str, Any] = {
    "driver_version": "535.129.03",
    "time_unit": "samples",
    "devices": [
        {
            "uuid": UUID0,
            "memory_total_mib": 1024,
            "memory_reserved_mib": 24,
            "memory_used_mib": 100,
            "ecc_uncorrected": 3,
            "retired_pages_sbe": 2,
            "retired_pages_dbe": 1,
            "processes": [
                {"pid": 101, "used_memory_mib": 10},
                {"pid": 102, "used_memory_mib": 20},
                {"pid": 103, "used_memory_mib": 30, "kind": "graphics"},
            ],
        },
        {"uuid": UUID1, "memory_total_mib": 2048, "memory_used_mib": 5000},
    ],
}


@pytest.fixture
def nvml(nvml_mock_dir: Path, tmp_path: Path) -> Iterator[Any]:
    """pynvml initialised on the mock with SCENARIO; shut down afterwards."""
    library = load_mock_library(nvml_mock_dir / LIBRARY_NAME)
    flat = compile_scenario(Scenario.model_validate(SCENARIO), tmp_path)
    library.soak_nvml_mock_set_scenario(str(flat).encode())
    try:
        pynvml.nvmlInit()
    finally:
        library.soak_nvml_mock_set_scenario(None)
    yield pynvml
    pynvml.nvmlShutdown()


def test_identity_and_handles(nvml: Any) -> None:
    assert nvml.nvmlSystemGetDriverVersion() == "535.129.03"
    assert nvml.nvmlDeviceGetCount() == 2
    handle = nvml.nvmlDeviceGetHandleByIndex(1)
    assert nvml.nvmlDeviceGetUUID(handle) == UUID1
    by_uuid = nvml.nvmlDeviceGetHandleByUUID(UUID1)
    assert nvml.nvmlDeviceGetUUID(by_uuid) == UUID1
    with pytest.raises(nvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetHandleByUUID("GPU-00000000-dead")
    with pytest.raises(nvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(2)
    assert nvml.nvmlErrorString(nvml.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"


def test_memory_structs_and_their_version_check(nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    v2 = nvml.nvmlDeviceGetMemoryInfo(handle, version=nvml.nvmlMemory_v2)
    mib = 1 << 20
    assert (v2.total, v2.reserved, v2.used) == (1024 * mib, 24 * mib, 100 * mib)
    assert v2.free == v2.total - v2.reserved - v2.used
    v1 = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert (v1.used, v1.free) == (124 * mib, 900 * mib)
    with pytest.raises(nvml.NVMLError_ArgumentVersionMismatch):
        nvml.nvmlDeviceGetMemoryInfo(handle, version=0x01000028)
    # Used memory is clamped to what the device has.
    big = nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetHandleByIndex(1), version=nvml.nvmlMemory_v2)
    assert big.used == big.total


def test_process_lists_ecc_and_retired_pages(nvml: Any) -> None:
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    compute = nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle)
    assert [(p.pid, p.usedGpuMemory >> 20) for p in compute] == [(101, 10), (102, 20)]
    assert compute[0].gpuInstanceId == 0xFFFFFFFF
    graphics = nvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
    assert [(p.pid, p.usedGpuMemory >> 20) for p in graphics] == [(103, 30)]
    assert nvml.nvmlDeviceGetComputeRunningProcesses_v2(nvml.nvmlDeviceGetHandleByIndex(1)) == []
    assert (
        nvml.nvmlDeviceGetTotalEccErrors(
            handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
        )
        == 3
    )
    assert (
        len(
            nvml.nvmlDeviceGetRetiredPages(
                handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
            )
        )
        == 2
    )
    assert (
        len(nvml.nvmlDeviceGetRetiredPages_v2(handle, nvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR))
        == 1
    )


def test_a_second_scenario_is_refused_while_the_first_is_in_use(
    nvml: Any, tmp_path: Path, nvml_mock_dir: Path
) -> None:
    library = load_mock_library(nvml_mock_dir / LIBRARY_NAME)
    other = compile_scenario(Scenario.model_validate({"devices": []}), tmp_path / "other")
    library.soak_nvml_mock_set_scenario(str(other).encode())
    try:
        with pytest.raises(nvml.NVMLError_InUse):
            nvml.nvmlInit()
    finally:
        library.soak_nvml_mock_set_scenario(None)
    assert nvml.nvmlDeviceGetCount() == 2


def test_a_malformed_scenario_file_fails_init(nvml_mock_dir: Path, tmp_path: Path) -> None:
    library = load_mock_library(nvml_mock_dir / LIBRARY_NAME)
    flat = tmp_path / "broken.nvmlmock"
    flat.write_text("format=soak-nvml-mock/1\ndevice_count=1\nd0.bogus=1\n", encoding="utf-8")
    library.soak_nvml_mock_set_scenario(str(flat).encode())
    try:
        with pytest.raises(pynvml.NVMLError_Unknown):
            pynvml.nvmlInit()
    finally:
        library.soak_nvml_mock_set_scenario(None)


def test_build_is_repeatable_and_replaces_atomically(tmp_path: Path) -> None:
    first = build_mock_library(tmp_path)
    inode = first.stat().st_ino
    second = build_mock_library(tmp_path)
    assert first == second == tmp_path / LIBRARY_NAME
    assert second.stat().st_ino != inode
    assert second.stat().st_mode & 0o555 == 0o555
    assert sorted(p.name for p in tmp_path.iterdir()) == [LIBRARY_NAME]


def _run_python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in {"LD_LIBRARY_PATH", "SOAK_NVML_MOCK_SCENARIO"}}


SAMPLE_AUTO = """
    import json, sys
    from sidecar.adapters.nvml import open_gpu_backend
    from sidecar.core.errors import GpuUnavailableError
    from sidecar.settings import GpuSettings
    backend = open_gpu_backend(GpuSettings(backend=sys.argv[1] if len(sys.argv) > 1 else "auto"), None)
    print(backend.sample(set(), 0.0).model_dump_json())
    try:
        open_gpu_backend(GpuSettings(backend="auto", require=True), None)
    except GpuUnavailableError as exc:
        print("REQUIRED:", exc)
"""


def test_library_absent_is_no_gpu_data_with_the_reason() -> None:
    if ctypes.util.find_library("nvidia-ml"):
        pytest.skip("a real libnvidia-ml is installed here")
    premise = _run_python(
        """
        import pynvml
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as exc:
            print("value", exc.value)
        """,
        _clean_env(),
    )
    assert premise.stdout.strip() == "value 12", premise.stderr
    result = _run_python(SAMPLE_AUTO, _clean_env())
    assert result.returncode == 0, result.stderr
    sample_line, required_line = result.stdout.strip().splitlines()
    sample = json.loads(sample_line)
    assert sample["available"] is False
    assert sample["reason"] == "NVML unavailable: NVML Shared Library Not Found (NVML error 12)"
    assert required_line.startswith("REQUIRED: NVML unavailable: NVML Shared Library Not Found")


def test_ld_library_path_route_runs_pynvml_own_loader(nvml_mock_dir: Path, tmp_path: Path) -> None:
    """What the kind image does: no preload, pynvml's dlopen finds the mock on LD_LIBRARY_PATH."""
    flat = compile_scenario(Scenario.model_validate(SCENARIO), tmp_path)
    env = _clean_env() | {"LD_LIBRARY_PATH": str(nvml_mock_dir), "SOAK_NVML_MOCK_SCENARIO": str(flat)}
    result = _run_python(
        """
        import pynvml
        from sidecar.adapters.nvml import open_gpu_backend
        from sidecar.settings import GpuSettings
        backend = open_gpu_backend(GpuSettings(backend="nvml"), {"NVIDIA_VISIBLE_DEVICES": "1"})
        print(pynvml.nvmlLib._name, hasattr(pynvml.nvmlLib, "soak_nvml_mock_version"))
        print(backend.sample(set(), 0.0).model_dump_json())
        """,
        env,
    )
    assert result.returncode == 0, result.stderr
    loaded, sample_line = result.stdout.strip().splitlines()
    assert loaded == "libnvidia-ml.so.1 True"
    sample = json.loads(sample_line)
    assert sample["available"] is True
    assert [d["uuid"] for d in sample["devices"]] == [UUID1]


QUERY_BY_COMMAND_LINE = """
    import json, subprocess, sys, pynvml
    mark = sys.argv[1]
    wait = "import sys; sys.stdin.read()"
    own = subprocess.Popen([sys.executable, "-c", wait, mark], stdin=subprocess.PIPE)
    try:
        pynvml.nvmlInit()
        seen = pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0))
        print(json.dumps({"own": own.pid, "seen": [p.pid for p in seen]}))
    finally:
        own.communicate()
"""


def test_a_command_line_placeholder_finds_the_callers_own_process_first(
    nvml_mock_dir: Path, tmp_path: Path
) -> None:
    """Two runs on one host (parallel tests, two local soaks): each mock GPU shows its own
    trainer, not the other run's, though the other's PID is lower."""
    mark = f"soak-mock-mark-{os.getpid()}"
    scenario = {
        "time_unit": "samples",
        "devices": [{"uuid": UUID0, "processes": [{"pid": f"~{mark}", "used_memory_mib": 10}]}],
    }
    flat = compile_scenario(Scenario.model_validate(scenario), tmp_path)
    env = _clean_env() | {"LD_LIBRARY_PATH": str(nvml_mock_dir), "SOAK_NVML_MOCK_SCENARIO": str(flat)}
    other_run = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", mark], stdin=subprocess.PIPE
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(QUERY_BY_COMMAND_LINE), mark],
            env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        other_run.communicate()
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert other_run.pid < found["own"] and found["seen"] == [found["own"]]
