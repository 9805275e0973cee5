"""NVML time per sample with 8 mocked GPUs, through the real pynvml path; and what NVML events cost
a sample.

Prints, for one process: the backend's ``nvml_time_ms`` for a cheap sample (device metrics only)
and for a sample that also queries the process lists, and as a baseline measured in the same run,
the bare pynvml calls the backend makes per device (no model building, no error mapping).
Real GPUs answer slower than the mock; these figures bound the sidecar's own overhead.

Then the event thread under a storm (64 XID and ECC events per GPU within two seconds): the wall
time of whole samples taken meanwhile, against the same samples with no events (both measured in
this run); the difference is what events cost a sample (the target: never more than 10 ms).

    python bench/gpu.py [--samples N] [--smoke]

``--smoke``: 20 samples, a check that the benchmark still runs (figures only; the storm is unchanged).
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


EVENTS_PER_GPU = 64
STORM_S = 2.0


def scenario(*, storm: bool = False) -> Scenario:
    """8 GPUs; ``storm``: on the seconds clock, each emits EVENTS_PER_GPU events within STORM_S."""
    kinds = ("xid", "ecc_single_bit", "ecc_double_bit")
    return Scenario.model_validate(
        {
            "time_unit": "seconds" if storm else "samples",
            "devices": [
                {
                    "uuid": f"GPU-{i:08x}-0000-4000-8000-000000000000",
                    "memory_used_mib": [[0, 1000], [100000, 60000]],
                    "memory_reserved_mib": 512,
                    "processes": [
                        {"pid": 1000 + i, "used_memory_mib": 900},
                        {"pid": 2000 + i, "used_memory_mib": 90},
                    ],
                    "events": [
                        {"at": 0.1 + STORM_S * n / EVENTS_PER_GPU, "type": kinds[n % 3], "data": 31}
                        for n in range(EVENTS_PER_GPU if storm else 0)
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
        pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)


def summary(name: str, values_ms: list[float]) -> str:
    values = sorted(values_ms)
    p99 = values[min(len(values) - 1, int(len(values) * 0.99))]
    return (
        f"{name:<38} median {statistics.median(values):7.3f} ms   p99 {p99:7.3f} ms   "
        f"per GPU {statistics.median(values) / DEVICES * 1000:7.1f} us"
    )


def opened(scratch: Path, lib_dir: Path, *, storm: bool) -> NvmlGpuBackend:
    scenario_path = scratch / f"bench-{storm}.json"
    scenario_path.write_text(scenario(storm=storm).model_dump_json(by_alias=True), encoding="utf-8")
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
    return backend


def sample_walls_ms(backend: NvmlGpuBackend, seconds: float) -> tuple[list[float], int]:
    """Wall time of whole samples taken back to back for ``seconds``, and the events they carried."""
    walls: list[float] = []
    events = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        start = time.perf_counter()
        sample = backend.sample(set(), 0.5)
        walls.append((time.perf_counter() - start) * 1000.0)
        events += len(sample.events)
    return walls, events


def event_storm(scratch: Path, lib_dir: Path) -> None:
    results = {}
    for storm in (False, True):
        backend = opened(scratch, lib_dir, storm=storm)
        try:
            results[storm] = sample_walls_ms(backend, STORM_S + 0.5)
        finally:
            backend.close()
    (quiet, _), (stormy, received) = results[False], results[True]
    expected = DEVICES * EVENTS_PER_GPU
    print(f"event storm: {received}/{expected} events received within {STORM_S + 0.5:g} s")
    print(summary("sample wall time, no events (baseline)", quiet))
    print(summary("sample wall time, during the storm", stormy))
    worst = max(stormy) - statistics.median(quiet)
    print(
        f"events' cost to a sample: median {statistics.median(stormy) - statistics.median(quiet):+.3f} ms, "
        f"worst sample over the baseline median {worst:+.3f} ms (target < 10 ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: --samples 20")
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(samples=20)
        args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        lib_dir = scratch / "lib"
        build_mock_library(lib_dir)
        backend = opened(scratch, lib_dir, storm=False)
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
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        build_mock_library(scratch / "lib")
        event_storm(scratch, scratch / "lib")


if __name__ == "__main__":
    main()
