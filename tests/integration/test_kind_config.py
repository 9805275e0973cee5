"""kind's own checks of what the README's kind path runs: ``kind-config.yaml`` through kind's config
loader and validation (the pinned release, built from its Go module by tests/kind/build.sh), and the
kind provider's commands through the real ``kind`` binary as far as they go without a container
runtime: each must pass kind's parsing of its command line and stop only for want of one."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.cluster import kind
from tests.components import require

pytestmark = [pytest.mark.integration, pytest.mark.kind]

KIND_NODE_IMAGE = (
    "kindest/node:v1.33.1@sha256:050072256b9a903bd914c0b2866828150cb229cea0efe5892e2b644d5dd3b34f"
)


def check(config: Path) -> subprocess.CompletedProcess[str]:
    binary = require("kind-binaries") / "kind-config-check"
    return subprocess.run([str(binary), str(config)], capture_output=True, text=True, timeout=60, check=False)


def test_the_kind_config_passes_kinds_own_loader_and_validation() -> None:
    result = check(kind.KIND_CONFIG)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["control-plane", KIND_NODE_IMAGE]


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (("nodes:", "nodez:"), "unable to decode config"),  # a misspelt field: strict decoding
        (("role: control-plane", "role: controlplane"), "role"),
        (("apiVersion: kind.x-k8s.io/v1alpha4", "apiVersion: kind.x-k8s.io/v1alpha9"), "unknown apiVersion"),
        (("name: soak-sidecar", "name: Soak_Sidecar"), "not a valid cluster name"),
    ],
)
def test_a_broken_field_fails_kinds_checks(tmp_path: Path, change: tuple[str, str], error: str) -> None:
    text = kind.KIND_CONFIG.read_text(encoding="utf-8")
    assert change[0] in text
    broken = tmp_path / "kind-config.yaml"
    broken.write_text(text.replace(change[0], change[1]), encoding="utf-8")
    result = check(broken)
    assert result.returncode == 1 and error in result.stderr, result.stderr


def test_the_providers_commands_parse_and_stop_only_for_want_of_a_runtime(tmp_path: Path) -> None:
    """With no docker, podman or nerdctl on PATH, kind gets as far as choosing a provider: a wrong
    flag, argument count or subcommand would stop it earlier, with its own message."""
    binary = require("kind-binaries") / "kind"
    version = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=60, check=True)
    assert version.stdout.startswith("kind v0.29.0 "), version.stdout  # the release of the node image
    bare = tmp_path / "bin"
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare), "KIND_EXPERIMENTAL_PROVIDER": ""}
    kubeconfig = tmp_path / "kubeconfig"
    for argv in (
        kind.create_argv("soak-e2e", kubeconfig),
        kind.load_argv("soak-e2e"),
        kind.delete_argv("soak-e2e", kubeconfig),
    ):
        result = subprocess.run(
            [str(binary), *argv[1:]], capture_output=True, text=True, timeout=60, env=env, check=False
        )
        said = result.stdout + result.stderr
        for parse_error in ("unknown flag", "unknown command", "accepts", "requires", "invalid argument"):
            assert parse_error not in said, (argv, said)
        # stopped where a runtime is needed: docker's info, its node list, the image in its store
        assert result.returncode != 0 and ("docker" in said or "not present locally" in said), (argv, said)
        print(f"{' '.join(argv[:3])}: exit {result.returncode}: {said.strip()[-300:]}")
