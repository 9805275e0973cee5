"""FileDeadlineStore with real files, real processes and real flock."""

from __future__ import annotations

import errno
import json
import os
import select
import signal
import stat
import subprocess
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.filestore import FileDeadlineStore
from sidecar.adapters.identity_files import identity_from_settings
from sidecar.core.deadline import obtain_record, parse_record
from sidecar.core.errors import (
    AlreadySupervisedError,
    ConfigError,
    RecordExistsError,
    RefusedError,
    StoreUnavailableError,
)
from sidecar.core.identity import RunIdentity, make_identity, run_slot, sha256_hex
from sidecar.core.redaction import DEFAULT_RULES
from sidecar.settings import DeadlineSettings
from tests.fixtures.processes import PYTHON, Spawner

pytestmark = pytest.mark.integration

RUN_ID = "0b6f1c52-8d0e-4a53-9d1c-3f2b1a7e9c10"
MAX_BUDGET = 7 * 24 * 3600.0
WAIT_S = 60.0  # generous: the machine is shared and Python start-up is slow under load


def identity(store: FileDeadlineStore) -> RunIdentity:
    return make_identity(
        run_id=RUN_ID,
        command=("python3", "train.py"),
        budget_s=7200,
        checkpoint_margin_s=120,
        deadline_store=store.location,
    )


def read_line(proc: subprocess.Popen[bytes], timeout: float = WAIT_S) -> str:
    """One stdout line from a child, failing instead of hanging when it never comes."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"child {proc.pid} wrote nothing within {timeout} s"
    return proc.stdout.readline().decode().strip()


def test_create_load_round_trip(tmp_path: Path) -> None:
    store = FileDeadlineStore(tmp_path / "nested" / "deadlines")
    assert store.load(RUN_ID) is None
    store.create(RUN_ID, b"payload\n")
    assert store.load(RUN_ID) == b"payload\n"
    path = store.record_path(RUN_ID)
    assert path == tmp_path / "nested" / "deadlines" / f"{RUN_ID}.json"
    # Never rewritten; no temp file left behind.
    assert stat.S_IMODE(path.stat().st_mode) == 0o444
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]


def test_second_create_is_refused_and_keeps_the_first(tmp_path: Path) -> None:
    store = FileDeadlineStore(tmp_path)
    store.create(RUN_ID, b"first")
    with pytest.raises(RecordExistsError):
        store.create(RUN_ID, b"second")
    assert store.load(RUN_ID) == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{RUN_ID}.json"]


def test_create_fsyncs_file_then_publishes_then_fsyncs_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spy on the real calls: the data is durable before the name appears, the name after."""
    events: list[tuple[str, str]] = []
    real_fsync, real_link = os.fsync, os.link

    def spy_fsync(fd: int) -> None:
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def spy_link(src: Any, dst: Any, **kwargs: Any) -> None:
        events.append(("link", str(dst)))
        real_link(src, dst, **kwargs)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "link", spy_link)
    store = FileDeadlineStore(tmp_path)
    store.create(RUN_ID, b"x" * 100_000)
    record = str(store.record_path(RUN_ID))
    assert [kind for kind, _ in events] == ["fsync", "link", "fsync"]
    temp_name = Path(events[0][1].removesuffix(" (deleted)")).name
    assert temp_name.startswith(f".{RUN_ID}.json.") and temp_name.endswith(".tmp")
    assert events[1] == ("link", record)
    assert events[2] == ("fsync", str(tmp_path))
    assert store.load(RUN_ID) == b"x" * 100_000


def test_stray_temp_file_from_a_crash_is_ignored(tmp_path: Path) -> None:
    store = FileDeadlineStore(tmp_path)
    (tmp_path / f".{RUN_ID}.json.deadbeef.tmp").write_bytes(b'{"partial')
    assert store.load(RUN_ID) is None
    record = obtain_record(
        store, identity(store), now_wall=1000.0, resume_required=False, max_budget_s=MAX_BUDGET
    ).record
    assert record.started_unix == 1000.0


