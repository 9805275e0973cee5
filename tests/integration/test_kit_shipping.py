"""The trainer kit ships with the launcher: ``install-launcher`` writes it beside the launcher, and a
trainer of the launcher's minimum Python imports it with nothing installed (the launcher puts it on
the trainer's path). The kit itself imports only the standard library."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import soak_sidecar_kit
from tests.components import require

pytestmark = pytest.mark.integration

KIT = Path(soak_sidecar_kit.__file__).resolve().parent
# The adapters import their framework (with what it is built on and requires: Lightning's torch and
# typing_extensions), and nothing else beyond the standard library and the kit.
FRAMEWORKS = {
    "lightning.py": {"lightning", "pytorch_lightning", "torch", "typing_extensions"},
    "hf.py": {"transformers"},
    "torchtitan.py": {"torchtitan"},
}


def test_the_kit_imports_only_the_standard_library_and_each_adapter_only_its_framework() -> None:
    for module in sorted(KIT.glob("*.py")):
        tree = ast.parse(module.read_text(encoding="utf-8"))
        names: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        allowed = sys.stdlib_module_names | {"soak_sidecar_kit"} | FRAMEWORKS.get(module.name, set())
        assert names <= allowed, (module.name, names - allowed)


def test_install_launcher_ships_the_kit_and_an_old_python_trainer_imports_it(tmp_path: Path) -> None:
    old_python = require("launcher-python")
    dest = tmp_path / "bin"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_") and k != "PYTHONPATH"}
    subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "install-launcher", "--dest", str(dest)],
        check=True, capture_output=True, env=env,
    )  # fmt: skip
    assert (dest / "kit" / "soak_sidecar_kit" / "__init__.py").read_bytes() == (
        KIT / "__init__.py"
    ).read_bytes()
    progress = tmp_path / "progress"
    trainer = (
        "import soak_sidecar_kit, sys\n"
        "with soak_sidecar_kit.Soak(owner='old-python') as soak:\n"
        "    soak.progress(1)\n"
        "print(soak_sidecar_kit.__file__, sys.version_info[:2])\n"
    )
    # A trainer of the image's (old) Python, with nothing installed: the kit comes from beside the
    # launcher.
    done = subprocess.run(
        [
            sys.executable, "-m", "sidecar.cli", "run", "--local", "--summary-profile", "core",
            "--progress-dir", str(progress), "--output", str(tmp_path / "out"), "--status", "off",
            "--gpu-backend", "none", "--", str(old_python), "-c", trainer,
        ],
        capture_output=True, text=True, timeout=180, check=False,
        env=env,  # the sidecar as installed; the trainer finds the kit only beside the launcher
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (console,) = (tmp_path / "out" / "runs").glob("*/attempt-1/console.log")
    assert "/kit/soak_sidecar_kit/__init__.py" in console.read_text(encoding="utf-8")


# What the own-loop snippet of docs/trainers.md leaves to the user's script.
LOOP_STUBS = """
import os, sys, time
first_step, steps = 1, int(sys.argv[1])
ckpt_path = os.path.join(sys.argv[2], "ckpt.bin")
def save(path):
    with open(path, "wb") as out:
        out.write(b"w" * 1000)
def train_step():
    time.sleep(0.1)
    return 0.5
"""


def run_loop_snippet(tmp_path: Path, steps: int, *flags: str) -> tuple[int, dict[str, Any]]:
    from tests.docs_commands import python_snippets

    snippet = python_snippets(KIT.parent / "docs" / "trainers.md")[
        "Your own loop (plain torchrun, DDP): four lines"
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SOAK_")}
    done = subprocess.run(
        [
            sys.executable, "-m", "sidecar.cli", "run", "--local", "--summary-profile", "core",
            "--status", "off", "--gpu-backend", "none", "--sample-interval", "0.2", *flags, "--",
            sys.executable, "-c", LOOP_STUBS + snippet, str(steps), str(tmp_path),
        ],
        capture_output=True, text=True, timeout=180, check=False, env=env, cwd=tmp_path,
    )  # fmt: skip
    (path,) = (tmp_path / "soak-output" / "runs").glob("*/attempt-1/artifact.json")
    artifact: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return done.returncode, artifact


def test_the_own_loop_snippet_passes(tmp_path: Path) -> None:
    code, artifact = run_loop_snippet(tmp_path, 10)
    assert code == 0, artifact["failure_reason"]
    assert artifact["run_summary"]["steps"] == 9 and artifact["run_summary"]["last_loss"] == 0.5


def test_the_own_loop_snippet_checkpoints_at_the_soft_stop(tmp_path: Path) -> None:
    code, artifact = run_loop_snippet(tmp_path, 100_000, "--budget", "30", "--checkpoint-margin", "20")
    assert code == 14, artifact["failure_reason"]
    (record,) = (tmp_path / "soak-output" / "runs").glob("*/progress/checkpoint.json")
    saved = json.loads(record.read_text(encoding="utf-8"))
    assert saved["path"] == str(tmp_path / "ckpt.bin") and saved["bytes"] == 1000
    assert artifact["phases"]["checkpoint"] is not None
