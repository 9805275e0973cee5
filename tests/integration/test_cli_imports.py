"""The commands a user, a probe or a script runs most start light: only the module of the command
given is imported, so ``--help``, ``exit-codes`` and ``validate --help`` load neither pydantic nor
boto3 nor the Kubernetes client nor the engine (bench/footprint.py measures what that saves)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration

HEAVY = (
    "pydantic",
    "boto3",
    "botocore",
    "kubernetes",
    "psutil",
    "sidecar.app.supervisor",
    "sidecar.settings",
)
# Runs the CLI as the console script does, then names the heavy modules it loaded.
PROBE = f"""
import json, sys
from sidecar import cli
try:
    code = cli.main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps([code, sorted(m for m in {HEAVY!r} if m in sys.modules)]))
"""


def loaded(*argv: str) -> tuple[object, list[str]]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    code, modules = json.loads(out.splitlines()[-1])
    return code, modules


@pytest.mark.parametrize(
    "argv", [["--help"], ["exit-codes"], ["validate", "--help"], ["exit-codes", "--json"]]
)
def test_light_commands_load_nothing_heavy(argv: list[str]) -> None:
    assert loaded(*argv) == (0, [])


def test_run_help_still_gets_its_whole_parser() -> None:
    """The command given gets every flag (and run's come from the settings model)."""
    out = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "run", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    assert "--budget" in out and "--checkpoint-margin" in out and "--s3-bucket" in out
