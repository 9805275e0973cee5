"""Device selection from NVIDIA_VISIBLE_DEVICES / gpu.devices, and PID attribution (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.gpu_select import (
    DeviceSelection,
    attribute,
    parse_driver_version,
    resolve_selection,
    select_devices,
)

VISIBLE = [(0, "GPU-aaaa0000-0000-4000-8000-000000000000"), (1, "GPU-bbbb1111-1111-4000-8000-111111111111")]


@pytest.mark.parametrize(
    ("env", "mode", "ids"),
    [
        ({}, "all", ()),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, "all", ()),
        ({"NVIDIA_VISIBLE_DEVICES": "ALL"}, "all", ()),
        ({"NVIDIA_VISIBLE_DEVICES": "none"}, "none", ()),
        ({"NVIDIA_VISIBLE_DEVICES": "void"}, "none", ()),
        ({"NVIDIA_VISIBLE_DEVICES": ""}, "none", ()),
        ({"NVIDIA_VISIBLE_DEVICES": " 1 , 0 "}, "listed", ("1", "0")),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-x,,GPU-y"}, "listed", ("GPU-x", "GPU-y")),
        ({"NVIDIA_VISIBLE_DEVICES": "0,all"}, "all", ()),
    ],
)
def test_visible_devices_follow_the_container_runtime(
    env: dict[str, str], mode: str, ids: tuple[str, ...]
) -> None:
    selection = select_devices(None, env)
    assert (selection.mode, selection.ids) == (mode, ids)


def test_unreadable_trainer_env_samples_all_and_says_so() -> None:
    selection = select_devices(None, None)
    assert selection.mode == "all"
    assert selection.note is not None


def test_volume_mount_strategy_is_not_mistaken_for_a_device_id() -> None:
    selection = select_devices(None, {"NVIDIA_VISIBLE_DEVICES": "/var/run/nvidia-container-devices"})
    assert selection.mode == "all"
    assert selection.note is not None and "volume mounts" in selection.note


def test_explicit_devices_win_over_the_trainer_env() -> None:
    selection = select_devices(["1"], {"NVIDIA_VISIBLE_DEVICES": "0"})
    assert (selection.mode, selection.ids, selection.source) == ("listed", ("1",), "gpu.devices")
    assert select_devices([], {"NVIDIA_VISIBLE_DEVICES": "all"}).mode == "none"


def test_resolve_by_index_uuid_and_mig_parent() -> None:
    listed = DeviceSelection("listed", ("1", VISIBLE[0][1].upper(), "1:0"), "test")
    assert resolve_selection(listed, VISIBLE).indices == (1, 0)
    assert resolve_selection(listed, VISIBLE).missing == ()


def test_resolve_reports_ids_that_match_nothing_and_never_matches_prefixes() -> None:
    listed = DeviceSelection("listed", ("7", "GPU-aaaa0000", "MIG-abc"), "test")
    resolved = resolve_selection(listed, VISIBLE)
    assert resolved.indices == ()
    assert resolved.missing == ("7", "GPU-aaaa0000", "MIG-abc")


def test_resolve_all_and_none() -> None:
    assert resolve_selection(DeviceSelection("all", (), "t"), VISIBLE).indices == (0, 1)
    assert resolve_selection(DeviceSelection("none", (), "t"), VISIBLE).indices == ()


def test_attribution_by_pid() -> None:
    result = attribute([(10, 100.0), (99, 50.0)], {10, 11}, "550.54.15")
    assert (result.mode, result.reason) == ("pid", None)


def test_host_pids_on_an_old_driver_are_not_attributed() -> None:
    result = attribute([(3141592, 500.0)], {10, 11}, "525.85.12")
    assert result.mode == "unavailable"
    assert result.reason is not None and "525.85.12 predates 535.113" in result.reason


def test_no_match_on_a_new_driver_is_still_unavailable() -> None:
    result = attribute([(4242, 500.0)], {10}, "550.54.15")
    assert result.mode == "unavailable"
    assert result.reason is not None and "predates" not in result.reason


def test_no_processes_or_no_memory_figure_is_unavailable() -> None:
    assert attribute([], {10}, "550.54.15").mode == "unavailable"
    assert attribute([(10, None)], {10}, "550.54.15").mode == "unavailable"


def test_driver_versions() -> None:
    assert parse_driver_version("535.113.01") == (535, 113, 1)
    assert parse_driver_version("r535") is None
    assert parse_driver_version(None) is None


@given(
    reported=st.lists(st.tuples(st.integers(1, 50), st.floats(0, 1e6)), max_size=8),
    tree=st.sets(st.integers(1, 50), max_size=8),
)
def test_attribution_is_pid_exactly_when_a_reported_pid_is_in_the_tree(
    reported: list[tuple[int, float]], tree: set[int]
) -> None:
    result = attribute(list(reported), tree, "550.54.15")
    assert (result.mode == "pid") == any(pid in tree for pid, _ in reported)
