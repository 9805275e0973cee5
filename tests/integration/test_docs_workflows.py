"""docs/workflows.md run as written: approve, an attempt that writes a checkpoint, the resume, and
the refusals it shows, in order and in one empty directory, each with the exit code the page gives."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.docs_commands import WORKFLOWS, commands_of

pytestmark = pytest.mark.integration

COMMANDS = commands_of(WORKFLOWS, ("soak-sidecar",))
RUN_ID = "0b7d2c4e-5a61-4f0e-9d3a-8e2f1c6b7a90"


def test_the_workflows_page_approves_checkpoints_and_resumes(tmp_path: Path) -> None:
    texts = [c.text for c in COMMANDS]
    assert [c.expected_exit for c in COMMANDS] == [0, 17, 0, 15, 15], texts
    assert texts[0].startswith("soak-sidecar approve") and "--resume-checkpoint" in texts[2], texts
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    for command in COMMANDS:
        result = subprocess.run(
            ["bash", "-c", command.substituted()],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == command.expected_exit, (command.source, result.stderr[-3000:])
    runs = tmp_path / "soak-output" / "runs" / RUN_ID
    first = json.loads((runs / "attempt-1" / "artifact.json").read_text(encoding="utf-8"))
    resumed = json.loads((runs / "attempt-2" / "artifact.json").read_text(encoding="utf-8"))
    assert first["failure_classification"] == "external_cancellation"
    assert resumed["status"] == "passed" and resumed["deadline"]["resumed"] is True
    checkpoint = (runs / "progress" / "checkpoint.json").resolve()
    assert f"resumed from {checkpoint}" in (runs / "attempt-2" / "console.log").read_text(encoding="utf-8")
    # The resumed attempt records what it ran and what it resumed from.
    assert resumed["command"] == first["command"]  # the path came in $SOAK_RESUME_CHECKPOINT
    assert resumed["deadline"]["resumed_from"] == str(checkpoint)
    assert first["deadline"]["resumed_from"] is None
    assert len(list(runs.glob("unnumbered-*/artifact.json"))) == 2  # the two refusals


def test_the_readme_links_the_workflows_page() -> None:
    readme = (WORKFLOWS.parents[1] / "README.md").read_text(encoding="utf-8")
    assert "(docs/workflows.md)" in readme
