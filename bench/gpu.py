"""NVML time per sample with 8 mocked GPUs, through the real pynvml path.

Prints, for one process: the backend's ``nvml_time_ms`` for a cheap sample (device metrics only)
and for a sample that also queries the process lists, and as a baseline measured in the same run,
the bare pynvml calls the backend makes per device (no model building, no error mapping).
Real GPUs answer slower than the mock; these figures bound the sidecar's own overhead.

    python bench/gpu.py [--samples N]
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import tempfile
import time
from pathlib import Path

import pynvml

from sidecar.adapters.nvml import NvmlGpuBackend
from sidecar.app.wiring import open_gpu
from sidecar.nvml_mock.build import build_mock_library
from sidecar.nvml_mock.scenario import Scenario
from sidecar.settings import GpuSettings

DEVICES = 8


def scenario() -> Scenario:
    return Scenario.model_validate(
        {
            "time_unit": "samples",
            "devices": [
                {
                    "uuid": f"GPU-{i:08x}-0000-4000-8000-000000000000",
                    "memory_used_mib": [[0, 1000], [100000, 60000]],
                    "memory_reserved_mib": 512,
                    "processes": [
                        {"pid": 1000 + i, "used_memory_mib": 900},
                        {"pid": 2000 + i, "used_memory_mib": 90},
                    ],
                }
                for i in range(DEVICES)
            ],
        }
    )


def bare_calls(handles: list[object]) -> None:
    """The per-device pynvml calls of one cheap sample, nothing else."""
    for h in handles:
        pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
        pynvml.nvmlDeviceGetUtilizationRates(h)
        pynvml.nvmlDeviceGetTemperatureV(h, pynvml.NVML_TEMPERATURE_GPU)
        pynvml.nvmlDeviceGetPowerUsage(h)
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
        pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)


def summary(name: str, values_ms: list[float]) -> str:
    values = sorted(values_ms)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return (
        f"{name:<38} median {statistics.median(values):7.3f} ms   p99 {p99:7.3f} ms   "
        f"per GPU {statistics.median(values) / DEVICES * 1000:7.1f} us"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        lib_dir = Path(scratch) / "lib"
        build_mock_library(lib_dir)
        scenario_path = Path(scratch) / "bench.json"
        scenario_path.write_text(scenario().model_dump_json(by_alias=True), encoding="utf-8")
        settings = GpuSettings.model_validate(
            {
                "backend": "mock",
                "mock_library_dir": lib_dir,
                "mock_scenario": scenario_path,
                "process_interval_s": 1.0,
            }
        )
        backend = open_gpu(settings, None)
        assert isinstance(backend, NvmlGpuBackend), backend.sample(set(), 0.0).reason
        try:
            tree = {1000 + i for i in range(DEVICES)}
            first = backend.sample(tree, 0.0)  # includes the process lists
            assert len(first.devices) == DEVICES and first.attribution == "pid"
            # Within the 1 s process interval: device metrics only.
            cheap = [backend.sample(tree, 0.5).nvml_time_ms for _ in range(args.samples)]
            # A full interval apart: every sample also queries process lists, ECC, retired pages.
            with_processes = [backend.sample(tree, 10.0 + n).nvml_time_ms for n in range(args.samples)]
            handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(DEVICES)]
            bare: list[float] = []
            for _ in range(args.samples):
                start = time.perf_counter()
                bare_calls(handles)
                bare.append((time.perf_counter() - start) * 1000.0)
        finally:
            backend.close()
    version = importlib.metadata.version("nvidia-ml-py")
    print(f"mock NVML, {DEVICES} GPUs, {args.samples} samples each, real pynvml (nvidia-ml-py {version})")
    print(summary("bare pynvml calls (baseline)", bare))
    print(summary("backend sample, device metrics", cheap))
    print(summary("backend sample, + process lists/ECC", with_processes))
    base = statistics.median(bare)
    print(f"ratio device-metrics sample / baseline: {statistics.median(cheap) / base:5.2f}x")
    print(f"ratio process-list sample / baseline:   {statistics.median(with_processes) / base:5.2f}x")


if __name__ == "__main__":
    main()
