"""The suite's own rules: a missing component skips outside CI and fails in it, a skip fails a
SOAK_REQUIRE_ALL=1 session, and a test that leaves a process behind fails."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.components import COMPONENTS, REPO_ROOT, REQUIRE_ALL, forget_probes, require

pytestmark = pytest.mark.integration

# Each component made absent for real, by the knob its probe reads.
ABSENT = {
    "weed": {"SOAK_WEED_BIN": "/nonexistent/weed"},
    "helm": {"SOAK_HELM_BIN": "/nonexistent/helm"},
    "kubectl": {"SOAK_KUBECTL_BIN": "/nonexistent/kubectl", "PATH": "/nonexistent"},
    "trainer-venv": {"SOAK_TRAINER_PYTHON": "/nonexistent/python"},
    "browser": {"PATH": "/nonexistent"},
    "launcher-python": {"SOAK_LAUNCHER_PYTHON": "/nonexistent/python3.9"},
    "gcc": {"PATH": "/nonexistent"},
    "hadolint": {"PATH": "/nonexistent"},
    "pidns": {"PATH": "/nonexistent"},
}


@pytest.fixture
def fresh_probes() -> Iterator[None]:
    forget_probes()
    yield
    forget_probes()  # the next test probes the machine as it really is


@pytest.mark.parametrize("name", sorted(ABSENT))
def test_an_absent_component_skips_with_its_hint_and_fails_under_require_all(
    name: str, fresh_probes: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(REQUIRE_ALL, raising=False)  # .ci/run sets it for the suite around this test
    for key, value in ABSENT[name].items():
        monkeypatch.setenv(key, value)
    with pytest.raises(pytest.skip.Exception, match=f"missing component '{name}'") as skipped:
        require(name)
    assert COMPONENTS[name].hint in str(skipped.value)
    monkeypatch.setenv(REQUIRE_ALL, "1")
    with pytest.raises(pytest.fail.Exception, match=f"missing component '{name}'"):
        require(name)


def run_pytest(tmp_path: Path, test_source: str, **env: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of its own on one test file, with this suite's plugins, free of the
    knobs .ci/run sets for the outer session (SOAK_REQUIRE_ALL; CI, which changes pytest's output)."""
    outer = {
        key: value for key, value in os.environ.items() if key not in {REQUIRE_ALL, "CI", "PYTEST_ADDOPTS"}
    }
    test_file = tmp_path / "test_generated.py"
    test_file.write_text(textwrap.dedent(test_source))
    argv = [sys.executable, "-m", "pytest", "-p", "tests.fixtures.leftovers", "-p", "tests.components"]
    return subprocess.run(
        [*argv, "-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path), str(test_file)],
        cwd=tmp_path,
        env={**outer, "PYTHONPATH": str(REPO_ROOT), **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


SKIPPING = """
    import pytest

    def test_runs() -> None:
        pass

    def test_skips() -> None:
        pytest.skip("nothing to see")
"""


def test_a_skip_fails_the_session_only_under_require_all(tmp_path: Path) -> None:
    relaxed = run_pytest(tmp_path, SKIPPING)
    assert relaxed.returncode == 0, relaxed.stdout
    assert "skipped tests: 1" in relaxed.stdout
    strict = run_pytest(tmp_path, SKIPPING, **{REQUIRE_ALL: "1"})
    assert strict.returncode == 1, strict.stdout
    assert "skipped tests: 1" in strict.stdout and "test_generated.py::test_skips" in strict.stdout


LEAKING = """
    import os, subprocess, sys

    def test_an_unreaped_child() -> None:
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])

    def test_a_daemon_with_a_scrubbed_environment() -> None:
        code = "import os, time\\nif os.fork() == 0:\\n    os.setsid()\\n    time.sleep(120)\\n"
        subprocess.run([sys.executable, "-c", code], env={}, check=True)

    def test_a_reaped_child() -> None:
        subprocess.run([sys.executable, "-c", "pass"], check=True)

    def test_an_orphan_that_ends_soon() -> None:
        code = "import os, time\\nif os.fork() == 0:\\n    time.sleep(0.3)\\n"
        subprocess.run([sys.executable, "-c", code], check=True)
"""


def test_a_test_that_leaves_a_process_behind_fails_and_the_process_is_killed(tmp_path: Path) -> None:
    done = run_pytest(tmp_path, LEAKING)
    assert done.returncode == 1, done.stdout
    assert "4 passed, 2 errors" in done.stdout, done.stdout  # two leaked: errors at teardown
    for test in ("test_an_unreaped_child", "test_a_daemon_with_a_scrubbed_environment"):
        assert f"ERROR test_generated.py::{test}" in done.stdout, done.stdout
    assert done.stdout.count("the test left processes behind") == 2
    assert "time.sleep(120)" in done.stdout  # the leftover's command line names it
