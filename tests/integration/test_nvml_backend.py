"""NvmlGpuBackend through the real pynvml against the mock libnvidia-ml.so.1."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.nvml import NullGpuBackend, NvmlGpuBackend
from sidecar.core.errors import GpuUnavailableError
from tests.fixtures.nvml import UUID0, UUID1, MockBackendOpener
from tests.fixtures.processes import Spawner

pytestmark = pytest.mark.integration


def two_devices(**overrides: Any) -> dict[str, Any]:
    """Two GPUs on the samples clock: GPU 0 grows 100 MiB per sample from 1000, GPU 1 is flat."""
    dev0: dict[str, Any] = {
        "uuid": UUID0,
        "name": "NVIDIA H100 80GB HBM3",
        "memory_total_mib": 81559,
        "memory_reserved_mib": 512,
        "memory_used_mib": [[0, 1000], [10, 2000]],
        "utilization_gpu_pct": 87,
        "utilization_memory_pct": 41,
        "temperature_c": 61,
        "power_w": 412.5,
        "sm_clock_mhz": 1755,
        "mem_clock_mhz": 2619,
        "nvlink": [{}] * 18,  # SXM parts: 18 links, no errors
    }
    dev1: dict[str, Any] = {
        "uuid": UUID1,
        "name": "NVIDIA A100-SXM4-40GB",
        "memory_total_mib": 40960,
        "memory_used_mib": 2048,
        "nvlink": [{}] * 12,
    }
    scenario: dict[str, Any] = {"time_unit": "samples", "devices": [dev0, dev1]}
    for key, value in overrides.items():
        index, _, field = key.partition("__")
        if field:
            scenario["devices"][int(index[1:])][field] = value
        else:
            scenario[key] = value
    return scenario


def test_two_devices_and_memory_growth(mock_gpu_backend: MockBackendOpener) -> None:
    backend = mock_gpu_backend(two_devices())
    assert isinstance(backend, NvmlGpuBackend)
    assert [(d.index, d.uuid, d.name) for d in backend.devices()] == [
        (0, UUID0, "NVIDIA H100 80GB HBM3"),
        (1, UUID1, "NVIDIA A100-SXM4-40GB"),
    ]
    samples = [backend.sample(set(), float(t)) for t in range(3)]
    assert [s.devices[0].memory_used_mib for s in samples] == pytest.approx([1100, 1200, 1300])
    assert [s.devices[1].memory_used_mib for s in samples] == pytest.approx([2048, 2048, 2048])
    first = samples[0].devices[0]
    assert first.memory_total_mib == pytest.approx(81559)
    assert first.memory_reserved_mib == pytest.approx(512)
    assert (first.utilization_gpu_pct, first.utilization_memory_pct) == (87, 41)
    assert (first.temperature_c, first.power_w) == (61, 412.5)
    assert (first.sm_clock_mhz, first.mem_clock_mhz) == (1755, 2619)
    assert (first.ecc_uncorrected, first.retired_pages) == (0, 0)
    assert first.unavailable == [] and first.errors == {} and first.fault is None
    assert all(s.available and s.fault is None and s.nvml_time_ms > 0 for s in samples)
    assert samples[0].driver_version == "550.54.15"
    assert backend.devices()[1].memory_total_mib == pytest.approx(40960)
    # No processes reported: device figures stand in, and the sample says attribution is impossible.
    assert samples[0].attribution == "unavailable"
    assert samples[0].used_memory_mib_total == pytest.approx(1100 + 2048)


def test_process_list_attributed_to_the_real_trainer_pid(
    mock_gpu_backend: MockBackendOpener, spawn: Spawner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = spawn(["sleep", "60"])
    helper = spawn(["sleep", "60"])
    pid_file = tmp_path / "trainer.pid"
    pid_file.write_text(f"{trainer.pid}\n", encoding="utf-8")
    monkeypatch.setenv("SOAK_TEST_HELPER_PID", str(helper.pid))
    backend = mock_gpu_backend(
        two_devices(
            d0__processes=[
                {"pid": f"@{pid_file}", "used_memory_mib": 900},
                {"pid": 4_000_000, "used_memory_mib": 64},  # someone else's process
            ],
            d1__processes=[{"pid": "$SOAK_TEST_HELPER_PID", "used_memory_mib": 300, "kind": "graphics"}],
        )
    )
    sample = backend.sample({trainer.pid, helper.pid}, 0.0)
    assert sample.attribution == "pid"
    got = {(p.pid, p.device_uuid, p.kind, p.in_tree, p.used_memory_mib) for p in sample.processes}
    assert got == {
        (trainer.pid, UUID0, "compute", True, 900.0),
        (4_000_000, UUID0, "compute", False, 64.0),
        (helper.pid, UUID1, "graphics", True, 300.0),
    }
    assert sample.used_memory_mib_total == pytest.approx(1200.0)
    # The same list seen from a tree without those PIDs is not attributed to it.
    other = backend.sample({os.getpid()}, 100.0)
    assert other.attribution == "unavailable"
    assert other.used_memory_mib_total == pytest.approx(sum(d.memory_used_mib or 0 for d in other.devices))


def test_host_pids_from_an_old_driver_are_never_attributed(
    mock_gpu_backend: MockBackendOpener, spawn: Spawner
) -> None:
    trainer = spawn(["sleep", "60"])
    backend = mock_gpu_backend(
        two_devices(
            driver_version="525.85.12",
            missing_functions=["nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetTemperatureV"],
            d0__processes=[{"pid": 3_141_592, "used_memory_mib": 800}],
        )
    )
    sample = backend.sample({trainer.pid}, 0.0)
    assert sample.attribution == "unavailable"
    assert sample.reason is not None and "525.85.12 predates 535.113" in sample.reason
    assert [p.in_tree for p in sample.processes] == [False]
    dev0 = sample.devices[0]
    # v1 memory info: "used" includes the 512 MiB reservation, which is itself unavailable.
    assert dev0.memory_used_mib == pytest.approx(1100 + 512)
    assert dev0.memory_reserved_mib is None
    assert dev0.temperature_c == 61  # through the legacy call
    assert dev0.unavailable == ["memory_reserved", "temperature_v"]
    assert sample.used_memory_mib_total == pytest.approx(1100 + 512 + 2048)


def test_not_supported_metric_is_listed_and_the_rest_is_sampled(mock_gpu_backend: MockBackendOpener) -> None:
    backend = mock_gpu_backend(
        two_devices(d0__errors={"power": "NOT_SUPPORTED", "ecc": "FUNCTION_NOT_FOUND"})
    )
    for t in range(2):
        dev0 = backend.sample(set(), float(t)).devices[0]
        assert dev0.power_w is None and dev0.ecc_uncorrected is None and dev0.ecc_corrected is None
        assert dev0.unavailable == ["ecc", "ecc_corrected", "power"]  # one NVML call reads both ECC counts
        assert dev0.temperature_c == 61 and dev0.memory_used_mib is not None
        assert dev0.errors == {}


def test_other_errors_are_recorded_for_that_sample_only(mock_gpu_backend: MockBackendOpener) -> None:
    backend = mock_gpu_backend(
        two_devices(d0__errors={"utilization": {"code": "NO_PERMISSION", "from": 2, "until": 3}})
    )
    dev = [backend.sample(set(), float(t)).devices[0] for t in range(3)]
    assert [d.utilization_gpu_pct for d in dev] == [87, None, 87]
    assert "utilization" in dev[1].errors and "NVML error 4" in dev[1].errors["utilization"]
    assert dev[0].errors == {} and dev[2].errors == {} and dev[1].unavailable == []


@pytest.mark.parametrize(
    ("field", "text"), [("lost_at", "GPU is lost"), ("reset_required_at", "GPU requires a reset")]
)
def test_gpu_fault_mid_run(mock_gpu_backend: MockBackendOpener, field: str, text: str) -> None:
    backend = mock_gpu_backend(two_devices(**{f"d1__{field}": 3}))
    samples = [backend.sample(set(), float(t)) for t in range(5)]
    assert [s.fault for s in samples[:2]] == [None, None]
    for sample in samples[2:]:
        assert sample.available
        assert sample.fault == f"GPU 1 ({UUID1}): {text}"
        assert sample.devices[1].fault == text and sample.devices[1].memory_used_mib is None
        assert sample.devices[0].fault is None and sample.devices[0].memory_used_mib is not None
    assert backend.devices()[1].fault == text


def test_process_lists_on_the_slower_cadence(
    mock_gpu_backend: MockBackendOpener, spawn: Spawner, tmp_path: Path
) -> None:
    first, second = spawn(["sleep", "60"]), spawn(["sleep", "60"])
    pid_file = tmp_path / "pid"
    pid_file.write_text(str(first.pid), encoding="utf-8")
    backend = mock_gpu_backend(
        two_devices(d0__processes=[{"pid": f"@{pid_file}", "used_memory_mib": 10}]), process_interval_s=10.0
    )
    tree = {first.pid, second.pid}
    assert [p.pid for p in backend.sample(tree, 100.0).processes] == [first.pid]
    pid_file.write_text(str(second.pid), encoding="utf-8")
    held = backend.sample(tree, 105.0)
    assert [p.pid for p in held.processes] == [first.pid]  # not queried again yet
    assert held.processes_age_s == pytest.approx(5.0)
    fresh = backend.sample(tree, 110.0)
    assert [p.pid for p in fresh.processes] == [second.pid]
    assert fresh.processes_age_s == 0.0


@pytest.mark.parametrize(
    ("env", "uuids"),
    [
        ({"NVIDIA_VISIBLE_DEVICES": UUID1}, [UUID1]),
        ({"NVIDIA_VISIBLE_DEVICES": UUID1.lower() + "," + UUID0}, [UUID1, UUID0]),
        ({"NVIDIA_VISIBLE_DEVICES": "0"}, [UUID0]),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, [UUID0, UUID1]),
        ({}, [UUID0, UUID1]),
    ],
)
def test_device_selection_from_the_trainer_env(
    mock_gpu_backend: MockBackendOpener, env: dict[str, str], uuids: list[str]
) -> None:
    backend = mock_gpu_backend(two_devices(), trainer_env=env)
    assert [d.uuid for d in backend.devices()] == uuids
    assert [d.uuid for d in backend.sample(set(), 0.0).devices] == uuids


def test_explicit_devices_setting_and_partly_missing_ids(mock_gpu_backend: MockBackendOpener) -> None:
    backend = mock_gpu_backend(
        two_devices(), trainer_env={"NVIDIA_VISIBLE_DEVICES": "0"}, devices=["1", "GPU-gone-0000"]
    )
    assert [d.index for d in backend.devices()] == [1]
    reason = backend.sample(set(), 0.0).reason
    assert reason is not None and "GPU-gone-0000" in reason


@pytest.mark.parametrize("value", ["none", "void", "7", "GPU-ffffffff-0000-4000-8000-000000000000"])
def test_no_trainer_gpu_means_no_gpu_data(mock_gpu_backend: MockBackendOpener, value: str) -> None:
    backend = mock_gpu_backend(two_devices(), trainer_env={"NVIDIA_VISIBLE_DEVICES": value})
    assert isinstance(backend, NullGpuBackend)
    sample = backend.sample(set(), 0.0)
    assert not sample.available and sample.reason is not None and value in sample.reason
    with pytest.raises(GpuUnavailableError, match=value):
        mock_gpu_backend(two_devices(), trainer_env={"NVIDIA_VISIBLE_DEVICES": value}, require=True)


def test_driver_not_loaded_is_no_gpu_data_unless_required(mock_gpu_backend: MockBackendOpener) -> None:
    backend = mock_gpu_backend(two_devices(init_error="DRIVER_NOT_LOADED"))
    sample = backend.sample(set(), 0.0)
    assert not sample.available
    assert sample.reason == "NVML unavailable: Driver Not Loaded (NVML error 9)"
    with pytest.raises(GpuUnavailableError, match="Driver Not Loaded"):
        mock_gpu_backend(two_devices(init_error="DRIVER_NOT_LOADED"), require=True)


def test_closed_backend_reports_it(mock_gpu_backend: MockBackendOpener) -> None:
    backend = mock_gpu_backend(two_devices())
    backend.close()
    backend.close()
    assert backend.sample(set(), 0.0).reason == "GPU backend closed"


def test_cmdline_placeholder_finds_the_trainer_without_plumbing(
    mock_gpu_backend: MockBackendOpener, spawn: Spawner
) -> None:
    token = f"{3600 + os.getpid() % 1000}.{time.monotonic_ns() % 10_000}"
    trainer = spawn(["sleep", token])
    backend = mock_gpu_backend(
        two_devices(d0__processes=[{"pid": f"~sleep {token}", "used_memory_mib": 700}])
    )
    sample = backend.sample({trainer.pid}, 0.0)
    assert [(p.pid, p.in_tree) for p in sample.processes] == [(trainer.pid, True)]
    assert sample.attribution == "pid" and sample.used_memory_mib_total == pytest.approx(700)


def test_a_gpu_lost_before_open_is_reported_as_faulted(mock_gpu_backend: MockBackendOpener) -> None:
    backend = mock_gpu_backend(two_devices(d1__lost_at=0))
    assert [(d.index, d.uuid, d.fault) for d in backend.devices()] == [
        (0, UUID0, None),
        (1, "unknown", "GPU is lost"),
    ]
    sample = backend.sample(set(), 0.0)
    assert sample.fault == "GPU 1 (unknown): GPU is lost"
    assert sample.devices[0].memory_used_mib == pytest.approx(1100)


@pytest.mark.parametrize("index", [None, 0, 1, 2])
def test_each_index_of_a_multi_pod_soak_sees_its_own_devices(
    mock_gpu_backend: MockBackendOpener, index: int | None
) -> None:
    """devices_by_index: the pod of completion index 1 loses its GPU; index 0, any index not named,
    and a pod outside an Indexed Job see the scenario's devices."""
    scenario = two_devices()
    scenario["devices_by_index"] = {"1": [{**scenario["devices"][1], "lost_at": 3}]}
    backend = mock_gpu_backend(scenario, index=index)
    faults = [backend.sample(set(), float(t)).fault for t in range(4)]
    if index == 1:
        assert [d.uuid for d in backend.devices()] == [UUID1]
        assert faults == [None, None, f"GPU 0 ({UUID1}): GPU is lost", f"GPU 0 ({UUID1}): GPU is lost"]
    else:
        assert [d.uuid for d in backend.devices()] == [UUID0, UUID1] and faults == [None] * 4


