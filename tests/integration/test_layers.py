"""The import-linter contracts (.importlinter) hold for the package, and they can fail: a core module
that imports an adapter, an app module other than wiring importing one, the launcher importing the
core or a dependency, or an import cycle breaks them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


def lint_imports(package_parent: Path) -> subprocess.CompletedProcess[str]:
    if shutil.which("lint-imports") is None:
        pytest.fail("lint-imports is not installed (pip install -e '.[dev]')")
    return subprocess.run(
        ["lint-imports", "--config", str(REPO_ROOT / ".importlinter"), "--no-cache"],
        cwd=package_parent,
        env={**os.environ, "PYTHONPATH": str(package_parent)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_package_keeps_its_layers() -> None:
    result = lint_imports(REPO_ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("core/liveness.py", "import sidecar.adapters.procfs", "cli > app > adapters > settings > core"),
        (
            "adapters/procfs/__init__.py",
            "import sidecar.app.session",
            "cli > app > adapters > settings > core",
        ),
        ("core/conclusion.py", "import sidecar.settings", "cli > app > adapters > settings > core"),
        ("core/verdict.py", "import subprocess", "the core does no I/O"),
        ("adapters/kube/reads.py", "import sidecar.adapters.s3_sink", "adapters do not import each other"),
        ("launcher/runner.py", "import sidecar.core.samples", "standard library only"),
        ("launcher/proc.py", "import psutil", "standard library only"),
        (
            "adapters/procfs/__init__.py",
            "import sidecar.launcher.runner",
            "imports only the launcher's protocol",
        ),
        ("core/conclusion.py", "import sidecar.launcher.trainer", "imports only the launcher's protocol"),
        ("adapters/nvml/loader.py", "import sidecar.nvml_mock.build", "never build it"),
        ("settings/model.py", "import sidecar.app.supervisor", "no import cycles"),
        ("app/preflight.py", "import sidecar.adapters.workdirs", "only app.wiring imports adapters"),
        (
            "adapters/report_source/__init__.py",
            "import sidecar.adapters.procfs",
            "adapters do not import each other",
        ),
        ("launcher/output.py", "import prometheus_client", "standard library only"),
        ("launcher/protocol/files.py", "import sidecar.commands.run", "standard library only"),
    ],
)
def test_a_violation_breaks_a_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    copy = tmp_path / "sidecar"
    shutil.copytree(REPO_ROOT / "sidecar", copy, ignore=shutil.ignore_patterns("__pycache__"))
    target = copy / module
    target.write_text(target.read_text(encoding="utf-8") + f"\n{line}  # noqa\n", encoding="utf-8")
    probe = subprocess.run(
        [sys.executable, "-c", "import sidecar; print(sidecar.__file__)"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        check=True,
    )
    assert probe.stdout.strip().startswith(str(copy)), "the copy must shadow the installed package"
    result = lint_imports(tmp_path)
    assert result.returncode != 0
    assert contract in result.stdout and "BROKEN" in result.stdout, result.stdout
