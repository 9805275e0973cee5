"""Several real nodes (tests/cluster/node.py) on one machine: what each takes for itself, and what they
share.

Each node claims a *slot*: an index X with its own bridge ``soak-e2eX``, pod subnet ``10.87.X.0/24``
(the node's address ``10.87.X.1``), iptables chains ``SOAK-E2EX-APISERVER`` and ``SOAK-E2EX-FORWARD``,
CNI network ``soak-e2eX`` and top-level cgroup ``soak-e2eX`` (the kubelet's cgroupRoot). Creating the
bridge is the claim: ``ip link add`` fails for all but one process, so two nodes starting together
never take the same slot. A slot whose bridge, chains, cgroup, addresses or routes are in use (e.g. a
crashed run's leftovers) is skipped, never reused.

A few host paths and iptables chains cannot be made per node (the module doc of node.py says why):
they are the group's. Each node registers in :data:`REGISTRY` while it is up (one file, under an
flock on the directory); the first to join records which of those shared things did not exist yet,
and the last to leave removes them, so a node's teardown never pulls them from under another node and
the host still ends as it was found. :class:`LiveNodes` tells which of the host's state belongs to the
other nodes up now, so a test run's leftover check (tests/e2e/conftest.py) does not blame another
run's node for its pods, links or processes.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from tests.cluster.system import NODE_CGROUP_PREFIX, cgroup_dirs

# One file per node up now (see the module doc); gone when no node is up.
REGISTRY = Path("/run/soak-e2e-nodes")
SHARED_RECORD = "shared.json"
SLOTS = 256  # 10.87.0.0/24 .. 10.87.255.0/24
SLOT_NETWORK = ipaddress.IPv4Network("10.87.0.0/16")
# Fixed places written whatever the configuration says (shim sockets, CNI cache, device plugins,
# container log links, network namespaces): shared by every node on the machine.
HOST_PATHS = (
    Path("/run/containerd"),
    Path("/var/lib/cni"),
    Path("/var/lib/kubelet"),
    Path("/var/log/containers"),
    Path("/var/log/pods"),
    Path("/run/netns"),
)
# Chains the kubelet creates on its own, whatever its configuration: shared by every node.
KUBELET_CHAINS = {
    "filter": ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY"),
    "nat": ("KUBE-KUBELET-CANARY",),
    "mangle": ("KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"),
}


@dataclass(frozen=True)
class HostSlot:
    """The per-node names and addresses of slot ``index`` (see the module doc)."""

    index: int

    @property
    def name(self) -> str:
        return f"{NODE_CGROUP_PREFIX}{self.index}"

    @property
    def bridge(self) -> str:
        return self.name

    @property
    def cgroup_root(self) -> str:
        return self.name

    @property
    def cni_network(self) -> str:
        return self.name

    @property
    def pod_subnet(self) -> str:
        return f"10.87.{self.index}.0/24"

    @property
    def node_ip(self) -> str:
        return f"10.87.{self.index}.1"

    @property
    def nat_chain(self) -> str:
        return f"SOAK-E2E{self.index}-APISERVER"

    @property
    def filter_chain(self) -> str:
        return f"SOAK-E2E{self.index}-FORWARD"

    def chains(self) -> tuple[tuple[str, str], ...]:
        return (("nat", self.nat_chain), ("filter", self.filter_chain))


def iptables(*args: str, check: bool = True) -> bool:
    proc = subprocess.run(["iptables", "-w", *args], capture_output=True, text=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)}: {proc.stderr.strip()}")
    return proc.returncode == 0


def chain_exists(table: str, chain: str) -> bool:
    return iptables("-t", table, "-nL", chain, check=False)


def claim_slot(claim: Callable[[HostSlot], bool] | None = None) -> HostSlot:
    """The first slot ``claim`` takes (default: :func:`claim_on_host`, which creates its bridge)."""
    take = claim or claim_on_host
    for index in range(SLOTS):
        slot = HostSlot(index)
        if take(slot):
            return slot
    raise RuntimeError(f"no free node slot among {SLOT_NETWORK}'s {SLOTS} /24s")


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network on this host's interfaces and routes."""
    found = []
    for argv in (["ip", "-o", "-4", "addr", "show"], ["ip", "-4", "route", "show", "table", "all"]):
        out = subprocess.run(argv, capture_output=True, text=True, check=False).stdout
        for word in out.split():
            with contextlib.suppress(ValueError):
                if word[0].isdigit():
                    found.append(ipaddress.IPv4Network(word, strict=False))
    return found


def slot_in_use(slot: HostSlot) -> bool:
    """Whether anything of ``slot`` is there already: addresses or routes in its subnet, its chains,
    its cgroup, or a live node registered on it. (Its bridge is checked by creating it.)"""
    subnet = ipaddress.IPv4Network(slot.pod_subnet)
    if any(net.overlaps(subnet) and net.prefixlen >= SLOT_NETWORK.prefixlen for net in _networks_in_use()):
        return True
    if any(chain_exists(table, chain) for table, chain in slot.chains()) or cgroup_dirs(slot.cgroup_root):
        return True
    return any(member.slot == slot.index for member in live_members())


def claim_on_host(slot: HostSlot) -> bool:
    """Take ``slot`` on this host: create its bridge, unless the slot is in use or another process
    created the bridge first."""
    if slot_in_use(slot):
        return False
    proc = subprocess.run(
        ["ip", "link", "add", slot.bridge, "type", "bridge"], capture_output=True, text=True, check=False
    )
    if proc.returncode == 0:
        return True
    if "exists" in proc.stderr:
        return False
    raise RuntimeError(f"ip link add {slot.bridge} type bridge: {proc.stderr.strip()}")


