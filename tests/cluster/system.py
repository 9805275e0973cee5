"""Small host helpers shared by the cluster providers and fixtures: logging, commands, free ports,
cgroups, caches."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Collection, Sequence
from pathlib import Path

import psutil

REPO_ROOT = Path(__file__).resolve().parents[2]
KUBE_VERSION = "1.35.4"
CGROUP_ROOT = Path("/sys/fs/cgroup")


# Every port free_ports handed out in this process: never handed out twice, so two servers (or two
# nodes) configured in one process get distinct ports even when neither has bound its own yet.
_HANDED_OUT: set[int] = set()
_HANDED_OUT_LOCK = threading.Lock()


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports free on ``host`` now, chosen by the kernel (all held open together,
    then released) and none handed out before in this process. The one helper for every fixture and
    cluster component that needs a port: a port is taken at start, never fixed, so two test runs on
    one machine do not clash."""
    holders: list[socket.socket] = []
    chosen: list[int] = []
    with _HANDED_OUT_LOCK:
        try:
            while len(chosen) < count:
                if len(holders) > count + 1000:
                    raise RuntimeError(f"no {count} fresh free ports on {host}")
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                holders.append(sock)
                sock.bind((host, 0))
                port = int(sock.getsockname()[1])
                if port not in _HANDED_OUT:
                    chosen.append(port)
            _HANDED_OUT.update(chosen)
            return chosen
        finally:
            for sock in holders:
                sock.close()


def port_free(host: str, port: int) -> bool:
    """Whether a TCP listener could bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def log(message: str) -> None:
    print(f"[cluster {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    base = os.environ.get("SOAK_KUBE_CACHE") or str(
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "soak-sidecar"
    )
    return Path(base)


def run_logged(
    argv: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    timeout: float = 600,
    stdin: Path | None = None,
    check: bool = True,
) -> str:
    """Run ``argv``; its stdout, or a RuntimeError carrying the tail of both streams."""
    with stdin.open("rb") if stdin else open(os.devnull, "rb") as source:
        proc = subprocess.run(
            list(argv),
            stdin=source,
            capture_output=True,
            timeout=timeout,
            env={**os.environ, **(env or {})},
            check=False,
        )
    out = proc.stdout.decode(errors="replace")
    if check and proc.returncode != 0:
        err = proc.stderr.decode(errors="replace")
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}:\n{out[-2000:]}\n{err[-4000:]}")
    return out


def kube_binaries(*, node: bool, kind: bool = False) -> Path:
    """tests/kube/build.sh: the cached (or freshly built) Kubernetes binaries (``kind``: with kubeadm,
    kube-proxy and kubectl, for the kind node image)."""
    flags = ["--kind"] if kind else ["--node"] if node else []
    argv = ["bash", str(REPO_ROOT / "tests" / "kube" / "build.sh"), *flags]
    env = {k: v for k, v in os.environ.items() if not (flags and k == "KUBEBUILDER_ASSETS")}
    proc = subprocess.run(argv, stdout=subprocess.PIPE, env=env, timeout=5400, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"tests/kube/build.sh {' '.join(flags)} failed ({proc.returncode})")
    return Path(proc.stdout.decode().strip().splitlines()[-1])


def coredns_binary() -> Path:
    """tests/kube/coredns/build.sh: the cached (or freshly built) CoreDNS of the node's cluster DNS."""
    argv = ["bash", str(REPO_ROOT / "tests" / "kube" / "coredns" / "build.sh")]
    proc = subprocess.run(argv, stdout=subprocess.PIPE, timeout=1800, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"tests/kube/coredns/build.sh failed ({proc.returncode})")
    return Path(proc.stdout.decode().strip().splitlines()[-1])


def _go() -> str:
    return os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"


def prometheus_operator_crd(kind: str) -> Path:
    """The Prometheus Operator's CRD of ``kind`` (e.g. "podmonitors"), from its Go module at the version
    tests/kube/crds pins (downloaded into the module cache, checked against that go.sum)."""
    found = run_logged(
        [_go(), "-C", str(REPO_ROOT / "tests" / "kube" / "crds"), "mod", "download", "-json",
         "github.com/prometheus-operator/prometheus-operator"],
        env={"GOFLAGS": "-mod=readonly"},
        timeout=900,
    )  # fmt: skip
    directory = Path(json.loads(found)["Dir"])
    return directory / "example" / "prometheus-operator-crd" / f"monitoring.coreos.com_{kind}.yaml"