def test_a_gpu_that_cannot_be_identified_only_matters_when_selected(
    mock_gpu_backend: MockBackendOpener,
) -> None:
    scenario = two_devices(d1__errors={"uuid": "NO_PERMISSION"})
    backend = mock_gpu_backend(scenario, trainer_env={"NVIDIA_VISIBLE_DEVICES": UUID0})
    assert [d.uuid for d in backend.devices()] == [UUID0]
    backend.close()
    selected = mock_gpu_backend(scenario, trainer_env={"NVIDIA_VISIBLE_DEVICES": "1"})
    reason = selected.sample(set(), 0.0).reason
    assert reason is not None
    assert "GPU 1 not identified: Insufficient Permissions (NVML error 4)" in reason


def test_nvmls_recovery_action_is_read_and_a_driver_without_it_is_unavailable(
    mock_gpu_backend: MockBackendOpener,
) -> None:
    """The field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION through nvmlDeviceGetFieldValues: its value by
    name; a driver that does not report it answers NOT_SUPPORTED in the field, never an error."""
    backend = mock_gpu_backend(two_devices(d0__recovery_action="node_reboot", d1__recovery_action=None))
    first, second = backend.look(set()).devices
    assert (first.recovery_action, first.unavailable) == ("node_reboot", [])
    assert (
        second.recovery_action is None and second.unavailable == ["recovery_action"] and second.errors == {}
    )