def test_load_caps_what_it_reads(tmp_path: Path) -> None:
    store = FileDeadlineStore(tmp_path)
    store.create(RUN_ID, b" " * (2 * 1024 * 1024))
    data = store.load(RUN_ID)
    assert data is not None and len(data) == 1024 * 1024 + 1


def test_run_id_cannot_escape_the_directory(tmp_path: Path) -> None:
    store = FileDeadlineStore(tmp_path)
    for bad in ("../escape", "/etc/passwd", ""):
        with pytest.raises(ConfigError, match="run id must be a UUID"):
            store.create(bad, b"x")
        with pytest.raises(ConfigError):
            store.load(bad)
        with pytest.raises(ConfigError), store.lock(bad):
            pass
    assert list(tmp_path.iterdir()) == []


def test_a_misconfigured_store_is_a_usage_error(tmp_path: Path) -> None:
    """Paths that cannot work (a file where the directory should be) will not heal on a retry."""
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    store = FileDeadlineStore(blocker / "deadlines")
    with pytest.raises(ConfigError, match=str(blocker)):
        store.create(RUN_ID, b"x")
    with pytest.raises(ConfigError, match="cannot create deadline store"), store.lock(RUN_ID):
        pass
    with pytest.raises(ConfigError, match="cannot read deadline record"):
        store.load(RUN_ID)


def test_other_os_errors_are_transient(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileDeadlineStore(tmp_path / "store")

    def broken_disk(*_args: object, **_kwargs: object) -> int:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "open", broken_disk)
    with pytest.raises(StoreUnavailableError, match="Input/output error"):
        store.create(RUN_ID, b"x")


RACER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from sidecar.adapters.filestore import FileDeadlineStore
    from sidecar.core.deadline import obtain_record
    from sidecar.core.identity import make_identity
    store = FileDeadlineStore(Path(sys.argv[1]))
    ident = make_identity(run_id=sys.argv[2], command=("python3", "train.py"), budget_s=7200,
                          checkpoint_margin_s=120, deadline_store=store.location)
    print("ready", flush=True)
    while not os.path.exists(sys.argv[3]):
        time.sleep(0.001)
    record = obtain_record(store, ident, now_wall=time.time(), resume_required=False,
                              max_budget_s=7 * 24 * 3600.0).record
    print(json.dumps([record.started_unix, record.deadline_unix]), flush=True)
    """
)


def test_concurrent_creators_in_processes_share_one_record(tmp_path: Path, spawn: Spawner) -> None:
    store_dir, go = tmp_path / "store", tmp_path / "go"
    racers = [
        spawn([PYTHON, "-c", RACER, str(store_dir), RUN_ID, str(go)], stdout=subprocess.PIPE)
        for _ in range(6)
    ]
    for proc in racers:
        assert read_line(proc) == "ready"
    go.touch()
    seen = {tuple(json.loads(read_line(proc))) for proc in racers}
    for proc in racers:
        assert proc.wait(timeout=WAIT_S) == 0
    assert len(seen) == 1
    store = FileDeadlineStore(store_dir)
    data = store.load(RUN_ID)
    assert data is not None
    stored = parse_record(data, max_budget_s=MAX_BUDGET)
    assert seen == {(stored.started_unix, stored.deadline_unix)}
    assert sorted(p.name for p in store_dir.iterdir()) == [f"{RUN_ID}.json"]


def test_concurrent_creators_in_threads_share_one_record(tmp_path: Path) -> None:
    store = FileDeadlineStore(tmp_path)
    barrier = threading.Barrier(8)
    results: list[float] = []
    errors: list[BaseException] = []

    def race(offset: int) -> None:
        try:
            barrier.wait(timeout=WAIT_S)
            record = obtain_record(
                store,
                identity(store),
                now_wall=1_000_000.0 + offset,
                resume_required=False,
                max_budget_s=MAX_BUDGET,
            ).record
            results.append(record.deadline_unix)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=WAIT_S)
    assert errors == []
    assert len(results) == 8
    assert len(set(results)) == 1
    assert results[0] in {1_000_000.0 + i + 7200 for i in range(8)}


HOLDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from sidecar.adapters.filestore import FileDeadlineStore
    from sidecar.core.errors import AlreadySupervisedError
    store = FileDeadlineStore(Path(sys.argv[1]))
    try:
        with store.lock(sys.argv[2]):
            print("locked", flush=True)
            sys.stdin.read()
    except AlreadySupervisedError as exc:
        print("refused: " + str(exc), flush=True)
        sys.exit(3)
    print("released", flush=True)
    """
)


