"""The kind node image, built offline: kind's own base-image files and build steps over Debian parts.

What ``kind build node-image`` does, with nothing pulled: a base image from ``mmdebstrap`` (systemd,
Debian's containerd, runc and CNI plugins) plus the files of kind's base image (its entrypoint,
systemd units, containerd config) from the kind module; the Kubernetes binaries the harness builds
copied in; the control-plane, CoreDNS, kube-proxy and pause images assembled here and imported into
the node's containerd; then ``docker commit``. The settings these VMs need (REAL-CLUSTER.md:
``restrict_oom_score_adj``, cgroup v1 with cgroupfs) are set in the node's containerd config here
and in the kubelet's by ``tests/kind/kind-config.local.yaml``.

The images land in the Docker daemon that ``docker`` reaches (``DOCKER_HOST``), where kind finds
them. A node image whose inputs are unchanged is reused (its ``soak.inputs`` label).
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from tests.cluster import images
from tests.cluster.system import KUBE_VERSION, REPO_ROOT, coredns_binary, kube_binaries, log, run_logged

NODE_IMAGE = f"soak.local/kind-node:v{KUBE_VERSION}"
# kind's base image installs these (images/base/Dockerfile), with Debian's container runtime instead
# of kind's own builds of containerd, runc and the CNI plugins.
NODE_PACKAGES = (
    "systemd", "systemd-sysv", "dbus", "conntrack", "iptables", "nftables", "iproute2", "ethtool",
    "util-linux", "mount", "kmod", "libseccomp2", "pigz", "bash", "ca-certificates", "jq", "procps",
    "containerd", "runc", "containernetworking-plugins", "socat", "ebtables",
)  # fmt: skip
KUBE_PROXY_PACKAGES = ("iptables", "conntrack", "nftables")
# kubeadm asks for etcd 3.6.6 and CoreDNS 1.13.1; the images carry what tests/kube builds, tagged
# as what they hold, and kind-config.local.yaml points kubeadm at those tags.
ETCD_TAG = "3.6.5-0"
COREDNS_TAG = "v1.14.7"
# No kindnetd image is built here: the node carries a bridge CNI config (kind's podSubnet).
BRIDGE_CNI = {
    "cniVersion": "0.4.0",
    "name": "kind-bridge",
    "plugins": [
        {
            "type": "bridge",
            "bridge": "cni0",
            "isGateway": True,
            "ipMasq": True,
            "hairpinMode": True,
            "ipam": {
                "type": "host-local",
                "ranges": [[{"subnet": "10.244.0.0/16"}]],
                "routes": [{"dst": "0.0.0.0/0"}],
            },
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}
# The steps of kind's base-image Dockerfile that apply to an installed Debian, then the containerd
# base spec it derives with `ctr oci spec` and the links from kind's paths to Debian's.
NODE_SETUP = r"""
set -eu
find /lib/systemd/system/sysinit.target.wants/ -name systemd-tmpfiles-setup.service -delete
rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
    /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
    /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
