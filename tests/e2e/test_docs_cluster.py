"""Every ``helm``, ``kubectl`` and ``soak-sidecar`` cluster command of README.md and docs/helm.md,
run as written (placeholders swapped by tests/docs_commands.py's one table) against the e2e cluster,
in the order the docs give them, with KUBECONFIG set and helm/kubectl on PATH as a user's shell has."""

from __future__ import annotations

import subprocess

import pytest

from tests.cluster.providers import S3_SECRET, E2ECluster
from tests.docs_commands import REPO_ROOT, doc_commands

pytestmark = [pytest.mark.e2e, pytest.mark.helm]

CLUSTER = [c for c in doc_commands() if not c.text.startswith("soak-sidecar run --local")]
SOAK_TIMEOUT_S = 300


def _namespace_of(text: str) -> str:
    words = text.split()
    return words[words.index("-n") + 1] if "-n" in words else "default"


def test_docs_cluster_commands_as_written(e2e: E2ECluster) -> None:
    assert {c.tool for c in CLUSTER} == {"helm", "kubectl", "soak-sidecar"}, [c.text for c in CLUSTER]
    secret = e2e.get_json("secret", S3_SECRET, "-n", "soak-e2e")
    installed: list[tuple[str, str]] = []
    try:
        for command in CLUSTER:
            namespace = _namespace_of(command.text)
            if command.tool == "helm" and command.text.split()[1] == "install":
                e2e.kubectl("create", "namespace", namespace, check=False)
                e2e.apply(
                    [
                        {
                            "apiVersion": "v1",
                            "kind": "Secret",
                            "type": "Opaque",
                            "metadata": {"name": S3_SECRET, "namespace": namespace},
                            "data": secret["data"],
                        }
                    ]
                )
                installed.append((command.text.split()[2], namespace))
            if command.tool == "soak-sidecar" and command.text.split()[1] == "verdict":
                # A user reads the verdict once the soak is over.
                e2e.wait_job_finished(command.text.split()[2], SOAK_TIMEOUT_S, namespace=namespace)
            result = subprocess.run(
                ["bash", "-c", command.substituted(s3=e2e.s3_endpoint)],
                cwd=REPO_ROOT,
                env=e2e.env,
                capture_output=True,
                text=True,
                timeout=SOAK_TIMEOUT_S + 60,
                check=False,
            )
            assert result.returncode == command.expected_exit, (
                f"{command.source}: {command.text}\n{result.stdout[-2000:]}\n{result.stderr[-2000:]}"
            )
    finally:
        for release, namespace in installed:
            e2e.helm_uninstall(release, namespace=namespace)
