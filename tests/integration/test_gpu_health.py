"""GPU health through the real pynvml against the mock libnvidia-ml.so.1: XID and ECC events from the
event thread, row remapping, pending retirements, clock-event reasons, PCIe and NVLink counters, and
the rules of sidecar.core.gpu_health that turn them into a GPU fault (or not)."""

from __future__ import annotations

from typing import Any

import pytest

from sidecar.core.gpu_health import XID_CATALOG, GpuHealthTracker
from sidecar.core.ports import GpuBackend
from sidecar.core.samples import GpuEvent, GpuSample
from tests.fixtures.nvml import UUID0, MockBackendOpener
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def device(**fields: Any) -> dict[str, Any]:
    """One H100 on the samples clock (time = memory queries = samples taken), 18 NVLink links."""
    return {"uuid": UUID0, "memory_used_mib": 1000, "nvlink": [{}] * 18, **fields}


def scenario(*missing: str, **fields: Any) -> dict[str, Any]:
    return {"time_unit": "samples", "missing_functions": list(missing), "devices": [device(**fields)]}


def opened(mock_gpu_backend: MockBackendOpener, nvml_scenario: dict[str, Any]) -> GpuBackend:
    """The backend with the slow reads (health counters, ECC) in every sample: one per second."""
    return mock_gpu_backend(nvml_scenario, process_interval_s=1.0)


class Fed:
    """Samples taken from a backend and fed, in order, to a tracker (as the sample recorder does)."""

    def __init__(self, backend: GpuBackend, fail_on_slowdown_s: float | None = None) -> None:
        self.backend = backend
        self.tracker = GpuHealthTracker(fail_on_slowdown_s)
        self.samples: list[GpuSample] = []

    def take(self, count: int = 1) -> GpuSample:
        for _ in range(count):
            t = float(len(self.samples))
            sample = self.backend.sample(set(), t)
            self.samples.append(sample)
            self.tracker.observe(sample, t)
        return self.samples[-1]

    def events(self) -> list[GpuEvent]:
        return [event for sample in self.samples for event in sample.events]

    def until_events(self, count: int) -> list[GpuEvent]:
        """Samples until ``count`` events came through (the event thread hands them over)."""
        wait_until(
            f"{count} events", lambda: len(self.take().events) >= 0 and len(self.events()) >= count, 10
        )
        return self.events()


@pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140])
def test_an_xid_that_blames_the_gpu_is_a_gpu_fault(mock_gpu_backend: MockBackendOpener, xid: int) -> None:
    fed = Fed(opened(mock_gpu_backend, scenario(events=[{"at": 2, "type": "xid", "data": xid}])))
    fed.take()
    assert fed.tracker.fault is None
    (event,) = fed.until_events(1)
    assert (event.kind, event.data, event.device_uuid, event.device_index) == ("xid", xid, UUID0, 0)
    assert fed.tracker.fault == f"GPU 0 ({UUID0}): XID {xid}: {XID_CATALOG[xid].meaning}"
    assert fed.tracker.summary().gpu_xids == [xid]


@pytest.mark.parametrize("xid", [13, 31, 43, 45, 68, 109])
def test_an_xid_the_application_caused_is_the_trainers_not_the_gpus(
    mock_gpu_backend: MockBackendOpener, xid: int
) -> None:
    fed = Fed(opened(mock_gpu_backend, scenario(events=[{"at": 1, "type": "xid", "data": xid}])))
    fed.until_events(1)
    summary = fed.tracker.summary()
    assert fed.tracker.fault is None
    assert (summary.application_xids, summary.gpu_xids) == ([xid], [])


def test_an_xid_outside_the_catalog_is_recorded_and_blames_nobody(
    mock_gpu_backend: MockBackendOpener,
) -> None:
    fed = Fed(opened(mock_gpu_backend, scenario(events=[{"at": 1, "type": "xid", "data": 999}])))
    fed.until_events(1)
    assert fed.tracker.fault is None and fed.tracker.summary().unclassified_xids == [999]


def test_ecc_events_double_bit_is_a_fault_single_bit_is_recorded(mock_gpu_backend: MockBackendOpener) -> None:
    events = [{"at": 1, "type": "ecc_single_bit", "data": 3}, {"at": 3, "type": "ecc_double_bit", "data": 1}]
    fed = Fed(opened(mock_gpu_backend, scenario(events=events)))
    first = fed.until_events(1)
    assert [e.kind for e in first] == ["ecc_single_bit"] and fed.tracker.fault is None
    fed.until_events(2)
    assert fed.tracker.fault == f"GPU 0 ({UUID0}): ecc double bit ECC event"
    assert fed.tracker.summary().event_count == 2


@pytest.mark.parametrize(
    ("fields", "fault"),
    [
        (
            {"remapped_rows": {"correctable": 1, "pending": True}},
            "row remapping pending (the GPU needs a reset)",
        ),
        ({"remapped_rows": {"uncorrectable": 2, "failure": True}}, "row remapping failed"),
        ({"retired_pages_pending": True}, "page retirement pending (the GPU needs a reset)"),
        ({"ecc_uncorrected": [[0, 4], [3, 6]]}, "2 uncorrected ECC errors during the soak"),
    ],
)
def test_memory_health_rules(mock_gpu_backend: MockBackendOpener, fields: dict[str, Any], fault: str) -> None:
    fed = Fed(opened(mock_gpu_backend, scenario(**fields)))
    fed.take(4)
    assert fed.tracker.fault == f"GPU 0 ({UUID0}): {fault}"