echo ReadKMsg=no >> /etc/systemd/journald.conf
chmod 755 /kind/bin /kind/bin/* /usr/local/bin/entrypoint
systemctl enable kubelet.service containerd.service undo-mount-hacks.service
systemctl mask systemd-binfmt.service
mkdir -p /etc/kubernetes/manifests /opt/cni
ln -sfn /usr/bin/containerd /usr/local/bin/containerd
ln -sfn /usr/lib/cni /opt/cni/bin
ctr oci spec \
    | jq '.hooks.createContainer += [{"path": "/kind/bin/mount-product-files.sh"}]' \
    | jq 'del(.process.rlimits)' > /etc/containerd/cri-base.json
"""


IMPORT_DIR = "/kind/images-to-import"
IMPORT_IMAGES = f"""
set -eu
containerd & pid=$!
until ctr version >/dev/null 2>&1; do kill -0 $pid; sleep 0.2; done
for image in {IMPORT_DIR}/*.tar; do ctr --namespace=k8s.io images import --all-platforms "$image"; done
kill $pid; wait $pid || true
rm -rf {IMPORT_DIR}
"""


def kind_module_dir() -> Path:
    out = run_logged(["bash", str(REPO_ROOT / "tests" / "kind" / "build.sh"), "--print-source"])
    return Path(out.strip().splitlines()[-1])


def containerd_config(kind_files: Path) -> str:
    """kind's containerd config with the settings of these VMs (REAL-CLUSTER.md 1 and 2)."""
    text = (kind_files / "etc" / "containerd" / "config.toml").read_text(encoding="utf-8")
    replacements = {
        r"SystemdCgroup = true": "SystemdCgroup = false",
        r"restrict_oom_score_adj = false": "restrict_oom_score_adj = true",
        r'sandbox_image = "[^"]*"': f'sandbox_image = "{images.PAUSE_IMAGE}"',
    }
    for pattern, new in replacements.items():
        text, count = re.subn(pattern, new, text)
        if not count:
            raise RuntimeError(f"kind's containerd config no longer has {pattern!r}")
    return text


def docker(*args: str, timeout: float = 1800) -> str:
    return run_logged(["docker", *args], timeout=timeout)


def _binary_image(dest: Path, tag: str, binary: Path, path: str, entrypoint: list[str]) -> Path:
    if not dest.is_file():
        images.single_layer_image(dest, tag, {path: (binary.read_bytes(), 0o755)}, entrypoint)
    return dest


def node_images(kube: Path) -> list[Path]:
    """docker-save tarballs of every image the node needs before kubeadm starts (nothing is pulled)."""
    out = images.images_dir()
    key = images._digest(KUBE_VERSION.encode(), kube.name.encode(), (kube / ".stamp").read_bytes())
    made = [images.pause_image()]
    for name in ("kube-apiserver", "kube-controller-manager", "kube-scheduler"):
        tag = f"registry.k8s.io/{name}:v{KUBE_VERSION}"
        made.append(
            _binary_image(out / f"{name}-{key}.tar", tag, kube / name, f"usr/local/bin/{name}", [name])
        )
    etcd_tag = f"registry.k8s.io/etcd:{ETCD_TAG}"
    made.append(
        _binary_image(out / f"etcd-{key}.tar", etcd_tag, kube / "etcd", "usr/local/bin/etcd", ["etcd"])
    )
    coredns = coredns_binary()
    coredns_tag = f"registry.k8s.io/coredns/coredns:{COREDNS_TAG}"
    made.append(
        _binary_image(
            out / f"coredns-{coredns.parent.name}.tar", coredns_tag, coredns, "coredns", ["/coredns"]
        )
    )
    made.append(kube_proxy_image(kube / "kube-proxy", key))
    return made


def kube_proxy_image(binary: Path, key: str) -> Path:
    """kube-proxy needs iptables and conntrack beside it: a small Debian rootfs with the binary."""
    dest = images.images_dir() / f"kube-proxy-{key}.tar"
    if dest.is_file():
        return dest
    rootfs = images.base_rootfs(KUBE_PROXY_PACKAGES)
    tag = f"registry.k8s.io/kube-proxy:v{KUBE_VERSION}"
    with build_container(rootfs, "soak.local/kube-proxy-base:" + rootfs.stem) as container:
        docker("cp", str(binary), f"{container}:/usr/local/bin/kube-proxy")
        docker("commit", container, tag)
    tmp = images._atomic_output(dest)
    docker("save", "--output", str(tmp), tag, timeout=600)
    tmp.replace(dest)
    return dest


@contextlib.contextmanager
def build_container(rootfs: Path, tag: str, *, privileged: bool = False) -> Iterator[str]:
    """A container of ``rootfs`` (imported as ``tag``) that sleeps while it is set up; removed after."""
    docker("import", str(rootfs), tag, timeout=600)
    argv = ["run", "-d", "--entrypoint=sleep"] + (["--privileged"] if privileged else []) + [tag, "infinity"]
    container = docker(*argv).strip()
    try:
        yield container
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", container], capture_output=True, check=False)


def inputs_key(parts: list[Path], kind_files: Path) -> str:
    names = sorted(p.name for p in parts)
    return images._digest(
        json.dumps(names).encode(),
        Path(__file__).read_bytes(),
        *(p.read_bytes() for p in sorted(kind_files.rglob("*")) if p.is_file()),
    )


def node_image() -> str:
    """Build (or reuse) ``NODE_IMAGE`` in the Docker daemon ``docker`` reaches; returns its tag."""
    kube = kube_binaries(node=True, kind=True)
    kind_bins = Path(
        run_logged(["bash", str(REPO_ROOT / "tests" / "kind" / "build.sh")]).strip().splitlines()[-1]
    )
    kind_files = kind_module_dir() / "images" / "base" / "files"
    rootfs = images.base_rootfs(NODE_PACKAGES)
    parts = [*node_images(kube), rootfs, kube / ".stamp"]
    key = inputs_key(parts, kind_files)
    existing = subprocess.run(
        ["docker", "image", "inspect", "--format", '{{index .Config.Labels "soak.inputs"}}', NODE_IMAGE],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    if existing.returncode == 0 and existing.stdout.strip() == key:
        log(f"reusing {NODE_IMAGE}")
        return NODE_IMAGE
    started = time.monotonic()
    with (
        build_container(rootfs, "soak.local/kind-base:" + rootfs.stem, privileged=True) as container,
        tempfile.TemporaryDirectory() as tmp,
    ):
        stage = Path(tmp) / "root"
        _stage_files(stage, kind_files, kube, kind_bins)
        docker("cp", f"{stage}/.", f"{container}:/")
        docker("exec", container, "sh", "-c", NODE_SETUP)
        _import_images(container, parts[:-2])
        docker("commit", container, NODE_IMAGE + "-unfinished")
        # `docker commit --change` cannot set STOPSIGNAL: a Dockerfile that needs nothing from outside.
        context = Path(tmp) / "context"
        context.mkdir()
        (context / "Dockerfile").write_text(
            f"FROM {NODE_IMAGE}-unfinished\nENV container=docker\nSTOPSIGNAL SIGRTMIN+3\n"
            f'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]\nLABEL soak.inputs={key}\n',
            encoding="utf-8",
        )
        run_logged(
            ["docker", "build", "--network=none", "--pull=false", "--tag", NODE_IMAGE, str(context)],
            env={"DOCKER_BUILDKIT": "0"},
        )
        docker("rmi", NODE_IMAGE + "-unfinished")
    size = int(docker("image", "inspect", "--format", "{{.Size}}", NODE_IMAGE).strip())
    log(f"{NODE_IMAGE}: {size >> 20} MiB, built in {time.monotonic() - started:.0f} s")
    return NODE_IMAGE


def _stage_files(stage: Path, kind_files: Path, kube: Path, kind_bins: Path) -> None:
    subprocess.run(["cp", "-a", f"{kind_files}/.", str(stage)], check=True)
    (stage / "etc" / "containerd" / "config.toml").write_text(containerd_config(kind_files), encoding="utf-8")
    cni = stage / "etc" / "cni" / "net.d"
    cni.mkdir(parents=True)
    (cni / "10-kind-bridge.conflist").write_text(json.dumps(BRIDGE_CNI, indent=2), encoding="utf-8")
    (stage / "kind" / "version").write_text(f"v{KUBE_VERSION}", encoding="utf-8")
    usr_bin = stage / "usr" / "bin"
    usr_bin.mkdir(parents=True, exist_ok=True)
    for name in ("kubelet", "kubeadm", "kubectl"):
        subprocess.run(["cp", str(kube / name), str(usr_bin / name)], check=True)
    subprocess.run(
        ["cp", str(kind_bins / "crictl"), str(stage / "usr" / "local" / "bin" / "crictl")], check=True
    )
    subprocess.run(["chmod", "-R", "u+w,go-w", str(stage)], check=True)


def _import_images(container: str, tarballs: list[Path]) -> None:
    """Import into the node's containerd as kind's builder does: containerd runs for the import only."""
    docker("exec", container, "mkdir", "-p", IMPORT_DIR)
    for tarball in tarballs:
        docker("cp", str(tarball), f"{container}:{IMPORT_DIR}/{tarball.name}")
    docker("exec", container, "sh", "-c", IMPORT_IMAGES)
