"""Tree discovery, per-process fields, zombies, vanishing processes and changing fd tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from sidecar.adapters.procfs import ProcfsProcessTable
from sidecar.core.ports import ProcessTable
from sidecar.core.samples import ProcessTreeSample
from tests.fixtures.processes import PYTHON, Spawner, kill_orphan
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

# root -> thread-spawned child -> grandchild, root -> setsid'd child (new session) -> grandchild.
# Prints the PIDs it expects the sampler to find, then sleeps.
TREE = r"""
import json, os, subprocess, sys, threading, time
procs = []
def start(argv, **kw):
    procs.append(subprocess.Popen(argv, **kw))
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
parent_of_one = [sys.executable, "-c",
    "import subprocess, sys, time; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print(p.pid, flush=True); time.sleep(600)"]
t = threading.Thread(target=start, args=(parent_of_one,), kwargs={"stdout": subprocess.PIPE})
t.start(); t.join()
start(parent_of_one, stdout=subprocess.PIPE, start_new_session=True)
start(sleeper)
grandchildren = [int(p.stdout.readline()) for p in procs if p.stdout is not None]
print(json.dumps({
    "children": [p.pid for p in procs],
    "grandchildren": grandchildren,
    "setsid": procs[1].pid,
}), flush=True)
time.sleep(600)
"""


def read_json_line(proc: subprocess.Popen[bytes]) -> dict[str, object]:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, f"helper exited with {proc.poll()}"
    result: dict[str, object] = json.loads(line)
    return result


def pids_of(sample: ProcessTreeSample) -> set[int]:
    return {info.pid for info in sample.processes}


def test_tree_with_grandchildren_setsid_and_thread_children(spawn: Spawner) -> None:
    root = spawn([PYTHON, "-c", TREE], stdout=subprocess.PIPE)
    layout = read_json_line(root)
    children = layout["children"]
    grandchildren = layout["grandchildren"]
    assert isinstance(children, list) and isinstance(grandchildren, list)

    sampler: ProcessTable = ProcfsProcessTable()  # mypy checks the port is implemented
    sample = sampler.sample(root.pid)

    assert pids_of(sample) == {root.pid, *children, *grandchildren}
    assert sample.process_count == 6
    by_pid = {info.pid: info for info in sample.processes}
    for child in children:
        assert by_pid[child].ppid == root.pid
    assert os.getsid(int(str(layout["setsid"]))) == int(str(layout["setsid"]))
    assert [info.pid for info in sample.processes] == sorted(by_pid)
    assert sample.zombie_count == 0
    assert sample.threads_total == sum(info.threads for info in sample.processes)
    assert sample.rss_kib_total == sum(info.rss_kib for info in sample.processes)


def test_fields_match_psutil(spawn: Spawner) -> None:
    code = (
        "import threading, time\n"
        "blob = bytearray(64 * 1024 * 1024)\n"
        "for i in range(0, len(blob), 4096): blob[i] = 1\n"
        "for _ in range(3): threading.Thread(target=time.sleep, args=(600,), daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = spawn(
        [PYTHON, "-c", code, "x" * 2000],
        stdout=subprocess.PIPE,
        env={**os.environ, "SOAK_TEST_SECRET": "do-not-leak"},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"

    reference = psutil.Process(proc.pid)
    os.kill(proc.pid, signal.SIGSTOP)
    wait_until("the helper stopped", lambda: reference.status() == psutil.STATUS_STOPPED)
    info = ProcfsProcessTable().sample(proc.pid).processes[0]

    assert info.state == psutil.STATUS_STOPPED
    assert info.threads == 4
    assert info.rss_kib >= 64 * 1024
    assert abs(info.rss_kib - reference.memory_info().rss // 1024) < 4096
    assert abs(info.start_time - reference.create_time()) < 1.0
    assert info.ppid == os.getpid()
    assert len(info.command) == 512
    assert info.command.startswith(f"{PYTHON} -c import threading")
    assert "do-not-leak" not in info.command


def test_zombies_are_counted(spawn: Spawner) -> None:
    code = (
        "import os, subprocess, sys, time\n"
        "p = subprocess.Popen([sys.executable, '-c', 'pass'])\n"
        "print(p.pid, flush=True)\n"
        "time.sleep(600)\n"  # never waits: the child stays a zombie
    )
    root = spawn([PYTHON, "-c", code], stdout=subprocess.PIPE)
    assert root.stdout is not None
    zombie = int(root.stdout.readline())
    wait_until("the child a zombie", lambda: psutil.Process(zombie).status() == psutil.STATUS_ZOMBIE)

    sample = ProcfsProcessTable().sample(root.pid)

    assert pids_of(sample) == {root.pid, zombie}
    assert sample.zombie_count == 1
    dead = next(info for info in sample.processes if info.pid == zombie)
    assert dead.state == psutil.STATUS_ZOMBIE
    assert (dead.rss_kib, dead.fd_count, dead.command) == (0, 0, "")


# Keeps 40 short-lived children churning (each forks a grandchild that exits at once).
CHURN = r"""
import os, time
kids = set()
end = time.monotonic() + 600
while time.monotonic() < end:
    while len(kids) < 40:
        pid = os.fork()
        if pid == 0:
            if os.fork() == 0:
                time.sleep(0.01)
                os._exit(0)
            time.sleep(0.02)
            os._exit(0)
        kids.add(pid)
    pid, _ = os.waitpid(-1, 0)
    kids.discard(pid)