# ---------------------------------------------------------------- the nodes up now


@dataclass(frozen=True)
class Member:
    """A node up now: its slot, the process that runs it and its workdir."""

    slot: int
    pid: int
    started: float  # the process's start time, so a reused pid is not taken for it
    workdir: str

    @classmethod
    def me(cls, slot: HostSlot, workdir: Path) -> Member:
        pid = os.getpid()
        return cls(slot.index, pid, psutil.Process(pid).create_time(), str(workdir.resolve()))

    @property
    def file_name(self) -> str:
        return f"{self.slot}.{self.pid}.json"

    def alive(self) -> bool:
        try:
            return bool(psutil.Process(self.pid).create_time() == self.started)
        except psutil.Error:
            return False


def _members(registry: Path) -> list[Member]:
    found = []
    for path in sorted(registry.glob("*.*.json")) if registry.is_dir() else []:
        with contextlib.suppress(OSError, ValueError, TypeError, KeyError):
            found.append(Member(**json.loads(path.read_text(encoding="utf-8"))))
    return found


def live_members(registry: Path = REGISTRY) -> list[Member]:
    """The nodes up now (read only: creates nothing)."""
    return [member for member in _members(registry) if member.alive()]


def _lock(registry: Path) -> int | None:
    """An fd holding the registry's lock, or None when the directory went away meanwhile."""
    registry.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(registry, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        current = os.fstat(fd).st_nlink > 0 and os.stat(registry).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        current = False
    if current:
        return fd
    os.close(fd)
    return None


@contextlib.contextmanager
def _locked(registry: Path) -> Iterator[None]:
    """Hold the registry's lock: an flock on the directory itself, which the last node to leave
    removes (whoever locked it meanwhile tries again on a fresh one)."""
    fd = None
    while fd is None:
        fd = _lock(registry)
    try:
        yield
    finally:
        os.close(fd)


def join(member: Member, record_shared: Callable[[], dict[str, Any]], registry: Path = REGISTRY) -> None:
    """Register ``member``. The first node up (no live member) records what ``record_shared`` returns:
    the shared things that do not exist yet, for the last node to remove."""
    with _locked(registry):
        for stale in _members(registry):
            if not stale.alive():
                (registry / stale.file_name).unlink(missing_ok=True)
        if not _members(registry):
            (registry / SHARED_RECORD).write_text(json.dumps(record_shared()), encoding="utf-8")
        (registry / member.file_name).write_text(json.dumps(member.__dict__), encoding="utf-8")


def leave(member: Member, clean_shared: Callable[[dict[str, Any]], None], registry: Path = REGISTRY) -> None:
    """Unregister ``member``; the last node to leave calls ``clean_shared`` with the first one's record
    and removes the registry."""
    with _locked(registry):
        (registry / member.file_name).unlink(missing_ok=True)
        if any(other.alive() for other in _members(registry)):
            return
        record = registry / SHARED_RECORD
        with contextlib.suppress(OSError, ValueError):
            clean_shared(json.loads(record.read_text(encoding="utf-8")))
        for path in registry.iterdir():
            path.unlink(missing_ok=True)
        registry.rmdir()


@dataclass(frozen=True)
class LiveNodes:
    """What of the host's state (as :func:`tests.cluster.system.host_state` words it) belongs to the
    nodes up now: theirs or the group's."""

    members: tuple[Member, ...]

    @classmethod
    def now(cls, registry: Path = REGISTRY) -> LiveNodes:
        return cls(tuple(live_members(registry)))

    def pids(self) -> set[int]:
        """Their processes: the harness's children (control plane, kubelet, containerd, S3) and every
        process whose command line names their workdir (containerd's shims), with its descendants."""
        roots = []
        for proc in psutil.process_iter(["pid", "cmdline"]):
            cmdline = " ".join(proc.info["cmdline"] or ())
            if any(f"{member.workdir}/" in cmdline for member in self.members):
                roots.append(proc)
        for member in self.members:
            with contextlib.suppress(psutil.Error):
                roots.append(psutil.Process(member.pid))
        found = set()
        for root in roots:
            with contextlib.suppress(psutil.Error):
                found |= {root.pid, *(child.pid for child in root.children(recursive=True))}
        return found

    def owns(self, item: str) -> bool:
        """Whether a host_state item is one of theirs, or the group's while any of them is up."""
        if not self.members:
            return False
        kind, _, what = item.partition(" ")
        slots = [HostSlot(member.slot) for member in self.members]
        if kind == "link":
            return what in {slot.bridge for slot in slots} | _bridged_links(slots)
        if kind == "iptables":
            chains = {chain for slot in slots for _table, chain in slot.chains()}
            chains |= {chain for names in KUBELET_CHAINS.values() for chain in names}
            return any(chain in what.split() or f":{chain}" in what.split() for chain in chains)
        if kind in ("mount", "path"):
            places = [Path(member.workdir) for member in self.members] + list(HOST_PATHS) + [REGISTRY]
            return any(Path(what) == place or Path(what).is_relative_to(place) for place in places)
        if kind == "cgroup":
            return any(slot.cgroup_root in Path(what).parts for slot in slots)
        return False


def _bridged_links(slots: list[HostSlot]) -> set[str]:
    """The links attached to the slots' bridges (pods' veth ends)."""
    found = set()
    for slot in slots:
        out = subprocess.run(
            ["ip", "-o", "link", "show", "master", slot.bridge], capture_output=True, text=True, check=False
        ).stdout
        found |= {line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line}
    return found
