"""Fd classes: the classifier against the seed's rules, and a real process holding one fd of each."""

from __future__ import annotations

import os
import signal
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.adapters.procfs import ProcfsProcessTable
from sidecar.launcher.protocol.fds import classify_fds, fd_class
from tests.fixtures.processes import PYTHON, Spawner
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def seed_fd_class(link: str) -> str:
    """The seed's ``_fd_class``, its conditions in its order: the oracle the product must agree with."""
    if link.startswith("pipe:"):
        kind = "pipe"
    elif link.startswith("socket:"):
        kind = "socket"
    elif link.startswith("memfd:"):
        kind = "memfd"
    elif link == "anon_inode:[eventfd]":
        kind = "eventfd"
    elif link == "anon_inode:[eventpoll]":
        kind = "eventpoll"
    elif link.startswith("/dev/nvidia") or link.startswith("/dev/nvidia-cuda"):
        kind = "nvidia"
    elif link.startswith("/dev/shm/") or link.startswith("/run/shm/"):
        kind = "shared_memory"
    else:
        kind = "other"
    return kind


SAMPLE_LINKS = [
    "pipe:[123]",
    "socket:[456]",
    "memfd:x (deleted)",
    "/memfd:torch-shm (deleted)",
    "anon_inode:[eventfd]",
    "anon_inode:[eventpoll]",
    "anon_inode:[eventfd]x",
    "anon_inode:[timerfd]",
    "anon_inode:inotify",
    "/dev/nvidia0",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-caps/nvidia-cap1",
    "/dev/shm/torch_1_2",
    "/run/shm/x",
    "/dev/shmx",
    "/dev/null",
    "/tmp/pipe:x",
    "pipe",
    "socket",
    "",
    "/",
]

# Text built from the classifier's own prefixes, so that near-misses are generated often.
_pieces = st.sampled_from(
    [
        "pipe:",
        "socket:",
        "memfd:",
        "/memfd:",
        "anon_inode:",
        "[eventfd]",
        "[eventpoll]",
        "/dev/",
        "nvidia",
        "shm/",
        "/run/",
        "x",
        "",
        "[",
        "]",
        " (deleted)",
        "0",
    ]
)
links_strategy = st.lists(_pieces, max_size=4).map("".join) | st.text(max_size=30)


@pytest.mark.parametrize("link", ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm"])
def test_nvidia_devices(link: str) -> None:
    assert fd_class(link) == "nvidia"
    assert classify_fds([link]) == {"nvidia": 1}


def test_linux_memfd_targets_are_memfd() -> None:
    # Linux names a memfd target "/memfd:<name> (deleted)"; the seed's "memfd:" never matched it.
    assert fd_class("/memfd:bench (deleted)") == "memfd"
    assert seed_fd_class("/memfd:bench (deleted)") == "other"


def test_known_targets_match_the_seed() -> None:
    for link in SAMPLE_LINKS:
        expected = "memfd" if link.startswith("/memfd:") else seed_fd_class(link)
        assert fd_class(link) == expected, link


@given(links_strategy)
def test_classifier_agrees_with_the_seed_except_linux_memfd(link: str) -> None:
    expected = "memfd" if link.startswith("/memfd:") else seed_fd_class(link)
    assert fd_class(link) == expected


@given(st.lists(links_strategy | st.sampled_from(SAMPLE_LINKS), max_size=60))
def test_bulk_counts_equal_per_link_classification(links: list[str]) -> None:
    expected = dict(sorted(Counter(fd_class(link) for link in links).items()))
    assert classify_fds(list(links)) == expected


# Closes stdio so the process holds exactly the fds it opens: one of each class, then reports.
ONE_OF_EACH = r"""
import os, select, signal, socket, sys
ready, shm_path, regular = sys.argv[1:4]
os.closerange(0, 3)
read_end, write_end = os.pipe()
os.close(write_end)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
memfd = os.memfd_create("soak-test")
event = os.eventfd(0)
poll = select.epoll()
shm = os.open(shm_path, os.O_RDWR | os.O_CREAT, 0o600)
os.unlink(shm_path)
reg = os.open(regular, os.O_RDONLY)
open(ready + ".tmp", "w").close()
os.rename(ready + ".tmp", ready)
while True:
    signal.pause()
"""


def written(path: Path, proc: subprocess.Popen[bytes]) -> bool:
    """The helper's ready file is there; a helper that died fails at once."""
    assert proc.poll() is None, f"helper exited with {proc.returncode}"
    return path.exists()


def test_real_process_with_one_fd_of_each_class(spawn: Spawner, tmp_path: Path) -> None:
    regular = tmp_path / "regular"
    regular.write_text("x")
    ready = tmp_path / "ready"
    shm = f"/dev/shm/soak-test-{os.getpid()}"
    proc = spawn([PYTHON, "-c", ONE_OF_EACH, str(ready), shm, str(regular)])
    wait_until(f"{ready} written", lambda: written(ready, proc))

    sample = ProcfsProcessTable().sample(proc.pid)

    assert sample.process_count == 1
    info = sample.processes[0]
    expected = {
        "eventfd": 1,
        "eventpoll": 1,
        "memfd": 1,
        "other": 1,
        "pipe": 1,
        "shared_memory": 1,
        "socket": 1,
    }
    assert info.fd_classes == expected
    assert info.fd_count == 7
    assert sample.fd_classes_total == expected
    assert sample.fd_count_total == 7


# A pipe swapped for a socket on SIGUSR1 (the same fd count), one more eventfd on SIGUSR2; each
# change acknowledged by a new file.
SWAPPING = r"""
import os, signal, socket, sys
ready = sys.argv[1]
os.closerange(0, 3)
read_end, write_end = os.pipe()
held = []
def ack(name):
    open(ready + name + ".tmp", "w").close()
    os.rename(ready + name + ".tmp", ready + name)
def swap(*_):
    os.close(write_end)
    held.append(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
    ack("-swapped")
def grow(*_):
    held.append(os.eventfd(0))
    ack("-grown")
signal.signal(signal.SIGUSR1, swap)
signal.signal(signal.SIGUSR2, grow)
ack("")
while True:
    signal.pause()
"""


def test_fd_classes_follow_a_changed_table(spawn: Spawner, tmp_path: Path) -> None:
    """The count is exact in every sample; a new count re-reads the classes at once, and a table
    changed behind the same count is read again within the refresh."""
    ready = tmp_path / "ready"
    proc = spawn([PYTHON, "-c", SWAPPING, str(ready)])
    wait_until(f"{ready} written", lambda: written(ready, proc))
    table = ProcfsProcessTable(fd_class_refresh=3)

    def fds() -> tuple[int, dict[str, int]]:
        info = table.sample(proc.pid).processes[0]
        return info.fd_count, dict(info.fd_classes)

    assert fds() == (2, {"pipe": 2})
    proc.send_signal(signal.SIGUSR1)
    swapped = Path(f"{ready}-swapped")
    wait_until(f"{swapped} written", lambda: written(swapped, proc))
    after_swap = [fds() for _ in range(3)]
    assert all(count == 2 for count, _ in after_swap)
    assert after_swap[-1] == (2, {"pipe": 1, "socket": 1})
    proc.send_signal(signal.SIGUSR2)
    grown = Path(f"{ready}-grown")
    wait_until(f"{grown} written", lambda: written(grown, proc))
    assert fds() == (3, {"eventfd": 1, "pipe": 1, "socket": 1})
