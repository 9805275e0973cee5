"""The parts of the offline kind node (tests/cluster/kind_image.py) that can be checked without
building it: its kind config through kind's own loader, its containerd config, and runc-bounded
running a real container with every capability asked for, as Docker asks for a --privileged one."""

from __future__ import annotations

import json
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import tomllib
import yaml

from tests.cluster import images, kind, kind_image
from tests.cluster.system import REPO_ROOT
from tests.components import require

pytestmark = [pytest.mark.integration, pytest.mark.kind]

RUNC_BOUNDED = REPO_ROOT / "tests" / "kind" / "runc-bounded"


def test_the_local_kind_config_passes_kinds_checks_and_names_the_image_built_here() -> None:
    binary = require("kind-binaries") / "kind-config-check"
    result = subprocess.run(
        [str(binary), str(kind.KIND_CONFIG_LOCAL)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["control-plane", kind_image.NODE_IMAGE]


def test_the_local_config_with_the_trainer_mounts_passes_kinds_checks(tmp_path: Path) -> None:
    """What create_cluster hands kind under SOAK_KIND_NODE=local: the local config plus extraMounts."""
    binary = require("kind-binaries") / "kind-config-check"
    rendered = tmp_path / "kind-config.yaml"
    mounts = (tmp_path, REPO_ROOT / "tests" / "trainers")
    rendered.write_text(yaml.safe_dump(kind.with_mounts(kind.KIND_CONFIG_LOCAL, mounts)), encoding="utf-8")
    result = subprocess.run(
        [str(binary), str(rendered)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    (node,) = yaml.safe_load(rendered.read_text(encoding="utf-8"))["nodes"]
    assert [m["hostPath"] for m in node["extraMounts"]] == [str(m) for m in mounts]
    assert all(m["readOnly"] and m["containerPath"] == m["hostPath"] for m in node["extraMounts"])


def test_the_nodes_containerd_config_is_kinds_with_the_settings_these_vms_need() -> None:
    require("kind-binaries")
    files = kind_image.kind_module_dir() / "images" / "base" / "files"
    config = tomllib.loads(kind_image.containerd_config(files))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True  # no CAP_SYS_RESOURCE: no negative oom_score_adj
    assert cri["sandbox_image"] == images.PAUSE_IMAGE  # built here, never pulled
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False  # cgroupfs
    assert cri["containerd"]["runtimes"]["runc"]["base_runtime_spec"] == "/etc/containerd/cri-base.json"


# What Docker 20.10 asks for a --privileged container: every capability the kernel knows.
ALL_CAPS = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
]


def _bounding_set() -> int:
    for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
        if line.startswith("CapBnd:"):
            return int(line.split()[1], 16)
    raise AssertionError("no CapBnd in /proc/self/status")


def _privileged_bundle(tmp_path: Path) -> Path:
    """An OCI bundle asking for every capability, running a static binary (crictl --version)."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    shutil.copy(require("kind-binaries") / "crictl", bundle / "rootfs" / "crictl")
    subprocess.run(["runc", "spec", "--bundle", str(bundle)], check=True, timeout=60)
    spec = json.loads((bundle / "config.json").read_text(encoding="utf-8"))
    spec["process"].update(args=["/crictl", "--version"], terminal=False)
    spec["process"]["capabilities"] = {
        kind_: list(ALL_CAPS) for kind_ in ("bounding", "effective", "permitted")
    }
    spec["root"]["readonly"] = False
    (bundle / "config.json").write_text(json.dumps(spec), encoding="utf-8")
    return bundle


def _run(runtime: str, bundle: Path, state: Path) -> subprocess.CompletedProcess[str]:
    argv = [
        runtime,
        "--root",
        str(state),
        "run",
        "--bundle",
        str(bundle),
        f"soak-test-{uuid.uuid4().hex[:8]}",
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_runc_bounded_starts_a_container_asking_for_every_capability(tmp_path: Path) -> None:
    require("root")
    if shutil.which("runc") is None:
        pytest.fail("runc is not installed (apt-get install runc)")
    bundle = _privileged_bundle(tmp_path)
    state = tmp_path / "state"
    if _bounding_set() & (1 << 24) == 0:  # this VM lacks CAP_SYS_RESOURCE: plain runc must fail
        plain = _run("runc", bundle, state)
        assert plain.returncode != 0 and "apply caps" in plain.stderr, plain.stderr
    bounded = _run(str(RUNC_BOUNDED), bundle, state)
    assert bounded.returncode == 0, bounded.stderr
    assert "crictl version" in bounded.stdout, bounded.stdout