def holder(spawn: Spawner, store_dir: Path) -> subprocess.Popen[bytes]:
    return spawn(
        [PYTHON, "-c", HOLDER, str(store_dir), RUN_ID],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def test_second_supervisor_in_another_process_is_refused(tmp_path: Path, spawn: Spawner) -> None:
    store = FileDeadlineStore(tmp_path)
    first = holder(spawn, tmp_path)
    assert read_line(first) == "locked"
    with (
        pytest.raises(AlreadySupervisedError, match=f"another supervisor holds run {RUN_ID}") as caught,
        store.lock(RUN_ID),
    ):
        pass
    assert f"held by pid {first.pid}" in str(caught.value)
    assert first.stdin is not None
    first.stdin.close()
    assert read_line(first) == "released"
    assert first.wait(timeout=WAIT_S) == 0
    with store.lock(RUN_ID):
        # And now this process holds it: another process is refused in turn.
        second = holder(spawn, tmp_path)
        assert read_line(second).startswith(f"refused: another supervisor holds run {RUN_ID}")
        assert second.wait(timeout=WAIT_S) == 3


def test_second_lock_in_the_same_process_is_refused(tmp_path: Path) -> None:
    one, two = FileDeadlineStore(tmp_path), FileDeadlineStore(tmp_path)
    with one.lock(RUN_ID):
        with pytest.raises(AlreadySupervisedError), two.lock(RUN_ID):
            pass
        with pytest.raises(AlreadySupervisedError), one.lock(RUN_ID):
            pass
    with two.lock(RUN_ID):
        pass


def test_killed_supervisor_releases_the_lock(tmp_path: Path, spawn: Spawner) -> None:
    first = holder(spawn, tmp_path)
    assert read_line(first) == "locked"
    os.kill(first.pid, signal.SIGKILL)
    assert first.wait(timeout=WAIT_S) == -signal.SIGKILL
    with FileDeadlineStore(tmp_path).lock(RUN_ID):
        pass


def test_inherited_lock_fd_outlives_the_supervisor(tmp_path: Path, spawn: Spawner) -> None:
    """The seed passes the lock fd to its guardian: the job stays locked while the child lives."""
    store = FileDeadlineStore(tmp_path)
    with store.lock(RUN_ID):
        fd = store.inheritable_lock_fd(RUN_ID)
        child = spawn([PYTHON, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE, pass_fds=(fd,))
    with pytest.raises(ConfigError, match="not locked"):
        store.inheritable_lock_fd(RUN_ID)
    with pytest.raises(AlreadySupervisedError), store.lock(RUN_ID):
        pass
    assert child.stdin is not None
    child.stdin.close()
    assert child.wait(timeout=WAIT_S) == 0
    with store.lock(RUN_ID):
        pass


def test_identity_from_settings_hashes_files_and_resolves_the_checkpoint(tmp_path: Path) -> None:
    manifest, train = tmp_path / "manifest.json", tmp_path / "train.py"
    manifest.write_bytes(b'{"shards": 3}')
    train.write_bytes(b"print('train')\n")
    (tmp_path / "ckpt").mkdir()
    link = tmp_path / "latest"
    link.symlink_to(tmp_path / "ckpt")
    settings = DeadlineSettings.model_validate(
        {"dataset_manifest": manifest, "code_files": [train], "checkpoint_path": link / "model.pt"}
    )
    store = FileDeadlineStore(tmp_path / "store")
    got = identity_from_settings(
        settings,
        run_id=RUN_ID.upper(),
        command=["python3", "train.py"],
        deadline_store=store.location,
        redaction=DEFAULT_RULES,
    )
    assert got.run_id == RUN_ID
    assert got.command == ("python3", "train.py")
    assert got.dataset_manifest_sha256 == sha256_hex(b'{"shards": 3}')
    assert got.code_sha256 == {str(train): sha256_hex(b"print('train')\n")}
    assert got.resume_checkpoint_path == str(tmp_path.resolve() / "ckpt" / "model.pt")
    assert got.budget_s == settings.budget_s and got.checkpoint_margin_s == settings.checkpoint_margin_s
    train.write_bytes(b"print('changed')\n")
    changed = identity_from_settings(
        settings,
        run_id=RUN_ID,
        command=["python3", "train.py"],
        deadline_store=store.location,
        redaction=DEFAULT_RULES,
    )
    assert got.differences(changed) == ["code_sha256"]


def test_identity_from_settings_errors(tmp_path: Path) -> None:
    train = tmp_path / "train.py"
    train.write_text("x")
    with pytest.raises(ConfigError, match="listed twice"):
        identity_from_settings(
            DeadlineSettings.model_validate({"code_files": [train, train]}),
            run_id=RUN_ID,
            command=["t"],
            deadline_store="/s",
            redaction=DEFAULT_RULES,
        )
    with pytest.raises(ConfigError, match="cannot read"):
        identity_from_settings(
            DeadlineSettings.model_validate({"dataset_manifest": tmp_path / "missing"}),
            run_id=RUN_ID,
            command=["t"],
            deadline_store="/s",
            redaction=DEFAULT_RULES,
        )
    with pytest.raises(ConfigError, match="run id must be a UUID"):
        identity_from_settings(
            DeadlineSettings.model_validate({}),
            run_id="job-1",
            command=["t"],
            deadline_store="/s",
            redaction=DEFAULT_RULES,
        )


def test_location_is_the_resolved_directory(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    assert FileDeadlineStore(tmp_path / "alias").location == str((tmp_path / "real").resolve())


def test_attempts_are_numbered_once_each_even_under_a_race(tmp_path: Path) -> None:
    store = FileDeadlineStore(tmp_path)
    run_id = "7c0b6a5e-3f4d-4b8e-9a51-2d6f0c1e8b47"
    claimed: list[int] = []
    threads = [threading.Thread(target=lambda: claimed.append(store.claim_attempt(run_id))) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(claimed) == list(range(1, 9))
    assert FileDeadlineStore(tmp_path).claim_attempt(run_id) == 9


# ---------------------------------------------------------------------- tamper evidence


def planted(tmp_path: Path) -> tuple[FileDeadlineStore, Path, bytes]:
    """A store with a genuine record, its path and bytes, for a test to replace by hand."""
    store = FileDeadlineStore(tmp_path / "deadlines")
    obtain_record(store, identity(store), now_wall=1.7e9, resume_required=False, max_budget_s=MAX_BUDGET)
    path = store.record_path(RUN_ID)
    return store, path, path.read_bytes()


@pytest.mark.parametrize(
    ("tamper", "problem"),
    [
        ("symlink", "not a regular file"),
        ("directory", "not a regular file"),
        ("world-writable", r"is writable by others \(mode 0666"),
        ("unreadable", r"is not readable by its owner \(mode 0000"),
        ("foreign owner", "is owned by uid 65534"),
    ],
)
def test_a_record_the_store_did_not_write_is_refused(tmp_path: Path, tamper: str, problem: str) -> None:
    store, path, data = planted(tmp_path)
    path.unlink()
    if tamper == "symlink":
        (tmp_path / "elsewhere.json").write_bytes(data)
        path.symlink_to(tmp_path / "elsewhere.json")
    elif tamper == "directory":
        path.mkdir()
    else:
        path.write_bytes(data)
        mode = {"world-writable": 0o666, "unreadable": 0o000}.get(tamper, 0o444)
        path.chmod(mode)
        if tamper == "foreign owner":
            os.chown(path, 65534, 65534)
    with pytest.raises(RefusedError, match=problem):  # 15, never a usage error (64)
        store.load(RUN_ID)


def test_a_deleted_record_is_refused_while_the_ledger_remembers_attempts(tmp_path: Path) -> None:
    store, path, _ = planted(tmp_path)
    store.claim_attempt(RUN_ID)
    path.unlink()
    with pytest.raises(RefusedError, match=r"holds 1 attempt.*record is missing.*refusing a fresh budget"):
        obtain_record(
            store, identity(store), now_wall=1.7e9 + 600, resume_required=False, max_budget_s=MAX_BUDGET
        )
    assert store.load(RUN_ID) is None  # and no fresh record was written


def test_a_record_shifted_later_than_the_ledger_is_refused(tmp_path: Path) -> None:
    store, path, data = planted(tmp_path)
    store.claim_attempt(RUN_ID)  # claimed now, after the record's start (1.7e9)
    shifted = json.loads(data)
    # Self-consistent and one hour later: only the ledger can tell.
    for field in ("started_unix", "deadline_unix"):
        shifted[field] = shifted[field] + 3600 + (time.time() - 1.7e9)
    path.chmod(0o644)
    path.write_bytes(json.dumps(shifted).encode())
    path.chmod(0o444)
    with pytest.raises(RefusedError, match=r"s after the first attempt was claimed .*window shifted"):
        obtain_record(
            store, identity(store), now_wall=time.time(), resume_required=True, max_budget_s=MAX_BUDGET
        )


def test_the_store_clock_is_the_file_systems(tmp_path: Path) -> None:
    store = FileDeadlineStore(tmp_path / "deadlines")
    assert store.store_clock(RUN_ID) is None
    now = time.time()
    obtain_record(store, identity(store), now_wall=now, resume_required=False, max_budget_s=MAX_BUDGET)
    reading = store.store_clock(RUN_ID)
    assert reading is not None
    assert reading.record_written == store.record_path(RUN_ID).stat().st_mtime
    assert abs(reading.now - time.time()) < 5 and reading.now >= reading.record_written
    assert not list((tmp_path / "deadlines").glob(".clock-*"))  # the probe is gone


def test_indexes_of_one_run_lock_and_number_their_attempts_apart(tmp_path: Path) -> None:
    """A multi-pod soak: each index holds its own lock and ledger, all share the run's record."""
    store = FileDeadlineStore(tmp_path)
    zero, one = run_slot(RUN_ID, 0), run_slot(RUN_ID, 1)
    with store.lock(zero), store.lock(one):
        with pytest.raises(AlreadySupervisedError), FileDeadlineStore(tmp_path).lock(one):
            pass
        assert [store.claim_attempt(zero), store.claim_attempt(one), store.claim_attempt(one)] == [1, 1, 2]
    assert store.claim_attempt(RUN_ID) == 1  # the single-pod slot of the same run is apart too
    assert len(store.attempt_claims(RUN_ID)) == 4
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        f"{RUN_ID}.attempts",
        f"{RUN_ID}.index-0.attempts",
        f"{RUN_ID}.index-0.lock",
        f"{RUN_ID}.index-1.attempts",
        f"{RUN_ID}.index-1.lock",
    ]
    with pytest.raises(ConfigError):
        store.claim_attempt(f"{RUN_ID}.index-../x")