def test_uncorrected_ecc_from_before_the_soak_is_not_its_fault(mock_gpu_backend: MockBackendOpener) -> None:
    fed = Fed(opened(mock_gpu_backend, scenario(ecc_uncorrected=5, remapped_rows={"correctable": 7})))
    record = fed.take(3).devices[0]
    assert fed.tracker.fault is None
    assert (record.ecc_uncorrected, record.remapped_rows_correctable, record.row_remap_pending) == (
        5,
        7,
        False,
    )


# On the samples clock sample k reads the reasons at time k + 1 (its memory query comes first):
# sample 0 sees gpu_idle, every later one the slowdown, taken to hold since the sample before.
SLOWED = [{"at": 0, "reasons": ["gpu_idle"]}, {"at": 2, "reasons": ["hw_slowdown", "hw_thermal"]}]


def test_sustained_hardware_slowdown_is_reported_and_time_is_counted(
    mock_gpu_backend: MockBackendOpener,
) -> None:
    fed = Fed(opened(mock_gpu_backend, scenario(clock_event_reasons=SLOWED)))
    fed.take(8)
    assert fed.samples[-1].devices[0].clock_event_reasons == ["hw_slowdown", "hw_thermal"]
    (health,) = fed.tracker.summary().devices
    assert fed.tracker.fault is None  # no setting asks for it to fail
    assert fed.samples[0].devices[0].clock_event_reasons == ["gpu_idle"]
    assert health.clock_event_reason_s == {"hw_slowdown": 7.0, "hw_thermal": 7.0}
    assert health.longest_hw_slowdown_s == 7.0


def test_sustained_hardware_slowdown_fails_when_a_setting_asks(mock_gpu_backend: MockBackendOpener) -> None:
    fed = Fed(opened(mock_gpu_backend, scenario(clock_event_reasons=SLOWED)), fail_on_slowdown_s=4.0)
    fed.take(4)
    assert fed.tracker.fault is None
    fed.take()
    assert (
        fed.tracker.fault
        == f"GPU 0 ({UUID0}): hardware slowdown (hw_slowdown, hw_thermal) for 4 s (limit 4 s)"
    )


def test_pcie_and_nvlink_counters(mock_gpu_backend: MockBackendOpener) -> None:
    links = [{"crc_flit": 2, "crc_data": 1, "replay": 4, "recovery": 1}, {"active": False, "replay": 50}] + [
        {}
    ] * 2
    fed = Fed(opened(mock_gpu_backend, scenario(pcie_replay_count=[[0, 0], [3, 30]], nvlink=links)))
    record = fed.take(4).devices[0]
    # The inactive link's counters are not the soak's.
    assert (record.nvlink_active_links, record.nvlink_crc_errors) == (3, 3)
    assert (record.nvlink_replay_errors, record.nvlink_recovery_errors) == (4, 1)
    (health,) = fed.tracker.summary().devices
    assert health.max_pcie_replay_count == 30 and fed.tracker.fault is None


def test_not_supported_is_recorded_never_an_error(mock_gpu_backend: MockBackendOpener) -> None:
    broken = {metric: "NOT_SUPPORTED" for metric in ("remapped_rows", "retired_pages_pending", "pcie_replay")}
    fed = Fed(
        opened(
            mock_gpu_backend, scenario(nvlink=[], errors={**broken, "clock_event_reasons": "NOT_SUPPORTED"})
        )
    )
    record = fed.take(2).devices[0]
    assert record.unavailable == sorted([*broken, "clock_event_reasons", "clock_throttle_reasons", "nvlink"])
    assert record.errors == {} and record.memory_used_mib is not None and fed.tracker.fault is None


def test_a_driver_before_535_gives_clock_reasons_by_their_old_name(
    mock_gpu_backend: MockBackendOpener,
) -> None:
    slowed = [{"at": 0, "reasons": ["sw_power_cap"]}]
    fed = Fed(
        opened(
            mock_gpu_backend, scenario("nvmlDeviceGetCurrentClocksEventReasons", clock_event_reasons=slowed)
        )
    )
    record = fed.take(2).devices[0]
    assert record.clock_event_reasons == ["sw_power_cap"]
    assert record.unavailable == ["clock_event_reasons"]


def test_a_driver_without_the_event_api_still_samples(mock_gpu_backend: MockBackendOpener) -> None:
    events = [{"at": 1, "type": "xid", "data": 79}]
    fed = Fed(
        opened(
            mock_gpu_backend, scenario("nvmlEventSetCreate", events=events, remapped_rows={"pending": True})
        )
    )
    sample = fed.take(3)
    assert sample.events_unavailable == "NVML events unavailable: Function Not Found (NVML error 13)"
    assert fed.events() == [] and sample.devices[0].memory_used_mib is not None
    # The other rules still hold, and the artifact says why there are no events.
    summary = fed.tracker.summary()
    assert summary.events_unavailable == sample.events_unavailable
    assert fed.tracker.fault == f"GPU 0 ({UUID0}): row remapping pending (the GPU needs a reset)"


def test_a_device_without_events_is_said_so(mock_gpu_backend: MockBackendOpener) -> None:
    sample = Fed(opened(mock_gpu_backend, scenario(errors={"events": "NOT_SUPPORTED"}))).take()
    assert sample.events_unavailable == "NVML events unavailable: GPU 0: events not supported"
