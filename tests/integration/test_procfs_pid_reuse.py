"""PID reuse, for real: in a fresh PID namespace ns_last_pid hands a dead process's PID to another."""

from __future__ import annotations

import json
import subprocess

import pytest

from sidecar.core.samples import ProcessInfo
from tests.components import require
from tests.fixtures.processes import PYTHON, Spawner

pytestmark = [
    pytest.mark.integration,
    pytest.mark.needs_root,
]


@pytest.fixture(autouse=True)
def _as_root() -> None:
    """PID namespaces and ns_last_pid need root."""
    require("root")


# Runs as PID 1 of the namespace. root -> A; A is killed and reaped, then an unrelated process B
# (a child of PID 1, outside root's tree) is given A's PID. The sampler remembered A from the
# previous sample and must not attribute B to it.
HELPER = r"""
import json, os, signal, subprocess, sys, time
from sidecar.adapters.procfs import ProcfsProcessTable
sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
root = subprocess.Popen([sys.executable, "-c",
    "import subprocess, sys; "
    "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']); "
    "print(p.pid, flush=True); p.wait(); "
    "import time; time.sleep(600)"], stdout=subprocess.PIPE)
a_pid = int(root.stdout.readline())
sampler = ProcfsProcessTable()
first = sampler.sample(root.pid)
a_info = next(p for p in first.processes if p.pid == a_pid)
root_info = next(p for p in first.processes if p.pid == root.pid)
handle = os.open(f"/proc/{a_pid}", os.O_RDONLY | os.O_DIRECTORY)
os.kill(a_pid, signal.SIGKILL)
while os.path.exists(f"/proc/{a_pid}"):
    time.sleep(0.01)
time.sleep(0.05)  # at least one clock tick later, so the start ticks differ
with open("/proc/sys/kernel/ns_last_pid", "w") as f:
    f.write(str(a_pid - 1))
b = subprocess.Popen(sleeper)
second = sampler.sample(root.pid)
try:
    os.close(os.open("stat", os.O_RDONLY, dir_fd=handle))
    handle_read = "read the newcomer"
except OSError as exc:
    handle_read = type(exc).__name__
print(json.dumps({
    "a": a_info.model_dump(),
    "root": root_info.model_dump(),
    "b_pid": b.pid,
    "handle_read": handle_read,
    "second": [p.pid for p in second.processes],
    "still_alive": [p.pid for p in sampler.still_alive([a_info, root_info])],
    "still_alive_by_time": [p.pid for p in sampler.still_alive(
        [a_info.model_copy(update={"start_ticks": None})])],
    "b_alive": [p.pid for p in sampler.still_alive([a_info.model_copy(update={
        "start_ticks": None, "start_time": sampler.sample(b.pid).processes[0].start_time})])],
}), flush=True)
"""


def test_reused_pid_is_not_the_old_process(spawn: Spawner) -> None:
    proc = spawn(["unshare", "--pid", "--fork", "--mount-proc", PYTHON, "-c", HELPER], stdout=subprocess.PIPE)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    result = json.loads(out)
    a = ProcessInfo.model_validate(result["a"])
    root = ProcessInfo.model_validate(result["root"])

    assert result["b_pid"] == a.pid  # the PID really was reused
    # What the sampler relies on: a /proc/<pid> handle stays bound to the process it was opened on.
    assert result["handle_read"] in ("FileNotFoundError", "ProcessLookupError")
    assert a.pid not in result["second"]  # not followed as a remembered member of the tree
    assert result["second"] == [root.pid]
    assert result["still_alive"] == [root.pid]  # A's PID is alive, but it is not A
    assert result["still_alive_by_time"] == []  # also when only the epoch start time is known
    assert result["b_alive"] == [a.pid]  # control: B's own identity is recognised
