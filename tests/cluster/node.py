"""A real single-node Kubernetes on this machine (root): the ``node`` cluster provider.

containerd, runc and the CNI plugins come from Debian; etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kubelet from ``tests/kube/build.sh``; the pause and project images from
``tests.cluster.images``. Pods live on a bridge this harness creates (``soak-e2eX``, 10.87.X.0/24,
no masquerade: pods reach only the node), the apiserver listens on the bridge's address, and one
iptables DNAT rule stands in for kube-proxy (``10.96.0.1:443``). The settings follow
``../shared/REAL-CLUSTER.md`` (restrict_oom_score_adj, oomScoreAdj 0, cgroupfs on cgroup v1).

Several nodes can run on one machine at once (two test runs, or a node brought up by hand beside a
test run), so nothing a node takes is fixed:

- Ports are chosen free when a :class:`RealNode` is made (:class:`NodePorts`, through
  ``tests.cluster.system.free_ports``) and checked again just before the components bind them: etcd's
  client and peer ports and CoreDNS's ready port on 127.0.0.1, the apiserver's secure port and the
  kubelet's port on the node's address. Everything else listens nowhere or on a port the kernel picks
  at bind: kube-controller-manager and kube-scheduler ``--secure-port=0`` (no serving), the kubelet's
  healthz and read-only ports 0 (off), containerd's CRI streaming server on 127.0.0.1 port 0.
- The network and the names come from a slot claimed in :func:`tests.cluster.hostshare.claim_slot`
  when the node starts: bridge ``soak-e2eX``, subnet ``10.87.X.0/24`` with the node at ``10.87.X.1``,
  chains ``SOAK-E2EX-APISERVER`` and ``SOAK-E2EX-FORWARD``, CNI network ``soak-e2eX``, and the
  kubelet's ``cgroupRoot`` ``/soak-e2eX`` (pods' cgroups under it, not under a host-wide
  ``/kubepods``). CoreDNS listens on the node's own address, port 53 (the port a pod's resolv.conf
  implies; the address is the node's, so two nodes never clash on it).
- State lives under ``workdir``: containerd's root, state, sockets and runc root, network namespaces
  (``netns_mounts_under_state_dir``), the CNI config and host-local IPAM data, the kubelet's root and
  cert dirs, pod logs, etcd, the PKI, kubeconfigs and logs.
- The ``10.96.0.1:443`` DNAT that every pod uses is per node: PREROUTING jumps to the node's chain,
  whose rule matches the node's pod subnet as source, so each node's pods reach their own apiserver.

What stays fixed, and why it is shared rather than per node (:mod:`tests.cluster.hostshare`: the first
node up records which of these did not exist, the last one down removes them):

- ``/run/containerd``: containerd 1.6 puts its shims' sockets under ``/run/containerd/s/`` whatever
  its state dir (each named by a hash of the node's own containerd address, so they never clash).
- ``/var/lib/cni``: the CNI result cache (libcni's default; containerd 1.6's CRI has no setting for
  it); entries are named by network (per node) and container id.
- ``/var/lib/kubelet``: the kubelet's device-plugin socket and checkpoint live in
  ``/var/lib/kubelet/device-plugins`` whatever ``--root-dir`` says (a compiled-in path). The kubelet
  that starts last owns the socket; no device plugins run here, so the other kubelet loses nothing.
- ``/var/log/containers``: the kubelet's compiled-in container log links (named by pod, namespace,
  container and container id).
- ``/var/log/pods`` and ``/run/netns``: no longer written (``podLogsDir`` and netns mounts are in the
  workdir), watched in case a component falls back to them.
- The kubelet's own iptables chains ``KUBE-FIREWALL``, ``KUBE-KUBELET-CANARY`` and
  ``KUBE-IPTABLES-HINT`` (fixed names in the kubelet; every kubelet ensures the same ones).
- Host-originated traffic to ``10.96.0.1`` (the nat OUTPUT hook): a process in the host's network
  namespace (a ``hostNetwork`` pod) carries no mark of its node, so no DNAT can pick the right
  apiserver; the nodes install no OUTPUT rule, and a ``hostNetwork`` pod must use the apiserver's
  address from its kubeconfig. Nothing in this project runs one (the chart forbids ``hostNetwork``).

:meth:`RealNode.down` stops everything and removes what it made, inside and outside the workspace:
processes, mounts, network namespaces, the bridge, its iptables rules and chains, its cgroups, and,
when it is the last node on the machine, the shared host paths and chains above.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.cluster import hostshare, images
from tests.cluster.hostshare import HOST_PATHS, KUBELET_CHAINS, HostSlot, Member, chain_exists, iptables
from tests.cluster.pki import make_pki
from tests.cluster.system import (
    CGROUP_ROOT,
    HostFootprint,
    coredns_binary,
    free_ports,
    kube_binaries,
    log,
    port_free,
    remove_cgroups,
    run_logged,
    unmount_under,
)
from tests.docs_commands import CHART_IMAGE
from tests.fixtures.processes import start_server
from tests.waiting import wait_until

# Inside the cluster, the same on every node (they do not meet on the host: the service DNAT is per node).
SERVICE_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
NODE_NAME = "soak-node"
# Cluster DNS: CoreDNS on the node's bridge address, the kubelet's clusterDNS for every pod.
CLUSTER_DOMAIN = "cluster.local"
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
# The apiserver drains for about 60 s on SIGTERM; a throwaway cluster need not wait for that.
APISERVER_STOP_S = 5.0


@dataclass(frozen=True)
class NodePorts:
    """The TCP ports a node takes, chosen free (see the module doc)."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    kubelet: int
    dns_ready: int

    @classmethod
    def choose(cls) -> NodePorts:
        return cls(*free_ports(5))

    def binds(self, node_ip: str) -> list[tuple[str, int]]:
        """Where each port is bound: etcd and CoreDNS's ready on loopback, the rest on the node."""
        loopback = "127.0.0.1"
        return [
            (loopback, self.etcd_client),
            (loopback, self.etcd_peer),
            (node_ip, self.apiserver),
            (node_ip, self.kubelet),
            (loopback, self.dns_ready),
        ]

    def still_free(self, node_ip: str) -> NodePorts:
        """These ports if all are still free where they will be bound, else a fresh choice (taken in
        the meantime by another process: checked again, up to a few times)."""
        ports = self
        for _ in range(5):
            if all(port_free(host, port) for host, port in ports.binds(node_ip)):
                return ports
            ports = NodePorts.choose()
        raise RuntimeError(f"no free ports for the node on 127.0.0.1 and {node_ip}")


