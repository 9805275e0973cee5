"""A node left clean (pure): once the trainer's tree is gone, what the run left on its GPUs, judged
against the same GPUs before the trainer started."""

from __future__ import annotations

from sidecar.core.gpu_clean import gpu_leftovers
from sidecar.core.samples import GpuDevice, GpuProcess, GpuSample

UUID = "GPU-6f1e2d3c-0000-4000-8000-000000000000"


def gpu(used: float, *processes: int, **health: object) -> GpuSample:
    device = GpuDevice(index=0, uuid=UUID, name="H100", memory_used_mib=used, **health)
    listed = [
        GpuProcess(pid=p, device_uuid=UUID, used_memory_mib=512, kind="compute", in_tree=False)
        for p in processes
    ]
    return GpuSample(available=True, devices=[device], processes=listed)


BEFORE = gpu(1000)


def test_a_clean_gpu_has_nothing_to_say() -> None:
    assert gpu_leftovers(BEFORE, gpu(1200), {10, 11}, 256).findings == ()


def test_a_process_of_the_run_still_listed_is_the_runs() -> None:
    left = gpu_leftovers(BEFORE, gpu(1600, 11), {10, 11}, 256)
    assert left.held_by_run == (f"GPU 0 ({UUID}): process 11 of the run is still listed (512 MiB)",)
    assert left.on_device == ()  # a process is listed: the memory is not the device's doing


def test_memory_kept_with_no_process_listed_is_the_devices() -> None:
    (kept,) = gpu_leftovers(BEFORE, gpu(5000), {10}, 256).on_device
    assert "5000 MiB in use with no process listed, 4000 MiB above the 1000 MiB" in kept
    # another tenant's process on the device: its memory is not counted against the run
    assert gpu_leftovers(BEFORE, gpu(5000, 99), {10}, 256).findings == ()


def test_pending_resets_are_named_and_a_faulted_device_is_left_to_its_fault() -> None:
    left = gpu_leftovers(BEFORE, gpu(1000, row_remap_pending=True, retired_pages_pending=True), {10}, 256)
    assert [f.split(": ", 1)[1] for f in left.on_device] == [
        "a row remapping is pending (the GPU needs a reset)",
        "a page retirement is pending (the GPU needs a reset)",
    ]
    assert (
        gpu_leftovers(BEFORE, gpu(9000, row_remap_pending=True, fault="GPU is lost"), {10}, 256).findings
        == ()
    )
    assert gpu_leftovers(BEFORE, GpuSample(available=False), {10}, 256).findings == ()


def test_nvmls_recovery_action_is_named_unless_it_is_none() -> None:
    (needs,) = gpu_leftovers(BEFORE, gpu(1000, recovery_action="node_reboot"), {10}, 256).on_device
    assert needs == f"GPU 0 ({UUID}): NVML's recovery action is node_reboot"
    assert gpu_leftovers(BEFORE, gpu(1000, recovery_action="none"), {10}, 256).findings == ()
