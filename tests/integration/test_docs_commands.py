"""The README's local ``soak-sidecar`` commands, run as written; each ends with the exit code the
README gives it. (The cluster commands run in tests/e2e/test_docs_cluster.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.docs_commands import DocCommand, doc_commands

pytestmark = pytest.mark.integration

LOCAL = [c for c in doc_commands() if c.text.startswith("soak-sidecar run --local")]


def test_the_readme_shows_local_runs() -> None:
    assert len(LOCAL) >= 5, [c.text for c in LOCAL]
    assert {c.expected_exit for c in LOCAL} >= {0, 10, 12, 14}


@pytest.mark.parametrize("command", LOCAL, ids=[c.source for c in LOCAL])
def test_local_command_as_written(command: DocCommand, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    result = subprocess.run(
        ["bash", "-c", command.substituted()],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == command.expected_exit, (command.text, result.stderr[-3000:])
    assert list((tmp_path / "soak-output" / "runs").glob("*/attempt-*/artifact.json")), (
        "an artifact was written"
    )