"""


def test_processes_vanishing_mid_sample_are_skipped(spawn: Spawner) -> None:
    root = spawn([PYTHON, "-c", CHURN])
    sampler = ProcfsProcessTable()
    wait_until("the churn started", lambda: sampler.sample(root.pid).process_count > 1)
    seen: set[int] = set()
    samples = 0
    end = time.monotonic() + 2.0
    while samples < 50 or time.monotonic() < end:
        sample = sampler.sample(root.pid)
        samples += 1
        assert root.pid in pids_of(sample)
        assert sample.process_count == len(sample.processes)
        for info in sample.processes:
            assert info.fd_count == sum(info.fd_classes.values())
        seen |= pids_of(sample)
    assert root.poll() is None
    assert len(seen) > 50  # the churn really happened while sampling


def test_gone_root_is_an_empty_sample(spawn: Spawner) -> None:
    proc = spawn([PYTHON, "-c", "pass"])
    proc.wait()
    assert ProcfsProcessTable().sample(proc.pid) == ProcessTreeSample()


# Holds fds with a hole at 3; on each line from stdin opens one more eventfd, then acks.
FD_TABLE = r"""
import os, sys
held = [os.open("/dev/null", os.O_RDONLY) for _ in range(10)]
os.close(3)
print("ready", flush=True)
for _ in sys.stdin:
    held.append(os.eventfd(0))
    print("ok", flush=True)
"""


def test_fd_table_changes_are_seen_every_sample(spawn: Spawner) -> None:
    proc = spawn([PYTHON, "-c", FD_TABLE], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdin is not None and proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    sampler = ProcfsProcessTable()

    def fds() -> tuple[int, dict[str, int]]:
        info = sampler.sample(proc.pid).processes[0]
        listed = len(os.listdir(f"/proc/{proc.pid}/fd"))
        assert info.fd_count == listed
        return info.fd_count, info.fd_classes

    base, classes = fds()
    assert classes.get("eventfd", 0) == 0
    assert fds() == (base, classes)  # unchanged table, read from the remembered names
    for opened in (1, 2, 3):
        proc.stdin.write(b"open\n")
        proc.stdin.flush()
        assert proc.stdout.readline() == b"ok\n"
        count, classes = fds()
        assert (count, classes["eventfd"]) == (base + opened, opened)


def test_descendants_of_an_exited_parent_stay_in_the_tree(spawn: Spawner, tmp_path: Path) -> None:
    # The middle process exits when told to (a line on the stdin it shares with the root), so the
    # first sample sees the whole chain.
    code = (
        "import subprocess, sys, time\n"
        "m = subprocess.Popen([sys.executable, '-c', "
        '\'import subprocess, sys; p = subprocess.Popen([sys.executable, "-c", '
        '"import time; time.sleep(600)"], stdin=subprocess.DEVNULL); print(p.pid, flush=True); '
        "sys.stdin.readline()'], stdout=subprocess.PIPE)\n"
        "print(m.pid, m.stdout.readline().decode().strip(), flush=True)\n"
        "m.wait()\n"
        "time.sleep(600)\n"
    )
    root = spawn([PYTHON, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert root.stdin is not None and root.stdout is not None
    middle, orphan_pid = (int(v) for v in root.stdout.readline().split())
    # Re-parented away from the root below: killing and reaping the root's tree never reaches it.
    orphan = psutil.Process(orphan_pid)
    sampler = ProcfsProcessTable()
    try:
        first = sampler.sample(root.pid)
        assert {middle, orphan_pid} <= pids_of(first)
        root.stdin.write(b"exit\n")
        root.stdin.flush()
        wait_until(
            "the middle process exited",
            lambda: not psutil.pid_exists(middle) or psutil.Process(middle).status() == psutil.STATUS_ZOMBIE,
        )
        # The middle process exited: its child was reparented away from the root's tree.
        wait_until("the orphan re-parented", lambda: orphan.ppid() != middle)
        assert orphan_pid in pids_of(first)
        assert orphan_pid in pids_of(sampler.sample(root.pid))
        # A fresh sampler has no memory of it: only the remembered identity keeps it visible.
        assert orphan_pid not in pids_of(ProcfsProcessTable().sample(root.pid))
    finally:
        kill_orphan(orphan)
