"""Shared fixtures live in tests/fixtures/, one module per real component."""

pytest_plugins = [
    "tests.fixtures.processes",
    "tests.fixtures.pidns",
    "tests.fixtures.s3",
    "tests.fixtures.kube",
    "tests.fixtures.nvml",
    "tests.fixtures.helm",
]
