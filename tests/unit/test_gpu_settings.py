"""GpuSettings consistency and the backends that need no NVML at all."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.adapters.nvml import NullGpuBackend, open_gpu_backend
from sidecar.app.wiring import open_gpu
from sidecar.core.errors import ConfigError, GpuUnavailableError
from sidecar.settings import GpuSettings, load_settings


def test_require_needs_a_backend() -> None:
    with pytest.raises(ConfigError, match="gpu: require needs a GPU backend"):
        load_settings({"gpu.backend": "none", "gpu.require": True})


def test_mock_needs_a_scenario(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"backend mock needs gpu\.mock_scenario"):
        load_settings({"gpu.backend": "mock"})
    monkeypatch.setenv("SOAK_GPU__BACKEND", "mock")
    monkeypatch.setenv("SOAK_GPU__MOCK_SCENARIO", "/x/scenario.json")
    assert load_settings().gpu.mock_scenario == Path("/x/scenario.json")


def test_backend_none_samples_nothing_and_says_why() -> None:
    backend = open_gpu_backend(GpuSettings.model_validate({"backend": "none"}), None)
    assert isinstance(backend, NullGpuBackend)
    assert backend.devices() == []
    sample = backend.sample({1}, 0.0)
    assert (sample.available, sample.attribution) == (False, "not_sampled")
    assert sample.reason == "GPU sampling is off (gpu.backend=none)"
    backend.close()


def test_trainer_without_gpus_is_decided_before_nvml_is_touched() -> None:
    settings = GpuSettings.model_validate({"backend": "nvml", "require": True})
    with pytest.raises(GpuUnavailableError, match=r"no GPUs \(NVIDIA_VISIBLE_DEVICES=void\)"):
        open_gpu_backend(settings, {"NVIDIA_VISIBLE_DEVICES": "void"})


def test_a_missing_mock_library_dir_is_a_config_error(tmp_path: Path) -> None:
    scenario = tmp_path / "s.json"
    scenario.write_text('{"devices": []}', encoding="utf-8")
    settings = GpuSettings.model_validate(
        {"backend": "mock", "mock_library_dir": tmp_path / "nope", "mock_scenario": scenario}
    )
    with pytest.raises(ConfigError, match="NVML mock library not found"):
        open_gpu(settings, None)


def test_a_scenario_alone_means_the_mock_and_is_never_ignored() -> None:
    assert load_settings({"gpu.mock_scenario": Path("two.json")}).gpu.backend == "mock"
    with pytest.raises(ConfigError, match="mock_scenario is for backend mock, not nvml"):
        load_settings({"gpu.mock_scenario": Path("two.json"), "gpu.backend": "nvml"})
