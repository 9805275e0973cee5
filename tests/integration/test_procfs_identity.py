"""A remembered process, by PID and start ticks: alive as itself, exiting, a zombie, reused, gone."""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path

import psutil
import pytest

from sidecar.adapters.procfs import ProcfsProcessTable, is_exiting, same_process_alive
from sidecar.adapters.provenance import boot_id
from tests.fixtures.processes import PYTHON, Spawner
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

SLEEPER = [PYTHON, "-c", "import time; time.sleep(600)"]


def start_ticks(pid: int) -> int:
    ticks = ProcfsProcessTable().sample(pid).processes[0].start_ticks
    assert ticks is not None
    return ticks


def test_a_running_process_is_alive_as_itself_and_not_exiting(spawn: Spawner) -> None:
    proc = spawn(SLEEPER)
    ticks = start_ticks(proc.pid)
    assert same_process_alive(proc.pid, ticks) and same_process_alive(proc.pid, None)
    assert not is_exiting(proc.pid, ticks) and not is_exiting(proc.pid, None)


def test_other_start_ticks_mean_another_process_on_a_reused_pid(spawn: Spawner) -> None:
    proc = spawn(SLEEPER)
    ticks = start_ticks(proc.pid)
    assert not same_process_alive(proc.pid, ticks + 1)
    assert is_exiting(proc.pid, ticks + 1)


def test_a_zombie_and_then_a_reaped_process_count_as_ended(spawn: Spawner) -> None:
    proc = spawn(SLEEPER)
    ticks = start_ticks(proc.pid)
    os.kill(proc.pid, signal.SIGKILL)
    wait_until("zombie", lambda: psutil.Process(proc.pid).status() == psutil.STATUS_ZOMBIE)
    assert not same_process_alive(proc.pid, ticks) and not same_process_alive(proc.pid, None)
    assert is_exiting(proc.pid, ticks) and is_exiting(proc.pid, None)
    proc.wait()
    assert not same_process_alive(proc.pid, ticks)
    assert is_exiting(proc.pid, ticks)


def test_boot_id_is_the_kernels() -> None:
    found = boot_id()
    assert found is not None and re.fullmatch(r"[0-9a-f-]{36}", found)
    assert found == Path("/proc/sys/kernel/random/boot_id").read_text(encoding="utf-8").strip()