def _make_pki(pki: Path, node_ip: str) -> None:
    make_pki(
        pki,
        {
            "apiserver": (
                "/CN=kube-apiserver",
                f"subjectAltName=IP:{node_ip},IP:{KUBERNETES_SERVICE_IP},IP:127.0.0.1,DNS:kubernetes,"
                "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            ),
            "kubelet": (
                f"/CN={NODE_NAME}",
                f"subjectAltName=IP:{node_ip},DNS:{NODE_NAME}\nextendedKeyUsage=serverAuth\n",
            ),
            "apiserver-kubelet-client": (
                "/CN=kube-apiserver-kubelet-client/O=system:masters",
                "extendedKeyUsage=clientAuth\n",
            ),
        },
    )


def kubeconfig_doc(server: str, ca_file: Path, token: str, namespace: str | None = None) -> str:
    context: dict[str, str] = {"cluster": "soak-e2e", "user": "soak-e2e"}
    if namespace:
        context["namespace"] = namespace
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "soak-e2e", "cluster": {"server": server, "certificate-authority": str(ca_file)}}
            ],
            "users": [{"name": "soak-e2e", "user": {"token": token}}],
            "contexts": [{"name": "soak-e2e", "context": context}],
            "current-context": "soak-e2e",
        }
    )


@dataclass
class RealNode:
    """One node: control plane, containerd and kubelet under ``workdir``; see the module doc. Its
    ports are chosen when it is made; its slot (network and names) is claimed by :meth:`up`."""

    workdir: Path
    kubectl_bin: Path
    ports: NodePorts = field(default_factory=NodePorts.choose)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    admin_token: str = field(default_factory=lambda: uuid.uuid4().hex)
    startup_s: float = 0.0
    claimed: HostSlot | None = None
    member: Member | None = None

    def __post_init__(self) -> None:
        # Absolute: every path handed to the components, and what tests.cluster.hostshare matches.
        self.workdir = self.workdir.absolute()

    # ------------------------------------------------------------------ paths

    @property
    def slot(self) -> HostSlot:
        if self.claimed is None:
            raise RuntimeError("the node has no slot yet: RealNode.up() claims one")
        return self.claimed

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def api_url(self) -> str:
        return f"https://{self.slot.node_ip}:{self.ports.apiserver}"

    @property
    def host_address(self) -> str:
        """The node's address as pods see it: servers the tests start for pods listen here."""
        return self.slot.node_ip

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def logs(self) -> Path:
        return self.workdir / "logs"

    # ------------------------------------------------------------------ up

    def up(self) -> None:
        started = time.monotonic()
        bins = kube_binaries(node=True)
        coredns = coredns_binary()
        pause, project = images.pause_image(), images.project_image()
        self.logs().mkdir(parents=True, exist_ok=True)
        self.claimed = hostshare.claim_slot()
        self.member = Member.me(self.slot, self.workdir)
        hostshare.join(self.member, _shared_before)
        log(f"node slot {self.slot.name}: {self.slot.node_ip} on {self.slot.bridge}")
        pki = self.workdir / "pki"
        _make_pki(pki, self.slot.node_ip)
        self._network_up()
        self._cgroup_root_up()
        self._start_containerd()
        for image in (pause, project):
            t0 = time.monotonic()
            self.ctr("images", "import", "--no-unpack", str(image), timeout=600)
            log(f"imported {image.name} into containerd in {time.monotonic() - t0:.0f} s")
        # The chart's default image reference (its appVersion) names the same image.
        self.ctr(
            "images",
            "tag",
            "--force",
            f"docker.io/library/{images.PROJECT_IMAGE}",
            f"docker.io/library/{CHART_IMAGE}",
        )
        self.ports = self.ports.still_free(self.slot.node_ip)
        log(f"node ports: {self.ports}")
        self._service_up()
        self._start_control_plane(bins, pki)
        self._start_cluster_dns(coredns)
        self._start_kubelet(bins, pki)
        self.startup_s = time.monotonic() - started
        log(f"node {NODE_NAME} Ready; cluster start took {self.startup_s:.0f} s (images and binaries cached)")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        with (self.logs() / f"{name}.log").open("ab") as out:
            self.procs[name] = start_server(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                cwd=self.workdir,
            )

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = (self.logs() / f"{name}.log").read_text(errors="replace")[-4000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}:\n{tail}")

    def _wait(self, what: str, probe: Callable[[], bool]) -> None:
        def alive_and_ready() -> bool:
            self._check_alive()
            return bool(probe())

        wait_until(what, alive_and_ready, START_TIMEOUT_S, interval_s=0.5)

    def _network_up(self) -> None:
        slot = self.slot  # claim_slot created the bridge
        run_logged(["ip", "addr", "replace", f"{slot.node_ip}/24", "dev", slot.bridge])
        run_logged(["ip", "link", "set", slot.bridge, "up"])
        # Pods talk to the node only: nothing from the bridge is forwarded anywhere else.
        iptables("-N", slot.filter_chain)
        iptables("-A", slot.filter_chain, "-i", slot.bridge, "!", "-o", slot.bridge, "-j", "DROP")
        iptables("-I", "FORWARD", "-j", slot.filter_chain)
        netconf = self.workdir / "cni" / "net.d"
        netconf.mkdir(parents=True, exist_ok=True)
        (netconf / "10-soak-e2e.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": slot.cni_network,
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": slot.bridge,
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "dataDir": str(self.workdir / "cni" / "ipam"),
                                "ranges": [[{"subnet": slot.pod_subnet, "gateway": slot.node_ip}]],
                                "routes": [{"dst": SERVICE_RANGE}],
                            },
                        },
                    ],
                }
            ),
            encoding="utf-8",
        )

    def _service_up(self) -> None:
        """kube-proxy's one job here: the kubernetes Service to the apiserver on the node, for this
        node's pods only (their source subnet), so every node's pods reach their own apiserver."""
        slot = self.slot
        iptables("-t", "nat", "-N", slot.nat_chain)
        iptables(
            "-t", "nat", "-A", slot.nat_chain, "-s", slot.pod_subnet, "-d", KUBERNETES_SERVICE_IP,
            "-p", "tcp", "--dport", "443", "-j", "DNAT",
            "--to-destination", f"{slot.node_ip}:{self.ports.apiserver}",
        )  # fmt: skip
        iptables("-t", "nat", "-I", "PREROUTING", "-j", slot.nat_chain)

    def _cgroup_root_up(self) -> None:
        """The kubelet's cgroupRoot, in every hierarchy (the kubelet requires it to exist)."""
        name = self.slot.cgroup_root
        if (CGROUP_ROOT / "cgroup.controllers").exists():  # cgroup v2 only
            (CGROUP_ROOT / name).mkdir(exist_ok=True)
            return
        for hierarchy in sorted(CGROUP_ROOT.iterdir()):
            if (hierarchy / "cgroup.procs").exists():
                (hierarchy / name).mkdir(exist_ok=True)
        cpuset = CGROUP_ROOT / "cpuset"
        for knob in ("cpuset.cpus", "cpuset.mems"):  # a new cpuset cgroup starts with none
            if (cpuset / name / knob).exists():
                (cpuset / name / knob).write_text((cpuset / knob).read_text())

    def _start_containerd(self) -> None:
        root = self.workdir / "containerd"
        root.mkdir(parents=True, exist_ok=True)
        config = root / "config.toml"
        config.write_text(
            f"""version = 2
root = "{root / "root"}"
state = "{root / "state"}"
[grpc]
  address = "{self.containerd_socket}"
[ttrpc]
  address = "{root / "containerd.sock.ttrpc"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{root / "opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{images.PAUSE_IMAGE}"
  # The VM lacks CAP_SYS_RESOURCE: no negative oom_score_adj for sandboxes.
  restrict_oom_score_adj = true
  # Pods' network namespaces in this node's state dir, not the host-wide /run/netns.
  netns_mounts_under_state_dir = true
  # exec/attach/port-forward streams: a port the kernel picks when containerd binds it.
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{root / "runc"}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{self.workdir / "cni" / "net.d"}"
""",
            encoding="utf-8",
        )
        self._spawn("containerd", ["containerd", "--config", str(config)])
        self._wait("containerd", lambda: self.ctr("version", check=False) is not None)

    def ctr(self, *args: str, timeout: float = 120, check: bool = True) -> str | None:
        argv = ["ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args]
        try:
            return run_logged(argv, timeout=timeout)
        except RuntimeError:
            if check:
                raise
            return None

    def _start_control_plane(self, bins: Path, pki: Path) -> None:
        tokens = self.workdir / "tokens.csv"
        self.kubelet_token = uuid.uuid4().hex
        tokens.write_text(
            f'{self.admin_token},soak-admin,soak-admin,"system:masters"\n'
            f'{self.kubelet_token},system:node:{NODE_NAME},kubelet,"system:masters"\n',
            encoding="utf-8",
        )
        self.kubeconfig.write_text(
            kubeconfig_doc(self.api_url, pki / "ca.crt", self.admin_token), encoding="utf-8"
        )
        etcd_url = f"http://127.0.0.1:{self.ports.etcd_client}"
        peer_url = f"http://127.0.0.1:{self.ports.etcd_peer}"
        self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=default={peer_url}",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={self.slot.node_ip}",
                f"--advertise-address={self.slot.node_ip}",
                f"--secure-port={self.ports.apiserver}",
                f"--cert-dir={self.workdir / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                f"--token-auth-file={tokens}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                f"--kubelet-certificate-authority={pki / 'ca.crt'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--service-cluster-ip-range={SERVICE_RANGE}",
                "--profiling=false",
                "--v=0",
            ],
        )
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))

        def ready() -> bool:
            request = urllib.request.Request(
                f"{self.api_url}/readyz", headers={"Authorization": f"Bearer {self.admin_token}"}
            )
            try:
                with urllib.request.urlopen(request, timeout=5, context=ctx) as resp:
                    return bool(resp.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        self._wait("kube-apiserver /readyz", ready)
        self._spawn(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                "--use-service-account-credentials=false",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--controllers=*,-csrsigning",
                "--v=0",
            ],
        )
        self._spawn(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={self.kubeconfig}",
                f"--authentication-kubeconfig={self.kubeconfig}",
                f"--authorization-kubeconfig={self.kubeconfig}",
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--v=0",
            ],
        )

    def _start_cluster_dns(self, coredns: Path) -> None:
        """CoreDNS serving the cluster domain from the apiserver (Services, and the pods of a
        headless Service by hostname), as a cluster's own CoreDNS does; nothing else resolves."""
        corefile = self.workdir / "Corefile"
        ready_address = f"127.0.0.1:{self.ports.dns_ready}"
        corefile.write_text(
            f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {self.slot.node_ip}
    errors
    log
    ready {ready_address}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa {{
        kubeconfig {self.kubeconfig} soak-e2e
        pods insecure
    }}
}}
""",
            encoding="utf-8",
        )
        self._spawn("coredns", [str(coredns), "-conf", str(corefile)])

        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))

        def ready() -> bool:
            try:
                with direct.open(f"http://{ready_address}/ready", timeout=5) as resp:
                    return bool(resp.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        self._wait("CoreDNS ready", ready)

    def _start_kubelet(self, bins: Path, pki: Path) -> None:
        kubelet_dir = self.workdir / "kubelet"
        kubelet_dir.mkdir(parents=True, exist_ok=True)
        kubeconfig = kubelet_dir / "kubeconfig"
        kubeconfig.write_text(
            kubeconfig_doc(self.api_url, pki / "ca.crt", self.kubelet_token), encoding="utf-8"
        )
        resolv = kubelet_dir / "resolv.conf"
        resolv.write_text("nameserver 127.0.0.1\n", encoding="utf-8")
        config = kubelet_dir / "config.json"
        config.write_text(
            json.dumps(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "kind": "KubeletConfiguration",
                    "address": self.slot.node_ip,
                    "port": self.ports.kubelet,
                    "readOnlyPort": 0,
                    "healthzBindAddress": "127.0.0.1",
                    "healthzPort": 0,
                    "tlsCertFile": str(pki / "kubelet.crt"),
                    "tlsPrivateKeyFile": str(pki / "kubelet.key"),
                    "authentication": {
                        "anonymous": {"enabled": False},
                        "webhook": {"enabled": False},
                        "x509": {"clientCAFile": str(pki / "ca.crt")},
                    },
                    "authorization": {"mode": "AlwaysAllow"},
                    "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
                    # cgroup v1 (hybrid) on these machines: allowed explicitly, driven through cgroupfs.
                    "cgroupDriver": "cgroupfs",
                    "failCgroupV1": False,
                    # The node's own top-level cgroup (made by _cgroup_root_up), not a host-wide /kubepods.
                    "cgroupRoot": f"/{self.slot.cgroup_root}",
                    # No CAP_SYS_RESOURCE: the kubelet must not lower its own oom_score_adj.
                    "oomScoreAdj": 0,
                    "failSwapOn": False,
                    "resolvConf": str(resolv),
                    "clusterDNS": [self.slot.node_ip],
                    "clusterDomain": CLUSTER_DOMAIN,
                    "podLogsDir": str(self.workdir / "pod-logs"),
                    "makeIPTablesUtilChains": False,
                    "evictionHard": {
                        "memory.available": "100Mi",
                        "nodefs.available": "1%",
                        "imagefs.available": "1%",
                        "nodefs.inodesFree": "1%",
                    },
                    "imageGCHighThresholdPercent": 100,
                    "imageGCLowThresholdPercent": 99,
                    "serializeImagePulls": False,
                    "syncFrequency": "5s",
                    "fileCheckFrequency": "5s",
                    "nodeStatusUpdateFrequency": "5s",
                    "volumeStatsAggPeriod": "0s",
                    "shutdownGracePeriod": "0s",
                }
            ),
            encoding="utf-8",
        )
        self._spawn(
            "kubelet",
            [
                str(bins / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={kubeconfig}",
                f"--root-dir={kubelet_dir / 'root'}",
                f"--cert-dir={kubelet_dir / 'pki'}",
                f"--hostname-override={NODE_NAME}",
                f"--node-ip={self.slot.node_ip}",
                "--v=1",
            ],
        )
        self._wait("node Ready and untainted", self._node_ready)
        self._wait("default ServiceAccount", lambda: self._kubectl_ok("get", "serviceaccount", "default"))

    def _kubectl_ok(self, *args: str) -> bool:
        return self.kubectl(*args, check=False).returncode == 0

    def _node_ready(self) -> bool:
        proc = self.kubectl("get", "node", NODE_NAME, "-o", "json", check=False)
        if proc.returncode != 0:
            return False
        node = json.loads(proc.stdout)
        ready = any(
            c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])
        )
        return ready and not node["spec"].get("taints")

    def kubectl(
        self, *args: str, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        kubectl = self.kubectl_bin
        proc = subprocess.run(
            [str(kubectl), "--kubeconfig", str(self.kubeconfig), *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
        return proc

    # ------------------------------------------------------------------ down

    def down(self) -> None:
        """Stop and remove everything (best effort on every step, so one failure hides nothing)."""
        with contextlib.suppress(Exception):
            if "kubelet" in self.procs and self.procs["kubelet"].poll() is None:
                self.kubectl(
                    "delete",
                    "pods",
                    "--all",
                    "--all-namespaces",
                    "--grace-period=0",
                    "--force",
                    "--wait=false",
                    check=False,
                    timeout=60,
                )
        self._stop("kubelet")
        self._remove_containers()
        for name in ("coredns", "kube-scheduler", "kube-controller-manager"):
            self._stop(name)
        self._stop("kube-apiserver", APISERVER_STOP_S)
        self._stop("etcd")
        self._stop("containerd")
        self._kill_shims()
        unmount_under(self.workdir)
        if self.claimed is not None:
            remove_cgroups(self.slot.cgroup_root)
            self._network_down()
            self.claimed = None  # the slot is free again: another node may take it
        # Logs and the kubeconfig stay for a post-mortem; state (images, etcd) is gigabytes.
        for state in ("containerd", "etcd", "kubelet", "pod-logs"):
            shutil.rmtree(self.workdir / state, ignore_errors=True)
        if self.member is not None:
            hostshare.leave(self.member, _clean_shared)
            self.member = None

    def _stop(self, name: str, timeout_s: float = STOP_TIMEOUT_S) -> None:
        proc = self.procs.get(name)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_TIMEOUT_S)

    def _remove_containers(self) -> None:
        """Whatever pods were left: their tasks killed, containers and sandboxes gone."""
        if self.procs.get("containerd") is None or self.procs["containerd"].poll() is not None:
            return
        for task in (self.ctr("tasks", "list", "--quiet", check=False) or "").split():
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
        deadline = time.monotonic() + 20
        while (
            self.ctr("tasks", "list", "--quiet", check=False) or ""
        ).split() and time.monotonic() < deadline:
            time.sleep(0.5)
        for task in (self.ctr("tasks", "list", "--quiet", check=False) or "").split():
            self.ctr("tasks", "delete", "--force", task, check=False)
        for container in (self.ctr("containers", "list", "--quiet", check=False) or "").split():
            self.ctr("containers", "delete", container, check=False)

    def _kill_shims(self) -> None:
        """containerd-shim-runc-v2 processes of this node (they outlive containerd by design)."""
        marker = str(self.containerd_socket).encode()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim" in cmdline and marker in cmdline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(entry.name), signal.SIGKILL)

    def _network_down(self) -> None:
        """This node's chains and bridge (veth ends died with their netns, unmounted above)."""
        slot = self.slot
        while iptables("-t", "nat", "-D", "PREROUTING", "-j", slot.nat_chain, check=False):
            pass
        while iptables("-D", "FORWARD", "-j", slot.filter_chain, check=False):
            pass
        for table, chain in slot.chains():
            iptables("-t", table, "-F", chain, check=False)
            iptables("-t", table, "-X", chain, check=False)
        subprocess.run(["ip", "link", "delete", slot.bridge], capture_output=True, check=False)
        shutil.rmtree(self.workdir / "cni", ignore_errors=True)


def _shared_before() -> dict[str, Any]:
    """What the first node up records (tests.cluster.hostshare.join): the shared host paths and the
    kubelet's chains that do not exist yet, for the last node down to remove."""
    return {
        "paths": [str(path) for path in HostFootprint(HOST_PATHS).created],
        "chains": [
            [table, chain]
            for table, chains in KUBELET_CHAINS.items()
            for chain in chains
            if not chain_exists(table, chain)
        ],
    }


def _clean_shared(record: dict[str, Any]) -> None:
    """The last node down (tests.cluster.hostshare.leave): remove what the first one recorded."""
    HostFootprint.of([Path(path) for path in record.get("paths", [])]).clean()
    for table, chain in record.get("chains", []):
        if chain_exists(table, chain):
            iptables("-t", table, "-F", chain, check=False)
            iptables("-t", table, "-X", chain, check=False)
