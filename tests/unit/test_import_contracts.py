"""The import contracts name every module they must: a new module is covered, or this fails."""

from __future__ import annotations

import configparser
from pathlib import Path

import tomllib

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE = REPO_ROOT / "sidecar"
# The adapters' shared helpers, which the other adapters may import.
SHARED_ADAPTER_HELPERS = {"s3_client", "fsutil"}
# The import name of each distribution the sidecar depends on at run time (pyproject.toml).
IMPORT_NAMES = {
    "kubernetes": "kubernetes",
    "psutil": "psutil",
    "nvidia-ml-py": "pynvml",
    "pydantic": "pydantic",
    "pydantic-settings": "pydantic_settings",
    "boto3": "boto3",
    "prometheus-client": "prometheus_client",
}
# Dependencies that ship only a program, nothing to import (py-spy: the stall's stack reader).
PROGRAM_ONLY = {"py-spy"}


def contract(name: str, key: str) -> set[str]:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / ".importlinter")
    return set(config[f"importlinter:contract:{name}"][key].split())


def modules_of(package: Path, dotted: str) -> set[str]:
    """The package's direct modules and subpackages, dotted."""
    found = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    found |= {path.parent.name for path in package.glob("*/__init__.py")}
    return {f"{dotted}.{name}" for name in found}


def test_the_sidecar_may_import_only_the_launchers_protocol() -> None:
    runtime = modules_of(PACKAGE / "launcher", "sidecar.launcher") - {"sidecar.launcher.protocol"}
    assert runtime
    assert contract("launcher-protocol-only", "forbidden_modules") == runtime


def test_every_adapter_is_independent_of_the_others() -> None:
    adapters = modules_of(PACKAGE / "adapters", "sidecar.adapters")
    helpers = {f"sidecar.adapters.{name}" for name in SHARED_ADAPTER_HELPERS}
    assert helpers <= adapters
    # nvml_events is the NVML adapter's own event reader (it moves into the nvml package).
    assert contract("independent-adapters", "modules") == adapters - helpers - {
        "sidecar.adapters.nvml_events"
    }


def test_only_wiring_imports_adapters_in_the_app() -> None:
    app = modules_of(PACKAGE / "app", "sidecar.app")
    assert contract("app-through-ports", "source_modules") == app - {"sidecar.app.wiring"}


def test_the_launcher_imports_no_dependency_and_no_other_part_of_the_package() -> None:
    forbidden = contract("launcher-stdlib", "forbidden_modules")
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {
        spec.split(">")[0].split("<")[0].split("=")[0].split("[")[0].strip()
        for spec in project["dependencies"]
    }
    assert declared == set(IMPORT_NAMES) | PROGRAM_ONLY, "a new dependency: add its import name here"
    assert set(IMPORT_NAMES.values()) <= forbidden
    parts = modules_of(PACKAGE, "sidecar") - {"sidecar.launcher", "sidecar.__main__"}
    assert parts <= forbidden, parts - forbidden
