"""Every ``helm``, ``kubectl`` and ``soak-sidecar`` cluster command of README.md and docs/helm.md,
run as written (placeholders swapped by tests/docs_commands.py's one table) against the e2e cluster,
in the order the docs give them, with KUBECONFIG set and helm/kubectl on PATH as a user's shell has.
The docs create their own Secrets and namespaces; what they made is removed afterwards."""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster.providers import S3_SECRET, E2ECluster
from tests.docs_commands import REPO_ROOT, doc_commands

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

CLUSTER = [c for c in doc_commands() if not c.text.startswith("soak-sidecar run --local")]
COMMAND_TIMEOUT_S = 360


def _namespace_of(text: str) -> str:
    words = text.split()
    return words[words.index("-n") + 1] if "-n" in words else "default"


def test_docs_cluster_commands_as_written(e2e: E2ECluster) -> None:
    assert {c.tool for c in CLUSTER} == {"helm", "kubectl", "soak-sidecar"}, [c.text for c in CLUSTER]
    access_key, secret_key = e2e.s3_credentials
    installed: list[tuple[str, str]] = []
    try:
        for command in CLUSTER:
            words = command.text.split()
            if words[:2] == ["helm", "install"]:
                installed.append((words[2], _namespace_of(command.text)))
            result = subprocess.run(
                [
                    "bash",
                    "-c",
                    command.substituted(s3=e2e.s3_endpoint, access_key=access_key, secret_key=secret_key),
                ],
                cwd=REPO_ROOT,
                env=e2e.env,
                capture_output=True,
                text=True,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
            )
            assert result.returncode == command.expected_exit, (
                f"{command.source}: {command.text}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
            )
    finally:
        for release, namespace in installed:
            e2e.helm_uninstall(release, namespace=namespace)
        e2e.kubectl("delete", "secret", S3_SECRET, "-n", "default", "--ignore-not-found", check=False)
        e2e.kubectl("delete", "namespace", "ml", "--ignore-not-found", "--wait=false", check=False)
