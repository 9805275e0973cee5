"""docs/trainers.md's runnable trainer commands, as written: each runs the repository's real-framework
trainer under ``soak-sidecar run --local`` and passes. ``python3`` is the trainer venv's (the page
says "with Lightning installed"), the working directory a fresh one with the repository's tests/
in it, as in a checkout."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.components import require
from tests.docs_commands import REPO_ROOT, DocCommand, commands_of

pytestmark = [pytest.mark.integration, pytest.mark.trainers]

TRAINERS_MD = REPO_ROOT / "docs" / "trainers.md"
RUNNABLE = [
    c
    for c in commands_of(TRAINERS_MD, ("soak-sidecar", "OMPI_MCA_ess_singleton_isolated=1"))
    if "tests/trainers/" in c.text or "tests.trainers." in c.text
]


def test_the_page_shows_a_runnable_command_per_framework() -> None:
    shown = " ".join(c.text for c in RUNNABLE)
    for trainer in (
        "lightning_trainer.py",
        "hf_trainer.py",
        "accelerate_trainer.py",
        "torchtitan_trainer.py",
        "-m soak_sidecar_kit.torchtitan",
    ):
        assert trainer in shown, trainer


@pytest.mark.parametrize("command", RUNNABLE, ids=[c.source for c in RUNNABLE])
def test_trainer_command_as_written(command: DocCommand, tmp_path: Path) -> None:
    # Only python3 is the venv's: soak-sidecar stays the one installed here.
    python3 = tmp_path / "bin" / "python3"
    python3.parent.mkdir()
    python3.write_text(f'#!/bin/sh\nexec "{require("trainer-venv")}" "$@"\n', encoding="utf-8")
    python3.chmod(0o755)
    (tmp_path / "tests").symlink_to(REPO_ROOT / "tests", target_is_directory=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    env["PATH"] = f"{python3.parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        ["bash", "-c", command.text],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert result.returncode == command.expected_exit, (command.text, result.stderr[-3000:])
    assert "soak-sidecar: PASSED" in result.stderr, result.stderr[-3000:]