def kube_module_dir() -> Path:
    """The Go module cache copy of k8s.io/kubernetes at the pinned version (for pause.c)."""
    gomodcache = subprocess.run(
        [os.environ.get("GO") or "go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = Path(gomodcache) / f"k8s.io/kubernetes@v{KUBE_VERSION}"
    if not path.is_dir():
        # Inside tests/kube's module, so the download is checked against its go.sum.
        run_logged(
            ["go", "-C", str(REPO_ROOT / "tests" / "kube"), "mod", "download", "k8s.io/kubernetes"],
            env={"GOFLAGS": "-mod=readonly"},
            timeout=900,
        )
    return path


def cgroup_dirs(name: str) -> list[Path]:
    """Every ``<controller>/<name>`` directory under /sys/fs/cgroup (v1 and the unified tree)."""
    found = []
    for controller in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else []:
        for candidate in (controller / name, controller / "unified" / name):
            if candidate.is_dir():
                found.append(candidate)
    unified = CGROUP_ROOT / name
    if unified.is_dir() and unified not in found:
        found.append(unified)
    return found


def remove_cgroups(name: str, timeout_s: float = 15.0) -> None:
    """rmdir a cgroup subtree in every hierarchy, deepest first. A cgroup is busy for a moment after
    its last task exits, so this retries until all are gone or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        for top in cgroup_dirs(name):
            for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda e: -e[0].count("/")):
                with contextlib.suppress(OSError):  # still busy: the next round
                    os.rmdir(dirpath)
        if not cgroup_dirs(name) or time.monotonic() > deadline:
            return
        time.sleep(0.2)


def unmount_under(path: Path) -> None:
    """Lazily unmount every mount at or below ``path``, deepest first."""
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return
    prefix = str(path).rstrip("/")
    targets = [line.split()[1].encode().decode("unicode_escape") for line in mounts if line.split()]
    for target in sorted(
        (t for t in targets if t == prefix or t.startswith(prefix + "/")), key=len, reverse=True
    ):
        subprocess.run(["umount", "-l", target], capture_output=True, check=False)


class HostFootprint:
    """Paths outside the workspace that a component creates at fixed places: whatever of them did not
    exist before is unmounted and removed on :meth:`clean`, so a teardown leaves nothing behind."""

    def __init__(self, paths: Sequence[Path]) -> None:
        self.created = [path for path in paths if not path.exists()]

    @classmethod
    def of(cls, created: Sequence[Path]) -> HostFootprint:
        """A footprint recorded earlier (e.g. by another process): ``created`` are the paths to clean."""
        footprint = cls(())
        footprint.created = list(created)
        return footprint

    def clean(self) -> None:
        for path in self.created:
            unmount_under(path)
            if path.is_symlink() or path.is_file():
                path.unlink(missing_ok=True)
            elif path.exists():
                subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=False)


# Top-level cgroups of the real nodes' pods (tests/cluster/node.py: each node's kubelet cgroupRoot).
NODE_CGROUP_PREFIX = "soak-e2e"


def node_cgroups() -> set[str]:
    """The names of the real nodes' top-level cgroups present in any hierarchy."""
    tops = [CGROUP_ROOT, *(CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else ())]
    tops += [top / "unified" for top in tops]
    return {group.name for top in tops if top.is_dir() for group in top.glob(f"{NODE_CGROUP_PREFIX}[0-9]*")}


def host_state(paths: Sequence[Path], skip_pids: Collection[int] = ()) -> set[str]:
    """What a cluster could leave behind on the host, as comparable strings: links, iptables chains,
    mounts, cgroups of pods and builds, the fixed paths, and processes of the cluster's programs
    (but for ``skip_pids``: those of another test run's cluster)."""
    state: set[str] = set()
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=False).stdout
    state |= {"link " + line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    for table in ("filter", "nat", "mangle"):
        saved = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True, check=False)
        # ":CHAIN POLICY [counters]" names a chain; "-A ..." is a rule.
        state |= {
            f"iptables {table} {line.split()[0] if line.startswith(':') else line}"
            for line in saved.stdout.splitlines()
            if line.startswith((":", "-A"))
        }
    state |= {"mount " + line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()}
    for name in sorted({"kubepods", "soak-e2e-docker", "soak-kind-docker", "docker", *node_cgroups()}):
        state |= {f"cgroup {path}" for path in cgroup_dirs(name)}
    state |= {f"path {path}" for path in paths if path.exists()}
    programs = (
        b"containerd",
        b"kubelet",
        b"kube-apiserver",
        b"kube-scheduler",
        b"kube-controller",
        b"etcd",
        b"dockerd",
        b"weed",
        b"pause",
    )
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) not in skip_pids:
            try:
                argv0 = (entry / "cmdline").read_bytes().split(b"\0")[0]
            except OSError:
                continue
            if os.path.basename(argv0).startswith(programs):
                state.add(f"process {argv0.decode(errors='replace')}")
    return state


def boot_clock() -> float:
    """Seconds since boot: the clock of :func:`foreign_pids`'s ``since`` (a process's start time on
    it is exact to a clock tick, where psutil's wall-clock start time may be a second off)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def _started_before(pid: int, since: float) -> bool:
    """Whether ``pid`` surely started before ``since`` (:func:`boot_clock`): its start time, in clock
    ticks since boot, rounds down, so one started in the tick of ``since`` is not."""
    fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
    return (int(fields[19]) + 1) / os.sysconf("SC_CLK_TCK") <= since


def foreign_pids(since: float, me: psutil.Process | None = None) -> set[int]:
    """Processes of whatever else runs on this machine (another test run, a CI run beside it), told
    apart from those of this process (``me``): one is foreign when it or an ancestor started before
    ``since`` (:func:`boot_clock`) and is neither init nor ``me`` or one of its ancestors, unless ``me``
    is its ancestor. Every process this run started since then, even one orphaned to init (a
    leftover), is not."""
    me = me or psutil.Process()
    mine = {0, 1, me.pid, *(parent.pid for parent in me.parents())}
    found = set()
    for proc in psutil.process_iter():
        try:
            chain = [proc, *proc.parents()]
            if me.pid not in {link.pid for link in chain} and any(
                link.pid not in mine and _started_before(link.pid, since) for link in chain
            ):
                found.add(proc.pid)
        except (psutil.Error, OSError):
            continue
    return found


def command_line_places(pids: Collection[int]) -> set[Path]:
    """Absolute paths at least three levels deep that those processes' command lines name, bare or as
    an option's value: where they keep their state (a dockerd's --data-root, a node's workdir)."""
    places = set()
    for pid in pids:
        try:
            args = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        for arg in args:
            value = Path(arg.split("=", 1)[-1])
            if value.is_absolute() and len(value.parts) >= 4:
                places.add(value)
    return places
