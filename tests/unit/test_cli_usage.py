"""A usage error is one line naming the problem and where help is, with exit code 64."""

from __future__ import annotations

from pathlib import Path

import pytest

from sidecar.cli import main
from sidecar.core.exitcodes import ExitCode


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (
            ["run", "--local", "--budget", "abc"],
            "soak-sidecar run: error: argument --budget: invalid float value",
        ),
        (["schema"], "soak-sidecar schema: error: the following arguments are required: SCHEMA"),
        (["no-such-command"], "soak-sidecar: error: argument COMMAND: invalid choice"),
        (
            ["verdict", "some-job", "--wait", "nan"],
            "soak-sidecar verdict: error: argument --wait: expected seconds >= 0, got 'nan'",
        ),
    ],
)
def test_usage_error_is_one_line(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(argv)
    assert exited.value.code == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(expected), err
    assert err.rstrip().endswith("--help)")


@pytest.mark.parametrize(
    ("argv", "env", "expected"),
    [
        # The README's old deadline example: default TERM grace 5 s, soft stop 3 s before the deadline.
        (
            ["run", "--local", "--budget", "8", "--checkpoint-margin", "3"],
            {},
            "deadline: deadline.term_grace_s (5 s) must be smaller than --checkpoint-margin (3 s)",
        ),
        (
            ["run", "--local", "--checkpoint-margin", "3"],
            {"SOAK_DEADLINE__TERM_GRACE_S": "3"},
            "deadline: SOAK_DEADLINE__TERM_GRACE_S (3 s) must be smaller than --checkpoint-margin (3 s)",
        ),
        (
            ["run", "--local"],
            {"SOAK_LAUNCHER__HEARTBEAT_INTERVAL_S": "30"},
            "launcher: SOAK_LAUNCHER__HEARTBEAT_INTERVAL_S (30 s) must be smaller than "
            "launcher.heartbeat_timeout_s (15 s)",
        ),
        (
            ["run", "--local", "--budget", "8", "--checkpoint-margin", "9"],
            {},
            "deadline: --checkpoint-margin (9 s) must be smaller than --budget (8 s)",
        ),
        (["run", "--local", "--sample-interval", "0"], {}, "--sample-interval: Input should be greater"),
        (
            ["run", "--local"],
            {"soak_deadline__budget_s": "0"},
            "soak_deadline__budget_s: Input should be greater",
        ),
        (
            ["run", "--local", "--budget", "0"],
            {"SOAK_DEADLINE__BUDGET_S": "-1"},  # the flag wins, so the flag is what was wrong
            "--budget: Input should be greater",
        ),
    ],
)
def test_a_settings_error_names_what_the_user_set(
    argv: list[str],
    env: dict[str, str],
    expected: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"soak-sidecar: error: invalid settings: {expected}"), err


@pytest.mark.parametrize(
    ("argv", "env"),
    [
        (["--manifest-validator", "nomodule_for_soak_tests:fn"], {}),
        ([], {"SOAK_SUMMARY__MANIFEST_VALIDATOR": "os:no_such_function"}),
    ],
)
def test_validate_with_an_unloadable_validator_is_a_usage_error(
    argv: list[str],
    env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    summary = tmp_path / "run_summary.json"
    summary.write_text("{}", encoding="utf-8")
    assert main(["validate", *argv, str(summary)]) == ExitCode.USAGE
    captured = capsys.readouterr()
    assert captured.out == ""  # no verdict on the file: it was never judged
    named = argv[0] if argv else next(iter(env))  # the error names what the user set
    assert captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"soak-sidecar: error: {named}: "), captured.err


def test_run_help_teaches_every_default_and_unit_and_the_demos_cadence(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for expected in (
        "--sample-interval SAMPLE_INTERVAL Seconds between samples. Default 5.",
        "--budget BUDGET Total job budget in seconds, across retries. Default 7200.",
        "--max-rss-growth MAX_RSS_GROWTH Fail (resource_leak) when the tree's RSS grows more than this, MiB.",
        "--sample-interval 0.5, --post-shutdown-grace 0.5, --startup-timeout 30, --stale-progress 15",
    ):
        assert expected in text, expected
