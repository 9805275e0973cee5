"""The contract that keeps the sidecar to the launcher's protocol lists every other launcher module."""

from __future__ import annotations

import configparser
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = REPO_ROOT / "sidecar" / "launcher"


def test_every_launcher_module_but_the_protocol_is_forbidden_to_the_sidecar() -> None:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / ".importlinter")
    forbidden = set(config["importlinter:contract:launcher-protocol-only"]["forbidden_modules"].split())
    runtime = {f"sidecar.launcher.{path.stem}" for path in LAUNCHER.glob("*.py") if path.stem != "__init__"}
    assert runtime and runtime == forbidden, "list each of these in .importlinter, and no other"
    assert (LAUNCHER / "protocol").is_dir() and "sidecar.launcher.protocol" not in forbidden
