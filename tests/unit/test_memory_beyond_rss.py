"""Memory beyond RSS: the cgroup series and its leak rule (pure), the limit's default, reading the
launcher's memory cgroup from fake procfs/cgroupfs trees (v1, v2, hidden, hostile), and the /dev/shm
scan (owner, age, links, bounds)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from sidecar.adapters.procfs.memory import (
    ProcfsTrainerMemory,
    parse_membership,
    parse_stat,
    path_parts,
    scan_shm,
    shown,
)
from sidecar.core.artifact import ResourceSummary, SampleRecorder, leak_failures, shm_finding
from sidecar.core.classification import Classification, Finding, Source
from sidecar.core.conclusion import conclude
from sidecar.core.samples import CgroupMemorySample, MemoryCgroupInfo, ShmFile, ShmLeftovers
from sidecar.settings import Settings
from tests.unit.test_artifact import make_sample
from tests.unit.test_conclusion import facts

MIB = 1 << 20
SERIES = "cgroup memory (anon+shmem)"


def held(mib: float, *, anon_mib: float = 0, cache_mib: float = 0) -> CgroupMemorySample:
    """A cgroup reading with ``mib`` MiB of shmem, ``anon_mib`` of anon and ``cache_mib`` of page cache."""
    shmem, anon, cache = int(mib * MIB), int(anon_mib * MIB), int(cache_mib * MIB)
    return CgroupMemorySample(
        current_bytes=shmem + anon + cache,
        anon_bytes=anon,
        shmem_bytes=shmem,
        file_bytes=shmem + cache,
        inactive_file_bytes=cache,
    )


def recorded(
    *readings: CgroupMemorySample | None, after: CgroupMemorySample | None = None
) -> ResourceSummary:
    recorder = SampleRecorder(None, series_points=16)
    for i, reading in enumerate(readings):
        recorder.add(make_sample(i).model_copy(update={"cgroup": reading}))
    recorder.after_cleanup(after)
    return recorder.resource_summary()


def limited(summary: ResourceSummary, limit: float | None) -> list[str]:
    return leak_failures(
        summary,
        max_rss_growth_mib=None,
        max_fd_growth=None,
        max_gpu_growth_mib=None,
        max_cgroup_memory_growth_mib=limit,
    )


# ---------------------------------------------------------------------- the rule (pure)


def test_memory_outside_rss_grows_the_cgroup_series_and_fails_its_limit() -> None:
    summary = recorded(held(0, anon_mib=20), held(60, anon_mib=20), held(120, anon_mib=20))
    assert summary.rss_growth_kib == 0  # what the RSS rule sees
    assert summary.cgroup_memory_growth_bytes == 120 * MIB
    assert summary.max_cgroup_memory_bytes == 140 * MIB
    (trend,) = [t for t in summary.trends if t.series == SERIES]
    assert trend.unit == "bytes" and trend.per_hour > 0
    assert limited(summary, 16) == [f"{SERIES} of cgroup grew by 120.0 MiB > 16.0 MiB"]
    assert limited(summary, 120) == []  # equal to the limit is not a leak
    assert limited(summary, None) == []  # no limit, no check


def test_page_cache_is_not_a_leak() -> None:
    summary = recorded(held(0, cache_mib=10), held(0, cache_mib=500), held(0, cache_mib=900))
    assert summary.cgroup_memory_growth_bytes == 0
    assert limited(summary, 16) == []


def test_memory_left_charged_after_the_tree_is_gone_fails_even_unsampled_while_held() -> None:
    # The trainer filled a /dev/shm file between two samples and exited: only the reading after
    # the cleanup sees it.
    summary = recorded(held(0, anon_mib=30), held(0, anon_mib=30), after=held(120, anon_mib=2))
    assert summary.cgroup_memory_growth_bytes == 0
    assert summary.cgroup_memory_after_bytes == 122 * MIB
    assert summary.cgroup_memory_left_bytes == 92 * MIB
    assert limited(summary, 16) == [
        f"{SERIES} of cgroup was still 92.0 MiB above its first steady sample once the trainer's "
        "processes were gone > 16.0 MiB"
    ]


def test_unavailable_readings_are_no_figures_never_a_pass_by_default() -> None:
    unreadable = CgroupMemorySample(available=False, reason="cannot be read: No such device")
    summary = recorded(None, unreadable, after=None)
    assert summary.cgroup_memory_growth_bytes is None
    assert summary.cgroup_memory_left_bytes is None
    assert not [t for t in summary.trends if t.series == SERIES]
    assert unreadable.held_bytes is None
    # Growth counts from the first steady sample that could be read.
    summary = recorded(None, held(10), held(50))
    assert summary.cgroup_memory_growth_bytes == 40 * MIB


def test_the_cgroup_is_named_in_the_reason() -> None:
    summary = recorded(held(0), held(100)).model_copy(
        update={
            "memory_cgroup": MemoryCgroupInfo(available=True, version="v2", path="/soak", sidecar_own=True)
        }
    )
    assert limited(summary, 16) == [f"{SERIES} of cgroup /soak grew by 100.0 MiB > 16.0 MiB"]


def test_the_cgroup_limit_defaults_to_the_rss_limit_where_the_cgroup_is_the_trainers_alone() -> None:
    def limit(settings: Settings, *, shared: bool) -> float | None:
        return settings.monitor.cgroup_memory_growth_limit_mib(shared_with_sidecar=shared)

    assert limit(Settings(), shared=False) is None
    rss = Settings(monitor={"max_rss_growth_mib": 16})
    assert limit(rss, shared=False) == 16
    assert limit(rss, shared=True) is None  # a local run: the cgroup holds the sidecar and more
    both = Settings(monitor={"max_rss_growth_mib": 16, "max_cgroup_memory_growth_mib": 512})
    assert limit(both, shared=True) == limit(both, shared=False) == 512
    alone = Settings(monitor={"max_cgroup_memory_growth_mib": 64})
    assert limit(alone, shared=True) == 64


def test_files_left_in_dev_shm_are_named_in_a_failed_verdict_and_fail_nothing_themselves() -> None:
    left = ShmLeftovers(
        directory="/dev/shm",
        uid=1000,
        files=[ShmFile(path="/dev/shm/x", bytes=120 * MIB, allocated_bytes=120 * MIB, mtime_unix=1.0)],
    )
    finding = shm_finding(left)
    assert finding == "files left in /dev/shm by the trainer's UID 1000: /dev/shm/x (120.0 MiB)"
    assert shm_finding(ShmLeftovers(directory="/dev/shm", uid=1000)) is None
    passed = conclude(facts(shm_left=finding)).verdict
    assert passed.status == "passed" and passed.reason is None
    failed = conclude(
        facts(shm_left=finding, leaks=(Finding(Classification.RESOURCE_LEAK, "a leak", Source.SIDECAR),))
    ).verdict
    assert failed.classification == "resource_leak"
    assert failed.reason == f"a leak; {finding}"


def test_a_sparse_file_says_what_it_holds_and_the_list_is_bounded() -> None:
    files = [
        ShmFile(path=f"/dev/shm/{i}", bytes=1 << 40, allocated_bytes=MIB, mtime_unix=1.0) for i in range(10)
    ]
    finding = shm_finding(ShmLeftovers(directory="/dev/shm", uid=0, files=files, more=5))
    assert finding is not None
    assert "/dev/shm/0 (1048576.0 MiB, 1.0 MiB of it in memory)" in finding
    assert finding.endswith("and 7 more")


# ---------------------------------------------------------------------- reading the cgroup


def test_parsing_is_defensive() -> None:
    assert parse_membership(b"12:memory:/a\n0::/b\n") == ("v1", "/a")
    assert parse_membership(b"0::/b\n3:cpu,memory:/c\n") == ("v1", "/c")
    assert parse_membership(b"0::/b\n") == ("v2", "/b")
    assert parse_membership(b"garbage\n1:cpu:/x\n") is None
    assert parse_stat(b"anon 5\nanon 7\nshmem -1\nfile x\nbig 99999999999999999999999\n\n") == {b"anon": 5}
    assert path_parts("/a/b") == ["a", "b"]
    assert path_parts("/") == []
    hidden = path_parts("/../cri-containerd-1.scope")
    assert isinstance(hidden, str) and "outside the sidecar's cgroup namespace" in hidden
    assert isinstance(path_parts("relative"), str)


def fake_proc(tmp: Path, pid: int, cgroup: str, uid: int = 1234) -> Path:
    proc = tmp / "proc"
    (proc / str(pid)).mkdir(parents=True, exist_ok=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)
    (proc / str(pid) / "status").write_text(f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    return proc


def memory_files(directory: Path, version: str, anon: int, shmem: int) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    if version == "v2":
        (directory / "memory.current").write_text(f"{anon + shmem + 4096}\n")
        (directory / "memory.stat").write_text(
            f"anon {anon}\nfile {shmem + 4096}\nshmem {shmem}\ninactive_file 4096\n"
        )
    else:
        (directory / "memory.usage_in_bytes").write_text(f"{anon + shmem}\n")
        (directory / "memory.stat").write_text(
            f"rss 1\nshmem 1\ntotal_rss {anon}\ntotal_shmem {shmem}\ntotal_cache {shmem}\n"
        )


@pytest.mark.parametrize(
    ("version", "line", "under"),
    [
        ("v2", "0::/kubepods/trainer\n", "kubepods/trainer"),
        ("v1", "4:memory:/docker/x\n0::/\n", "memory/docker/x"),
    ],
)
def test_the_launchers_cgroup_is_read_under_its_controllers_mount(
    tmp_path: Path, version: str, line: str, under: str
) -> None:
    proc = fake_proc(tmp_path, 10, line)
    fake_proc(tmp_path, 20, "0::/elsewhere\n")
    memory_files(tmp_path / "cg" / under, version, anon=5 * MIB, shmem=7 * MIB)
    memory = ProcfsTrainerMemory(10, proc=str(proc), cgroup_root=str(tmp_path / "cg"), self_pid=20)
    assert memory.cgroup.available and memory.cgroup.version == version
    assert memory.cgroup.sidecar_own is False
    assert memory.uid == 1234
    reading = memory.sample()
    assert reading is not None and reading.held_bytes == 12 * MIB
    # The cgroup goes away (the trainer's container ended): a reading that says so, no exception.
    for child in (tmp_path / "cg" / under).iterdir():
        child.unlink()
    gone = memory.sample()
    assert gone is not None and not gone.available and gone.reason


def test_a_cgroup_the_sidecar_cannot_see_is_unavailable_with_the_reason(tmp_path: Path) -> None:
    root = tmp_path / "cg"
    memory_files(root, "v2", 1, 1)  # the sidecar's own cgroup at the mount's root
    cases = {
        "0::/../cri-containerd-trainer.scope\n": "outside the sidecar's cgroup namespace",
        "0::/not/here\n": "not readable under",
        "0::/\n": "root cgroup",
        "1:cpu:/x\n": "no memory controller",
    }
    for line, reason in cases.items():
        proc = fake_proc(tmp_path, 10, line)
        fake_proc(tmp_path, 20, "0::/sidecar\n")
        memory = ProcfsTrainerMemory(10, proc=str(proc), cgroup_root=str(root), self_pid=20)
        assert not memory.cgroup.available and reason in (memory.cgroup.reason or ""), (line, memory.cgroup)
        assert memory.sample() is None
    gone = ProcfsTrainerMemory(99, proc=str(tmp_path / "proc"), cgroup_root=str(root))
    assert not gone.cgroup.available and "cannot be read" in (gone.cgroup.reason or "")
    assert gone.uid is None


def test_the_sidecars_own_cgroup_is_found_at_the_mounts_root_without_a_namespace(tmp_path: Path) -> None:
    proc = fake_proc(tmp_path, 10, "0::/docker/abc\n")
    fake_proc(tmp_path, 20, "0::/docker/abc\n")
    memory_files(tmp_path / "cg", "v2", anon=MIB, shmem=MIB)
    memory = ProcfsTrainerMemory(10, proc=str(proc), cgroup_root=str(tmp_path / "cg"), self_pid=20)
    assert memory.cgroup.available and memory.cgroup.sidecar_own is True


def test_no_symlink_is_followed_to_the_cgroup(tmp_path: Path) -> None:
    memory_files(tmp_path / "real", "v2", anon=MIB, shmem=MIB)
    (tmp_path / "cg").mkdir()
    (tmp_path / "cg" / "trainer").symlink_to(tmp_path / "real")
    proc = fake_proc(tmp_path, 10, "0::/trainer\n")
    fake_proc(tmp_path, 20, "0::/sidecar\n")
    memory = ProcfsTrainerMemory(10, proc=str(proc), cgroup_root=str(tmp_path / "cg"), self_pid=20)
    assert not memory.cgroup.available
    os.unlink(tmp_path / "cg" / "trainer")
    (tmp_path / "cg" / "trainer").mkdir()
    (tmp_path / "cg" / "trainer" / "memory.current").symlink_to(tmp_path / "real" / "memory.current")
    (tmp_path / "cg" / "trainer" / "memory.stat").symlink_to(tmp_path / "real" / "memory.stat")
    memory = ProcfsTrainerMemory(10, proc=str(proc), cgroup_root=str(tmp_path / "cg"), self_pid=20)
    assert not memory.cgroup.available


def test_this_machines_own_cgroup_reads_or_says_why() -> None:
    memory = ProcfsTrainerMemory(os.getpid())
    assert memory.uid == os.getuid()
    if memory.cgroup.available:
        assert memory.cgroup.sidecar_own is True
        reading = memory.sample()
        assert reading is not None and reading.current_bytes is not None and reading.held_bytes is not None
    else:
        assert memory.cgroup.reason


# ---------------------------------------------------------------------- /dev/shm


def test_the_shm_scan_names_this_attempts_files_of_the_trainers_uid_only(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    (shm / "sub" / "deeper").mkdir(parents=True)
    old = shm / "from-before"
    old.write_bytes(b"x")
    since = time.time()
    os.utime(shm / "from-before", (since - 3600, since - 3600))
    (shm / "left").write_bytes(b"a" * 5000)
    (shm / "sub" / "deeper" / "nested").write_bytes(b"b")
    (shm / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").write_bytes(b"c")
    (shm / "dirlink").symlink_to(tmp_path)
    (shm / "bad\x1bname\udcff").write_bytes(b"d")
    found = scan_shm(str(shm), os.getuid(), since - 1)
    paths = {f.path: f for f in found.files}
    # from-before: its mtime was set back, but its ctime says it was touched now.
    assert set(paths) == {
        f"{shm}/left",
        f"{shm}/sub/deeper/nested",
        f"{shm}/from-before",
        f"{shm}/bad\\x1bname\\xff",
    }
    assert paths[f"{shm}/left"].bytes == 5000
    assert not found.truncated and found.error is None
    assert scan_shm(str(shm), os.getuid() + 1, 0).files == []
    assert scan_shm(str(shm), os.getuid(), time.time() + 3600).files == []


def test_the_shm_scan_is_bounded(tmp_path: Path) -> None:
    shm = tmp_path / "shm"
    deep = shm.joinpath(*["d"] * 12)
    deep.mkdir(parents=True)
    (deep / "hidden").write_bytes(b"x")
    for i in range(30):
        (shm / f"f{i}").write_bytes(b"x")
    listed = scan_shm(str(shm), os.getuid(), 0, max_listed=4)
    assert len(listed.files) == 4 and listed.more == 26 and listed.truncated  # the deep dir: past the depth
    few = scan_shm(str(shm), os.getuid(), 0, max_entries=5)
    assert few.truncated and len(few.files) <= 5
    assert scan_shm(str(tmp_path / "absent"), 0, 0).error
    assert scan_shm(str(shm), None, 0).error == "the trainer's UID is unknown"


def test_shown_escapes_what_a_terminal_would_obey() -> None:
    assert shown("/dev/shm/a\nb\u202e") == "/dev/shm/a\\nb\\u202e"
    assert len(shown("x" * 10_000)) == 512
