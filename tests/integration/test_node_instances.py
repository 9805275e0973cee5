"""Two real nodes on one machine (issue 41), checked without starting one: each node's ports are chosen
free when it is made and checked again before its components bind them, each node's network and names
come from a slot of its own, and the registry of nodes up hands the shared host paths to the last node
down and tells a test run's leftover check which state belongs to other nodes and other runs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.cluster import hostshare
from tests.cluster.hostshare import HostSlot, LiveNodes, Member
from tests.cluster.node import RealNode
from tests.cluster.system import boot_clock, command_line_places, foreign_pids, port_free
from tests.fixtures.processes import Spawner
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# What the harness took before issue 41: etcd client and peer, apiserver, kubelet, kubelet healthz,
# CoreDNS ready.
OLD_FIXED_PORTS = {12379, 12380, 6443, 10250, 10248, 18181}
# Starts a child after a while, writes its pid to argv[1] and waits for it.
LATER_CHILD = """
import subprocess, sys, time
time.sleep(1.0)
child = subprocess.Popen(["sleep", "30"])
open(sys.argv[1], "w").write(str(child.pid))
child.wait()
"""


def dead_pid() -> int:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    return gone.pid


def ports_of(node: RealNode) -> list[int]:
    return [port for _host, port in node.ports.binds("127.0.0.1")]


def test_two_nodes_made_in_one_process_get_distinct_free_ports(tmp_path: Path) -> None:
    first = RealNode(workdir=tmp_path / "a", kubectl_bin=tmp_path / "kubectl")
    second = RealNode(workdir=tmp_path / "b", kubectl_bin=tmp_path / "kubectl")
    together = ports_of(first) + ports_of(second)
    assert len(set(together)) == len(together) == 10, together
    assert not set(together) & OLD_FIXED_PORTS
    assert all(port_free("127.0.0.1", port) for port in together)
    assert first.claimed is None and first.member is None  # the slot is claimed by up(), not before
    with pytest.raises(RuntimeError, match="claims one"):
        _ = first.api_url


def test_a_port_taken_before_the_components_bind_it_is_chosen_again(tmp_path: Path) -> None:
    node = RealNode(workdir=tmp_path, kubectl_bin=tmp_path / "kubectl")
    assert node.ports.still_free("127.0.0.1") is node.ports
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", node.ports.apiserver))
        squatter.listen()
        again = node.ports.still_free("127.0.0.1")
        assert again != node.ports
        assert node.ports.apiserver not in [port for _host, port in again.binds("127.0.0.1")]
        assert all(port_free(host, port) for host, port in again.binds("127.0.0.1"))


def test_two_claims_get_slots_with_their_own_network_and_names() -> None:
    taken: set[int] = set()

    def claim(slot: HostSlot) -> bool:  # stands in for creating the bridge: the first one wins
        if slot.index in taken:
            return False
        taken.add(slot.index)
        return True

    first, second = hostshare.claim_slot(claim), hostshare.claim_slot(claim)
    assert (first.index, second.index) == (0, 1)
    names = ("bridge", "pod_subnet", "node_ip", "nat_chain", "filter_chain", "cgroup_root", "cni_network")
    for name in names:
        assert getattr(first, name) != getattr(second, name), name
    assert (first.bridge, first.node_ip, first.pod_subnet) == ("soak-e2e0", "10.87.0.1", "10.87.0.0/24")
    last = HostSlot(hostshare.SLOTS - 1)
    assert len(last.bridge) <= 15  # IFNAMSIZ
    assert max(len(last.nat_chain), len(last.filter_chain)) <= 28  # iptables' chain names
    with pytest.raises(RuntimeError, match="no free node slot"):
        hostshare.claim_slot(lambda slot: False)


def test_the_last_node_down_removes_what_the_first_one_up_recorded(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    me = psutil.Process()
    first = Member(0, me.pid, me.create_time(), str(tmp_path / "a"))
    second = Member(1, me.pid, me.create_time(), str(tmp_path / "b"))
    cleaned: list[dict[str, Any]] = []
    hostshare.join(first, lambda: {"paths": ["/first"]}, registry)
    hostshare.join(second, lambda: {"paths": ["/second"]}, registry)
    assert hostshare.live_members(registry) == [first, second]
    hostshare.leave(first, cleaned.append, registry)
    assert cleaned == [] and hostshare.live_members(registry) == [second]
    hostshare.leave(second, cleaned.append, registry)
    assert cleaned == [{"paths": ["/first"]}]
    assert not registry.exists()


def test_a_dead_nodes_registration_neither_blocks_nor_hands_over(tmp_path: Path) -> None:
    registry = tmp_path / "registry"
    crashed = Member(3, dead_pid(), 1.0, str(tmp_path / "crashed"))
    me = psutil.Process()
    live = Member(4, me.pid, me.create_time(), str(tmp_path / "live"))
    hostshare.join(crashed, lambda: {"paths": ["/crashed"]}, registry)
    assert hostshare.live_members(registry) == []
    cleaned: list[dict[str, Any]] = []
    hostshare.join(live, lambda: {"paths": ["/live"]}, registry)
    hostshare.leave(live, cleaned.append, registry)
    assert cleaned == [{"paths": ["/live"]}]  # the first live node's record, not the crashed one's
    assert not registry.exists()


def test_other_nodes_state_is_told_apart_from_this_runs(tmp_path: Path, spawn: Spawner) -> None:
    workdir = tmp_path / "other"
    other = LiveNodes((Member(7, dead_pid(), 0.0, str(workdir)),))  # its processes: by their workdir
    theirs = [
        "link soak-e2e7",
        "iptables nat :SOAK-E2E7-APISERVER",
        "iptables nat -A PREROUTING -j SOAK-E2E7-APISERVER",
        "iptables filter -A FORWARD -j SOAK-E2E7-FORWARD",
        "iptables filter :KUBE-FIREWALL",
        f"mount {workdir}/containerd/state/netns/cni-1234",
        "cgroup /sys/fs/cgroup/memory/soak-e2e7/kubepods",
        "path /var/lib/cni",
        f"path {hostshare.REGISTRY}",
    ]
    ours = [
        "link soak-e2e8",
        "iptables nat :SOAK-E2E8-APISERVER",
        f"mount {tmp_path}/mine",
        "cgroup /sys/fs/cgroup/memory/soak-e2e8/kubepods",
        "process /usr/bin/containerd",
    ]
    assert [item for item in theirs if not other.owns(item)] == []
    assert [item for item in ours if other.owns(item)] == []
    assert not LiveNodes(()).owns("path /var/lib/cni")
    shim = spawn(
        [sys.executable, "-c", "import time; time.sleep(60)", f"{workdir}/containerd/containerd.sock"]
    )
    stranger = spawn([sys.executable, "-c", "import time; time.sleep(60)", f"{tmp_path}/othernode"])
    pids = other.pids()
    assert shim.pid in pids and stranger.pid not in pids


def test_other_runs_processes_are_told_apart_from_this_runs_leftovers(tmp_path: Path, spawn: Spawner) -> None:
    # Stand-ins: `me` is this run; its parent (pytest) one of its ancestors, as a shell is; `older` a
    # process of another run, already there when this run began, which starts a child later.
    me = psutil.Process(spawn(["sleep", "30"]).pid)
    child_file = tmp_path / "child"
    older = spawn([sys.executable, "-c", LATER_CHILD, str(child_file)])
    time.sleep(0.2)
    since = boot_clock()
    newer = spawn(["sleep", "30"])  # started since, under this run's ancestor: this run's leftover
    wait_until("the older one's child", lambda: child_file.exists() and child_file.read_text() != "")
    foreign = foreign_pids(since, me)
    assert older.pid in foreign and int(child_file.read_text()) in foreign
    assert newer.pid not in foreign and me.pid not in foreign and os.getpid() not in foreign


def test_mounts_are_told_apart_by_the_places_other_processes_name(spawn: Spawner) -> None:
    argv = [sys.executable, "-c", "import time; time.sleep(30)"]
    proc = spawn([*argv, "--data-root=/tmp/other-run/x/docker", "/opt/shallow", "relative/a/b/c"])
    wait_until("its command line", lambda: len(psutil.Process(proc.pid).cmdline()) == 6)
    assert command_line_places([proc.pid]) == {Path("/tmp/other-run/x/docker"), Path(sys.executable)}
