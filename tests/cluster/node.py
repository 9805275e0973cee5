"""A real single-node Kubernetes on this machine (root): the ``node`` cluster provider.

containerd, runc and the CNI plugins come from Debian; etcd, kube-apiserver, kube-controller-manager,
kube-scheduler and kubelet from ``tests/kube/build.sh``; the pause and project images from
``tests.cluster.images``. Pods live on a bridge this harness creates (``soak-e2e0``, 10.87.0.0/24,
no masquerade: pods reach only the node), the apiserver listens on the bridge's address, and one
iptables DNAT rule stands in for kube-proxy (``10.96.0.1:443``). The settings follow
``../shared/REAL-CLUSTER.md`` (restrict_oom_score_adj, oomScoreAdj 0, cgroupfs on cgroup v1).

:meth:`RealNode.down` stops everything and removes what it made, inside and outside the workspace:
processes, mounts, network namespaces, the bridge, iptables rules and chains, cgroups, and the fixed
host paths the kubelet, containerd and the CNI plugins write to.
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

from tests.cluster import images
from tests.cluster.pki import make_pki
from tests.cluster.system import (
    HostFootprint,
    coredns_binary,
    kube_binaries,
    log,
    remove_cgroups,
    run_logged,
    unmount_under,
)
from tests.docs_commands import CHART_IMAGE
from tests.fixtures.processes import start_server
from tests.waiting import wait_until

BRIDGE = "soak-e2e0"
NODE_IP = "10.87.0.1"
POD_SUBNET = "10.87.0.0/24"
SERVICE_RANGE = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
API_PORT = 6443
KUBELET_PORT = 10250
NODE_NAME = "soak-node"
# Cluster DNS: CoreDNS on the node's bridge address, the kubelet's clusterDNS for every pod.
CLUSTER_DOMAIN = "cluster.local"
DNS_READY_ADDRESS = "127.0.0.1:18181"
NAT_CHAIN = "SOAK-E2E-APISERVER"
FILTER_CHAIN = "SOAK-E2E-FORWARD"
# Chains the kubelet creates on its own; removed at teardown when they were not there before.
KUBELET_CHAINS = {
    "filter": ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY"),
    "nat": ("KUBE-KUBELET-CANARY",),
    "mangle": ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"),
}
# Fixed places written whatever the configuration says (shim sockets, CNI cache, device plugins,
# container log links, network namespaces).
HOST_PATHS = (
    Path("/run/containerd"),
    Path("/var/lib/cni"),
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/run/netns"),
)
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 20.0
# The apiserver drains for about 60 s on SIGTERM; a throwaway cluster need not wait for that.
APISERVER_STOP_S = 5.0


def _iptables(*args: str, check: bool = True) -> bool:
    proc = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)}: {proc.stderr.strip()}")
    return proc.returncode == 0


def _chain_exists(table: str, chain: str) -> bool:
    return _iptables("-t", table, "-nL", chain, check=False)


def _make_pki(pki: Path) -> None:
    make_pki(
        pki,
        {
            "apiserver": (
                "/CN=kube-apiserver",
                f"subjectAltName=IP:{NODE_IP},IP:{KUBERNETES_SERVICE_IP},IP:127.0.0.1,DNS:kubernetes,"
                "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            ),
            "kubelet": (
                f"/CN={NODE_NAME}",
                f"subjectAltName=IP:{NODE_IP},DNS:{NODE_NAME}\nextendedKeyUsage=serverAuth\n",
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
    """One node: control plane, containerd and kubelet under ``workdir``; see the module doc."""

    workdir: Path
    kubectl_bin: Path
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    admin_token: str = field(default_factory=lambda: uuid.uuid4().hex)
    startup_s: float = 0.0

    # ------------------------------------------------------------------ paths

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def api_url(self) -> str:
        return f"https://{NODE_IP}:{API_PORT}"

    @property
    def host_address(self) -> str:
        """The node's address as pods see it: servers the tests start for pods listen here."""
        return NODE_IP

    @property
    def containerd_socket(self) -> Path:
        return self.workdir / "containerd" / "containerd.sock"

    def logs(self) -> Path:
        return self.workdir / "logs"

    # ------------------------------------------------------------------ up

    def up(self) -> None:
        started = time.monotonic()
        self._footprint = HostFootprint(HOST_PATHS)
        self._chains_before = {
            (table, chain)
            for table, chains in KUBELET_CHAINS.items()
            for chain in chains
            if _chain_exists(table, chain)
        }
        bins = kube_binaries(node=True)
        coredns = coredns_binary()
        pause, project = images.pause_image(), images.project_image()
        self.logs().mkdir(parents=True, exist_ok=True)
        pki = self.workdir / "pki"
        _make_pki(pki)
        self._network_up()
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
        if subprocess.run(["ip", "link", "show", BRIDGE], capture_output=True).returncode != 0:
            run_logged(["ip", "link", "add", BRIDGE, "type", "bridge"])
        run_logged(["ip", "addr", "replace", f"{NODE_IP}/24", "dev", BRIDGE])
        run_logged(["ip", "link", "set", BRIDGE, "up"])
        # kube-proxy's one job here: the kubernetes Service to the apiserver on the node.
        _iptables("-t", "nat", "-N", NAT_CHAIN, check=False)
        _iptables("-t", "nat", "-F", NAT_CHAIN)
        _iptables(
            "-t",
            "nat",
            "-A",
            NAT_CHAIN,
            "-d",
            KUBERNETES_SERVICE_IP,
            "-p",
            "tcp",
            "--dport",
            "443",
            "-j",
            "DNAT",
            "--to-destination",
            f"{NODE_IP}:{API_PORT}",
        )
        for hook in ("PREROUTING", "OUTPUT"):
            if not _iptables("-t", "nat", "-C", hook, "-j", NAT_CHAIN, check=False):
                _iptables("-t", "nat", "-I", hook, "-j", NAT_CHAIN)
        # Pods talk to the node only: nothing from the bridge is forwarded anywhere else.
        _iptables("-N", FILTER_CHAIN, check=False)
        _iptables("-F", FILTER_CHAIN)
        _iptables("-A", FILTER_CHAIN, "-i", BRIDGE, "!", "-o", BRIDGE, "-j", "DROP")
        if not _iptables("-C", "FORWARD", "-j", FILTER_CHAIN, check=False):
            _iptables("-I", "FORWARD", "-j", FILTER_CHAIN)
        netconf = self.workdir / "cni" / "net.d"
        netconf.mkdir(parents=True, exist_ok=True)
        (netconf / "10-soak-e2e.conflist").write_text(
            json.dumps(
                {
                    "cniVersion": "0.4.0",
                    "name": "soak-e2e",
                    "plugins": [
                        {
                            "type": "bridge",
                            "bridge": BRIDGE,
                            "isGateway": True,
                            "ipMasq": False,
                            "hairpinMode": True,
                            "ipam": {
                                "type": "host-local",
                                "dataDir": str(self.workdir / "cni" / "ipam"),
                                "ranges": [[{"subnet": POD_SUBNET, "gateway": NODE_IP}]],
                                "routes": [{"dst": SERVICE_RANGE}],
                            },
                        },
                    ],
                }
            ),
            encoding="utf-8",
        )

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
        self._spawn(
            "etcd",
            [
                str(bins / "etcd"),
                f"--data-dir={self.workdir / 'etcd'}",
                "--listen-client-urls=http://127.0.0.1:12379",
                "--advertise-client-urls=http://127.0.0.1:12379",
                "--listen-peer-urls=http://127.0.0.1:12380",
                "--initial-advertise-peer-urls=http://127.0.0.1:12380",
                "--initial-cluster=default=http://127.0.0.1:12380",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        self._spawn(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                "--etcd-servers=http://127.0.0.1:12379",
                f"--bind-address={NODE_IP}",
                f"--advertise-address={NODE_IP}",
                f"--secure-port={API_PORT}",
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
        corefile.write_text(
            f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 {{
    bind {NODE_IP}
    errors
    log
    ready {DNS_READY_ADDRESS}
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
                with direct.open(f"http://{DNS_READY_ADDRESS}/ready", timeout=5) as resp:
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
                    "address": NODE_IP,
                    "port": KUBELET_PORT,
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
                    # No CAP_SYS_RESOURCE: the kubelet must not lower its own oom_score_adj.
                    "oomScoreAdj": 0,
                    "failSwapOn": False,
                    "resolvConf": str(resolv),
                    "clusterDNS": [NODE_IP],
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
                f"--node-ip={NODE_IP}",
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
        remove_cgroups("kubepods")
        self._network_down()
        # Logs and the kubeconfig stay for a post-mortem; state (images, etcd) is gigabytes.
        for state in ("containerd", "etcd", "kubelet", "pod-logs"):
            shutil.rmtree(self.workdir / state, ignore_errors=True)
        if hasattr(self, "_footprint"):
            self._footprint.clean()
        for table, chains in KUBELET_CHAINS.items():
            for chain in chains:
                if (table, chain) not in getattr(self, "_chains_before", set()) and _chain_exists(
                    table, chain
                ):
                    _iptables("-t", table, "-F", chain, check=False)
                    _iptables("-t", table, "-X", chain, check=False)

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
        for hook in ("PREROUTING", "OUTPUT"):
            while _iptables("-t", "nat", "-D", hook, "-j", NAT_CHAIN, check=False):
                pass
        _iptables("-t", "nat", "-F", NAT_CHAIN, check=False)
        _iptables("-t", "nat", "-X", NAT_CHAIN, check=False)
        while _iptables("-D", "FORWARD", "-j", FILTER_CHAIN, check=False):
            pass
        _iptables("-F", FILTER_CHAIN, check=False)
        _iptables("-X", FILTER_CHAIN, check=False)
        # veth ends die with their netns; the bridge is ours.
        for netns in Path("/run/netns").glob("cni-*") if Path("/run/netns").is_dir() else []:
            subprocess.run(["ip", "netns", "delete", netns.name], capture_output=True, check=False)
        subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        shutil.rmtree(self.workdir / "cni", ignore_errors=True)
