"""The Dockerfile: hadolint, pinning, non-root, build context, and its build steps run for real.

The image itself is built by the e2e harness (tests/cluster/images.py: dockerd, offline) and run on
the real node; the steps that can run without an engine (the mock NVML build, the launcher install)
also run here as the image would.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.components import require

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO_ROOT / "Dockerfile"
KIND_CONFIG = REPO_ROOT / "kind-config.yaml"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        logical.append(pending.strip())
        pending = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1]) for text in logical]


def hadolint() -> str:
    return str(require("hadolint"))


def test_hadolint_is_clean() -> None:
    result = subprocess.run(
        [hadolint(), "--failure-threshold", "style", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_flags_a_sloppy_dockerfile(tmp_path: Path) -> None:
    """The lint above can fail: an unpinned base and an uncleaned apt install are reported."""
    sloppy = tmp_path / "Dockerfile"
    sloppy.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y gcc\n")
    result = subprocess.run(
        [hadolint(), "--failure-threshold", "style", str(sloppy)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # latest tag
    assert "DL3009" in result.stdout  # apt lists left behind


def test_base_is_pinned_by_tag_and_digest() -> None:
    steps = instructions()
    (default,) = [args for name, args in steps if name == "ARG" and args.startswith("PYTHON_IMAGE=")]
    image = default.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.12-slim-bookworm@sha256:[0-9a-f]{64}", image), image
    froms = [args for name, args in steps if name == "FROM"]
    assert len(froms) == 2, "multi-stage: a build stage and the runtime stage"
    # The build stage's base defaults to the same pinned image (an offline build may name one with gcc).
    assert ("ARG", "BUILD_IMAGE=${PYTHON_IMAGE}") in steps
    assert [args.split()[0] for args in froms] == ["${BUILD_IMAGE}", "${PYTHON_IMAGE}"]


def test_runtime_stage_is_non_root_with_the_chart_uid() -> None:
    steps = instructions()
    runtime = steps[max(i for i, (name, _) in enumerate(steps) if name == "FROM") :]
    (user,) = [args for name, args in runtime if name == "USER"]
    (uid_arg,) = [args for name, args in runtime if name == "ARG" and args.startswith("SOAK_UID=")]
    uid = int(uid_arg.split("=", 1)[1])
    assert user == "${SOAK_UID}:${SOAK_UID}"
    assert uid > 0
    import yaml

    chart_values = yaml.safe_load((REPO_ROOT / "helm/soak-sidecar/values.yaml").read_text())
    assert chart_values["podSecurity"]["runAsUser"] == uid
    assert ("ENTRYPOINT", '["soak-sidecar"]') in runtime
    # Nothing but the venv and the mock library comes from the build stage (no compiler).
    copies = [args for name, args in runtime if name == "COPY"]
    assert copies == [
        "--from=build /opt/venv /opt/venv",
        "--from=build /opt/soak/nvml-mock /opt/soak/nvml-mock",
    ]
    assert not [args for name, args in runtime if name == "RUN" and "apt-get" in args]


def test_build_context_holds_what_the_build_copies() -> None:
    ignore = (REPO_ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*") :].count("*") == 1, ".dockerignore starts from nothing"
    for name, args in instructions():
        if name != "COPY" or args.startswith("--from"):
            continue
        *sources, _dest = args.split()
        for source in sources:
            assert (REPO_ROOT / source).exists(), source
            assert f"!{source.rstrip('/')}" in ignore or f"!{source}" in ignore, source
    assert (REPO_ROOT / "sidecar/nvml_mock/nvml_mock.c").is_file()


def test_mock_nvml_build_step(tmp_path: Path) -> None:
    """The build stage's `python -m sidecar.nvml_mock.build /opt/soak/nvml-mock`, run here."""
    require("gcc")
    run_steps = " ".join(args for name, args in instructions() if name == "RUN")
    assert "-m sidecar.nvml_mock.build /opt/soak/nvml-mock" in run_steps
    out = tmp_path / "nvml-mock"
    result = subprocess.run(
        [sys.executable, "-m", "sidecar.nvml_mock.build", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    library = out / "libnvidia-ml.so.1"
    assert library.stat().st_mode & 0o005 == 0o005, "a non-root sidecar must be able to map it"
    # Loaded in a child: a library with pynvml's soname loaded here would shadow the mock that
    # later NVML tests in this process point pynvml at.
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import ctypes, sys; lib = ctypes.CDLL(sys.argv[1]); "
            "print(hasattr(lib, 'nvmlInit_v2') and hasattr(lib, 'nvmlDeviceGetCount_v2'))",
            str(library),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert probe.stdout.strip() == "True", probe.stderr
    env_lines = " ".join(args for name, args in instructions() if name == "ENV")
    assert "SOAK_GPU__MOCK_LIBRARY_DIR=/opt/soak/nvml-mock" in env_lines


def test_install_launcher_step(tmp_path: Path) -> None:
    """The chart's init container command, run against the installed package."""
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from sidecar.cli import main; raise SystemExit(main())",
            "install-launcher",
            "--dest",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    launcher = tmp_path / "soak-launcher.py"
    assert launcher.is_file()
    help_run = subprocess.run(
        [sys.executable, "-I", "-S", str(launcher), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert help_run.returncode == 0, help_run.stderr
    assert "--run-dir" in help_run.stdout


def test_kind_node_image_is_pinned_by_digest() -> None:
    import yaml

    config = yaml.safe_load(KIND_CONFIG.read_text())
    assert config["kind"] == "Cluster"
    assert config["apiVersion"] == "kind.x-k8s.io/v1alpha4"
    for node in config["nodes"]:
        assert re.fullmatch(r"kindest/node:v1\.3\d+\.\d+@sha256:[0-9a-f]{64}", node["image"]), node


def locked(lock: Path) -> dict[str, str]:
    """name -> version of every pin in a lock file, each of which must carry hashes."""
    pins: dict[str, str] = {}
    entries = re.split(r"\n(?=[A-Za-z0-9])", lock.read_text())
    for entry in entries:
        if entry.startswith("#") or "==" not in entry:
            continue
        name, _, rest = entry.partition("==")
        version = rest.split()[0]
        assert "--hash=sha256:" in entry, f"{lock.name}: {name} has no hash"
        pins[re.sub(r"\[.*\]", "", name).lower().replace("_", "-")] = version
    return pins


def test_dependencies_are_locked_with_hashes_and_installed_from_the_lock() -> None:
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    runtime, dev = locked(REPO_ROOT / "requirements.lock"), locked(REPO_ROOT / "requirements-dev.lock")
    for requirement in project["dependencies"]:
        name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()
        assert name in runtime and runtime[name] == dev.get(name), f"{name}: re-lock both files"
    for requirement in project["optional-dependencies"]["dev"]:
        name = re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower()
        assert name in dev, f"{name} is not in requirements-dev.lock"
    runs = " ".join(arguments for instruction, arguments in instructions() if instruction == "RUN")
    assert runs.count("--require-hashes -r requirements.lock") == 2  # online and offline builds
    assert ".[dev]" not in (REPO_ROOT / ".ci" / "run").read_text()
    assert "--require-hashes -r requirements-dev.lock" in (REPO_ROOT / ".ci" / "run").read_text()


def test_every_package_the_project_ships_is_copied_into_the_build() -> None:
    """pip installs the project from the copied sources: a package left out of the COPY lines (and
    the context) would be missing from the image while every local test passes."""
    import tomllib

    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    packages = [name.rstrip("*") for name in project["tool"]["setuptools"]["packages"]["find"]["include"]]
    copied = {args.split()[0].rstrip("/") for name, args in instructions() if name == "COPY"}
    assert packages and all(package in copied for package in packages), (packages, copied)
