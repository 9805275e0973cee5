"""Scenario JSON validation and its flat form for the C mock."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sidecar.core.errors import ConfigError
from sidecar.nvml_mock.scenario import Scenario, compile_scenario, load_scenario, render

PACKAGE_SCENARIOS = sorted((Path(__file__).parents[2] / "sidecar" / "nvml_mock").glob("*.json"))


@pytest.mark.parametrize("path", PACKAGE_SCENARIOS, ids=lambda p: p.name)
def test_shipped_example_scenarios_are_valid(path: Path) -> None:
    assert load_scenario(path).devices


def test_shipped_examples_exist() -> None:
    assert len(PACKAGE_SCENARIOS) >= 2


def test_render_maps_metrics_to_functions_and_missing_symbols() -> None:
    scenario = Scenario.model_validate(
        {
            "time_unit": "samples",
            "missing_functions": ["nvmlDeviceGetMemoryInfo_v2"],
            "devices": [
                {
                    "uuid": "GPU-12345678-aaaa",
                    "memory_used_mib": [[5, 200], [0, 100]],
                    "power_w": 300.25,
                    "errors": {
                        "temperature": "NOT_SUPPORTED",
                        "utilization": {"code": "NO_PERMISSION", "from": 2, "until": 4},
                    },
                    "lost_at": 3,
                    "processes": [{"pid": "$TRAINER", "used_memory_mib": 90}],
                }
            ],
        }
    )
    lines = set(render(scenario).splitlines())
    assert "time_unit=samples" in lines
    assert "d0.used_mib=0.0:100.0,5.0:200.0" in lines  # points sorted by time
    assert "d0.power_mw=300250" in lines
    assert "d0.err.temperature=3,0,-1" in lines
    assert "d0.err.temperature_v=3,0,-1" in lines
    assert "d0.err.utilization=4,2.0,4.0" in lines
    assert "d0.err.memory_v2=13,0,-1" in lines
    assert "d0.lost_at=3.0" in lines
    assert "d0.p0.pid=$TRAINER" in lines


@pytest.mark.parametrize(
    "broken",
    [
        {"devices": [{"uuid": "not-a-uuid"}]},
        {"devices": [{"uuid": "GPU-12345678", "errors": {"fan": "NOT_SUPPORTED"}}]},
        {"devices": [{"uuid": "GPU-12345678", "errors": {"power": "BROKEN"}}]},
        {"devices": [{"uuid": "GPU-12345678", "processes": [{"pid": "TRAINER"}]}]},
        {"devices": [{"uuid": "GPU-12345678"}, {"uuid": "GPU-12345678"}]},
        {"missing_functions": ["nvmlDeviceGetFanSpeed"]},
        {"init_error": "NOPE"},
        {"devices": [], "extra": 1},
        {"devices_by_index": {"-1": [{"uuid": "GPU-12345678"}]}},
        {"devices_by_index": {"one": [{"uuid": "GPU-12345678"}]}},
        {"devices_by_index": {"1": [{"uuid": "GPU-12345678"}, {"uuid": "GPU-12345678"}]}},
    ],
)
def test_invalid_scenarios_are_config_errors(tmp_path: Path, broken: dict[str, object]) -> None:
    path = tmp_path / "s.json"
    path.write_text(json.dumps(broken), encoding="utf-8")
    with pytest.raises(ConfigError, match=r"s\.json"):
        load_scenario(path)


def test_compile_writes_a_readable_flat_file(tmp_path: Path) -> None:
    source = tmp_path / "demo.json"
    source.write_text(json.dumps({"devices": [{"uuid": "GPU-12345678"}]}), encoding="utf-8")
    flat = compile_scenario(source, tmp_path / "out")
    assert flat.name == "demo.nvmlmock"
    assert flat.read_text(encoding="utf-8").startswith("format=soak-nvml-mock/1\n")
    assert flat.stat().st_mode & 0o444 == 0o444
    assert not [p for p in flat.parent.iterdir() if p.name.startswith(".")]
