"""Where a setting's value comes from: flags over the environment over a mode's own defaults over
the model's defaults, with the settings built once."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.app.setup import local_layout
from sidecar.core.errors import ConfigError
from sidecar.settings import explicit_settings, load_settings, pod_release_paths, with_defaults

RUN_ID = "3f2b6d1c-8a4e-4f0b-9c7d-2e5a1b6c9d0f"


def test_flags_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOAK_MONITOR__SAMPLE_INTERVAL_S", "7")
    monkeypatch.setenv("SOAK_MONITOR__STALE_PROGRESS_S", "70")
    settings = load_settings({"monitor.sample_interval_s": 2.0})
    assert settings.monitor.sample_interval_s == 2.0
    assert settings.monitor.stale_progress_s == 70.0  # the environment's, merged into the same group
    assert {"monitor.sample_interval_s", "monitor.stale_progress_s"} <= explicit_settings(settings)
    assert "monitor.startup_timeout_s" not in explicit_settings(settings)


def test_a_modes_defaults_fill_only_what_the_user_left_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOAK_MONITOR__SAMPLE_INTERVAL_S", "7")
    settings = with_defaults(
        load_settings({"monitor.stale_progress_s": 40.0}),
        {
            "monitor.sample_interval_s": 0.5,
            "monitor.stale_progress_s": 15.0,
            "monitor.startup_timeout_s": 30.0,
        },
    )
    assert settings.monitor.sample_interval_s == 7.0
    assert settings.monitor.stale_progress_s == 40.0
    assert settings.monitor.startup_timeout_s == 30.0


def test_a_bad_environment_value_is_refused_even_where_a_mode_has_a_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SOAK_MONITOR__SAMPLE_INTERVAL_S", "-1")
    with pytest.raises(ConfigError, match=r"^invalid settings: SOAK_MONITOR__SAMPLE_INTERVAL_S: "):
        with_defaults(load_settings(), {"monitor.sample_interval_s": 0.5})


def test_a_mode_default_is_validated_with_its_group() -> None:
    with pytest.raises(ConfigError, match="invalid settings"):
        with_defaults(load_settings(), {"monitor.sample_interval_s": -1.0})


def test_a_local_run_gets_its_own_dirs_under_the_output_dir_unless_the_user_chose(tmp_path: Path) -> None:
    chosen = tmp_path / "my-progress"
    settings = local_layout(
        load_settings({"artifact.output_dir": tmp_path / "out", "monitor.progress_dir": chosen}), RUN_ID
    )
    assert settings.launcher.run_dir == tmp_path / "out" / "runs" / RUN_ID / "run"
    assert settings.deadline.store_dir == tmp_path / "out" / "deadlines"
    assert settings.monitor.progress_dir == chosen


def test_a_failed_pod_sidecar_still_finds_its_run_dir_and_termination_log() -> None:
    assert pod_release_paths({}) == (Path("soak-output/run"), Path("/dev/termination-log"))
    environ = {
        "SOAK_LAUNCHER__RUN_DIR": "/soak/run",
        "SOAK_KUBE__TERMINATION_LOG": "/t/log",
        "SOAK_S3__X": "?",
    }
    assert pod_release_paths(environ) == (Path("/soak/run"), Path("/t/log"))
