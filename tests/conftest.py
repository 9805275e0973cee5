"""Shared fixtures live in tests/fixtures/, one module per real component."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

pytest_plugins = [
    # First: the modules below import these two, and a plugin must be registered before it is imported.
    "tests.fixtures.leftovers",
    "tests.components",
    "tests.fixtures.processes",
    "tests.fixtures.pidns",
    "tests.fixtures.s3",
    "tests.fixtures.clockshim",
    "tests.fixtures.kube",
    "tests.fixtures.nvml",
    "tests.fixtures.helm",
    "tests.fixtures.s3_servers",  # imports tests.fixtures.helm
]

# SOAK_* variables that steer the test harness, not the product's settings.
HARNESS_VARIABLES = frozenset(
    {
        "SOAK_E2E",
        "SOAK_E2E_KEEP",
        "SOAK_KUBE_CACHE",
        "SOAK_HELM_BIN",
        "SOAK_S3RVER_BIN",
        "SOAK_KUBECTL_BIN",
        "SOAK_TRAINER_PYTHON",
        "SOAK_REQUIRE_ALL",
        "SOAK_WEED_BIN",
        "SOAK_LAUNCHER_PYTHON",
    }
)


@pytest.fixture(autouse=True)
def isolated_from_the_caller(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts from the product's defaults and the default signal dispositions, whatever the
    caller's shell holds: its SOAK_* settings are removed (a stray SOAK_MONITOR__SAMPLE_INTERVAL_S
    must not fail a test), and SIGINT/SIGTERM/SIGHUP are not ignored (a background CI job ignores
    SIGINT, ``nohup`` SIGHUP, and children would inherit that across exec)."""
    for key in list(os.environ):
        if key.startswith("SOAK_") and key not in HARNESS_VARIABLES:
            monkeypatch.delenv(key)
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    yield
    for signum, handler in saved.items():
        signal.signal(signum, handler)
