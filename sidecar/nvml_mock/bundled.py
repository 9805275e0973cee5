"""The scenarios bundled with the mock NVML (``--gpu-scenario NAME``): what each shows a user, the
settings its verdict needs (rules that fail only when opted in), and the exit code it gives with the
bundled example trainer. ``tests/integration/test_bundled_scenarios.py`` runs each and checks the code."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

DIRECTORY = Path(__file__).resolve().parent


@dataclass(frozen=True)
class BundledScenario:
    name: str
    shows: str
    exit_code: int
    settings: Mapping[str, str] = field(default_factory=dict)

    @property
    def path(self) -> Path:
        return DIRECTORY / f"{self.name}.json"


BUNDLED: tuple[BundledScenario, ...] = (
    BundledScenario("two_gpus_growing", "two H100s, the trainer's memory on GPU 0 growing slowly: passes", 0),
    BundledScenario(
        "old_driver_host_pids", "an A100 on a 525 driver without the v2 calls, power NOT_SUPPORTED: passes", 0
    ),
    BundledScenario("xid79_fallen_off_bus", "GPU 1 sends XID 79 (fallen off the bus) after 1 s", 150),
    BundledScenario("gpu_lost", "GPU 0 answers GPU_IS_LOST from 1 s on", 150),
    BundledScenario("reset_required", "GPU 1 answers RESET_REQUIRED from 1 s on", 150),
    BundledScenario(
        "hw_slowdown",
        "GPU 0 in hardware slowdown from 0.5 s on (reported; a fault with the setting)",
        150,
        {"SOAK_GPU__FAIL_ON_SLOWDOWN_S": "2"},
    ),
    BundledScenario(
        "gpu_memory_leak",
        "the trainer's memory on GPU 0 grows 1 GiB/s (reported; a leak with the setting)",
        13,
        {"SOAK_GPU__MAX_MEMORY_GROWTH_MIB": "1000"},
    ),
    BundledScenario(
        "correctable_errors_growing",
        "GPU 0's single-bit ECC errors and PCIe replays grow (reported; a fault with the setting)",
        150,
        {"SOAK_GPU__FAIL_ON_CORRECTABLE_GROWTH": "true", "SOAK_GPU__PROCESS_INTERVAL_S": "0.2"},
    ),
    BundledScenario(
        "gpu_left_dirty",
        "GPU 0 keeps 5 GiB in use after the trainer is gone (reported; a fault with the setting)",
        150,
        {"SOAK_GPU__FAIL_ON_DIRTY_GPU": "true"},
    ),
    BundledScenario(
        "gpu_needs_reset",
        "NVML's recovery action for GPU 0 is a GPU reset (reported; a fault with the setting)",
        150,
        {"SOAK_GPU__FAIL_ON_DIRTY_GPU": "true"},
    ),
    BundledScenario(
        "xid31_trainer_fault", "XID 31 (a page fault) caused by the trainer: never blames the GPU, passes", 0
    ),
)
