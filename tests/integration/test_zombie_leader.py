"""A process is alive while any of its threads is. A "zombie leader" (main() left with pthread_exit
while another thread runs; tests/zombie_leader/zombie_leader.c) shows state Z, RSS 0, no fds and no
argv in /proc/PID: the launcher's tree walk and the sampler read it through a live thread (the
launcher's kill of one: tests/integration/test_launcher_process.py)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from sidecar.adapters.procfs import ProcfsProcessTable, is_exiting, same_process_alive
from sidecar.launcher.proc import alive_descendants, command_of

pytestmark = pytest.mark.integration

HELD_MIB, PIPES = 48, 40


@pytest.fixture
def leader(zombie_leader: Path) -> Iterator[int]:
    """A zombie leader holding HELD_MIB MiB and PIPES pipes in its one live thread: its pid."""
    proc = subprocess.Popen(
        [str(zombie_leader), str(HELD_MIB), str(PIPES)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline().split()[1])
        assert pid == proc.pid
        assert psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # what /proc/PID says
        yield pid
    finally:
        proc.kill()
        proc.wait()


def test_the_launchers_tree_walk_counts_it_alive_and_names_it(leader: int, zombie_leader: Path) -> None:
    assert leader in alive_descendants(os.getpid())
    assert command_of(leader) == (str(zombie_leader), str(HELD_MIB), str(PIPES))


def test_the_sampler_reads_its_memory_fds_and_argv_through_a_live_thread(leader: int) -> None:
    table = ProcfsProcessTable()
    (info,) = table.sample(leader).processes
    assert info.state != psutil.STATUS_ZOMBIE
    assert info.rss_kib >= HELD_MIB * 1024
    assert info.fd_count >= 2 * PIPES
    assert info.fd_classes.get("pipe", 0) >= 2 * PIPES
    assert info.command.endswith(f"zombie_leader {HELD_MIB} {PIPES}")
    assert same_process_alive(leader, info.start_ticks) and not is_exiting(leader, info.start_ticks)
    assert [alive.pid for alive in table.still_alive([info])] == [leader]
