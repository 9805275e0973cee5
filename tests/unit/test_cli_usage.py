"""A usage error is one line naming the problem and where help is, with exit code 64."""

from __future__ import annotations

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
