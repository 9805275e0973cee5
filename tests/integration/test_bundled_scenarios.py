"""Every scenario bundled with the mock NVML, run by name as a user would (``--gpu-scenario NAME``
with the bundled example trainer), gives the exit code its table says, through the real pynvml path;
without the setting an opt-in rule needs, the same scenario is only reported and passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sidecar.core.exitcodes import ExitCode
from sidecar.nvml_mock.bundled import BUNDLED, DIRECTORY, BundledScenario
from sidecar.settings import GpuSettings

pytestmark = pytest.mark.integration


def run_scenario(
    tmp: Path, library: Path, scenario: BundledScenario, settings: dict[str, str]
) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "run", "--local", "--gpu-scenario", scenario.name],
        cwd=tmp,
        env={
            **os.environ,
            "SOAK_GPU__MOCK_LIBRARY_DIR": str(library),
            "SOAK_MONITOR__STATUS_LINE": "off",
            "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
            **settings,
        },
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return done.returncode, done.stderr


@pytest.mark.parametrize("scenario", BUNDLED, ids=[s.name for s in BUNDLED])
def test_a_bundled_scenario_gives_its_documented_exit_code(
    tmp_path: Path, nvml_mock_dir: Path, scenario: BundledScenario
) -> None:
    code, stderr = run_scenario(tmp_path, nvml_mock_dir, scenario, dict(scenario.settings))
    assert code == scenario.exit_code, stderr[-3000:]
    if scenario.exit_code == ExitCode.GPU_FAULT:
        assert "[gpu_fault] GPU fault: " in stderr
    if scenario.settings:  # the rule is opt-in: without its setting, reported only
        (tmp_path / "without").mkdir()
        code, stderr = run_scenario(tmp_path / "without", nvml_mock_dir, scenario, {})
        assert code == 0, stderr[-3000:]


def test_every_bundled_file_is_in_the_table_and_in_the_help() -> None:
    assert {p.stem for p in DIRECTORY.glob("*.json")} == {s.name for s in BUNDLED}
    described = GpuSettings.model_fields["mock_scenario"].description or ""
    assert all(s.name in described for s in BUNDLED)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "gpu-health.md").read_text(encoding="utf-8")
    rows = {line.split("|")[1].strip(): line for line in docs.splitlines() if line.startswith("| `")}
    for scenario in BUNDLED:
        row = rows[f"`{scenario.name}`"]
        assert row.rstrip().endswith(f"| {scenario.exit_code} |"), row
        assert all(f"{k}={v}" in row for k, v in scenario.settings.items()), row
