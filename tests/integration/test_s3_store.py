"""S3DeadlineStore against a real SeaweedFS: records, the deadline core on top, the lease lock."""

from __future__ import annotations

import json
import select
import subprocess
import textwrap
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any

import botocore.exceptions
import pytest

from sidecar.adapters.s3_store import S3DeadlineStore
from sidecar.core.deadline import DeadlineClock, DeadlineRecord, obtain_record
from sidecar.core.errors import (
    AlreadySupervisedError,
    ConfigError,
    DeadlineRecordError,
    RecordExistsError,
    RefusedError,
    StoreUnavailableError,
)
from sidecar.core.identity import RunIdentity, make_identity, run_slot
from sidecar.settings import S3Settings
from tests.cluster.system import free_ports
from tests.fixtures.processes import PYTHON, Spawner
from tests.fixtures.s3 import SeaweedServer

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

pytestmark = [pytest.mark.integration, pytest.mark.s3]

MAX_BUDGET = 7 * 24 * 3600.0
WAIT_S = 60.0  # generous: the machine is shared
LEASE_S = 2.0
RENEW_S = 0.4


@pytest.fixture
def run_id() -> str:
    return str(uuid.uuid4())


def _settings(server: SeaweedServer, **extra: Any) -> S3Settings:
    # A fresh deadline prefix per test keeps tests independent in the shared bucket.
    values: dict[str, Any] = {
        "deadline_prefix": f"deadlines-{uuid.uuid4().hex[:12]}",
        "lock_lease_s": LEASE_S,
        "lock_renew_interval_s": RENEW_S,
    }
    values.update(extra)
    return server.settings(**values)


def _store(server: SeaweedServer, settings: S3Settings, **kwargs: Any) -> S3DeadlineStore:
    return S3DeadlineStore(settings, client_factory=server.factory(), **kwargs)


def _lease(client: S3Client, server: SeaweedServer, store: S3DeadlineStore, run_id: str) -> Any:
    answer = client.get_object(Bucket=server.bucket, Key=store.lock_key(run_id))
    return json.loads(answer["Body"].read()), answer["ETag"]


def test_create_load_and_conflict(seaweedfs: SeaweedServer, run_id: str) -> None:
    store = _store(seaweedfs, _settings(seaweedfs))
    assert store.load(run_id) is None
    store.create(run_id, b'{"record": 1}\n')
    assert store.load(run_id) == b'{"record": 1}\n'
    with pytest.raises(RecordExistsError, match="already exists"):
        store.create(run_id, b'{"record": 2}\n')
    assert store.load(run_id) == b'{"record": 1}\n'
    head = seaweedfs.client().head_object(Bucket=seaweedfs.bucket, Key=store.record_key(run_id))
    assert head["ContentLength"] == len(b'{"record": 1}\n')
    assert store.location.startswith(f"s3://{seaweedfs.bucket}/deadlines-")


def test_run_ids_that_are_not_uuids_are_refused(seaweedfs: SeaweedServer) -> None:
    store = _store(seaweedfs, _settings(seaweedfs))
    with pytest.raises(ConfigError):
        store.load("../../other-prefix/x")


def test_the_deadline_core_creates_then_resumes_the_same_record(
    seaweedfs: SeaweedServer, run_id: str
) -> None:
    settings = _settings(seaweedfs)
    first_store = _store(seaweedfs, settings)
    identity = make_identity(
        run_id=run_id,
        command=("python3", "train.py"),
        budget_s=3600,
        checkpoint_margin_s=60,
        deadline_store=first_store.location,
    )
    created = obtain_record(
        first_store, identity, now_wall=1000.0, resume_required=False, max_budget_s=MAX_BUDGET
    ).record
    # A later attempt (new pod, new store object) resumes: same deadline, never extended.
    resumed = obtain_record(
        _store(seaweedfs, settings),
        identity,
        now_wall=5000.0,
        resume_required=True,
        max_budget_s=MAX_BUDGET,
    ).record
    assert resumed.deadline_unix == created.deadline_unix == 4600.0


def test_a_record_that_reads_back_differently_fails_closed(seaweedfs: SeaweedServer, run_id: str) -> None:
    """Another writer's bytes under a create the store answered with success (here: written right
    after ours) are caught on read-back, and named as the store not keeping the condition."""
    settings = _settings(seaweedfs)
    vandal = seaweedfs.client()
    key = f"{settings.deadline_prefix}/{run_id}.json"

    def overwrite(**_: Any) -> None:
        vandal.put_object(Bucket=seaweedfs.bucket, Key=key, Body=b"tampered")

    def factory(s: S3Settings) -> S3Client:
        client = seaweedfs.factory()(s)
        client.meta.events.register("after-call.s3.PutObject", overwrite)
        return client

    store = S3DeadlineStore(settings, client_factory=factory)
    with pytest.raises(
        DeadlineRecordError, match=r"with success, but the key holds other bytes .*honour conditional"
    ):
        store.create(run_id, b"original")


def test_wrong_credentials_are_a_config_error(seaweedfs: SeaweedServer, run_id: str) -> None:
    store = S3DeadlineStore(_settings(seaweedfs), client_factory=seaweedfs.factory(secret_key="wrong-secret"))
    with pytest.raises(ConfigError, match="rejected the credentials"):
        store.load(run_id)
    with pytest.raises(ConfigError, match="SignatureDoesNotMatch"):
        store.create(run_id, b"x")


def test_unreachable_store_is_transient(seaweedfs: SeaweedServer, run_id: str) -> None:
    (port,) = free_ports(1)
    settings = _settings(
        seaweedfs, endpoint_url=f"http://127.0.0.1:{port}", max_attempts=2, connect_timeout_s=1.0
    )
    sent: list[str] = []

    def counting_factory(s3: S3Settings) -> S3Client:
        client = seaweedfs.factory()(s3)
        client.meta.events.register("before-send.s3", lambda **_: sent.append("x"))
        return client

    store = S3DeadlineStore(settings, client_factory=counting_factory)
    with pytest.raises(StoreUnavailableError, match="unreachable") as info:
        store.load(run_id)
    assert info.value.exit_code.retryable
    assert len(sent) == 2  # max_attempts, retried


def test_lock_is_held_renewed_and_released(seaweedfs: SeaweedServer, run_id: str) -> None:
    lost: list[str] = []
    store = _store(seaweedfs, _settings(seaweedfs), on_lock_lost=lost.append)
    client = seaweedfs.client()
    with store.lock(run_id):
        assert store.inheritable_lock_fd(run_id) is None  # a lease, not a descriptor to pass on
        first, first_etag = _lease(client, seaweedfs, store, run_id)
        deadline = time.monotonic() + WAIT_S
        while True:
            note, etag = _lease(client, seaweedfs, store, run_id)
            if note["seq"] > first["seq"]:
                break
            assert time.monotonic() < deadline, "the lease was never renewed"
            time.sleep(RENEW_S / 2)
        assert etag != first_etag and note["owner"] == first["owner"]
        assert lost == []
    with pytest.raises(botocore.exceptions.ClientError, match=r"404|Not Found"):
        client.head_object(Bucket=seaweedfs.bucket, Key=store.lock_key(run_id))


def test_second_supervisor_is_refused_while_the_first_renews(seaweedfs: SeaweedServer, run_id: str) -> None:
    settings = _settings(seaweedfs)
    lost: list[str] = []
    first = _store(seaweedfs, settings, on_lock_lost=lost.append)
    second = _store(seaweedfs, settings)
    with first.lock(run_id):
        # Refused on an observed renewal (not by a takeover race).
        with pytest.raises(AlreadySupervisedError, match="renews its lease"), second.lock(run_id):
            pass
        assert lost == []
    with second.lock(run_id):  # released: the next supervisor gets it at once
        pass


_HOLDER = textwrap.dedent(
    """
    import sys, time
    from sidecar.adapters.s3_store import S3DeadlineStore
    from sidecar.settings import S3Settings
    from tests.fixtures.s3 import SeaweedServer
    settings = S3Settings.model_validate_json(sys.argv[1])
    server = SeaweedServer(endpoint=settings.endpoint_url, bucket=settings.bucket,
                           data_dir=None, pid=0, command=())
    store = S3DeadlineStore(settings, client_factory=server.factory())
    with store.lock(sys.argv[2]):
        print("locked", flush=True)
        sys.stdin.readline()
    print("released", flush=True)
    """
)


def _read_line(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], WAIT_S)
    assert ready, f"child {proc.pid} wrote nothing within {WAIT_S} s"
    return proc.stdout.readline().decode().strip()


def test_two_supervisor_processes_conflict(seaweedfs: SeaweedServer, run_id: str, spawn: Spawner) -> None:
    settings = _settings(seaweedfs)
    holder = spawn(
        [PYTHON, "-c", _HOLDER, settings.model_dump_json(), run_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert _read_line(holder) == "locked"
    with pytest.raises(AlreadySupervisedError), _store(seaweedfs, settings).lock(run_id):
        pass
    assert holder.stdin is not None
    holder.stdin.write(b"\n")
    holder.stdin.flush()
    assert _read_line(holder) == "released"
    with _store(seaweedfs, settings).lock(run_id):
        pass


def test_a_crashed_owners_lease_is_taken_over_after_the_lease_time(
    seaweedfs: SeaweedServer, run_id: str, spawn: Spawner
) -> None:
    settings = _settings(seaweedfs)
    holder = spawn(
        [PYTHON, "-c", _HOLDER, settings.model_dump_json(), run_id],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert _read_line(holder) == "locked"
    holder.kill()  # crash: the lease stays behind, never renewed again
    holder.wait(timeout=WAIT_S)
    store = _store(seaweedfs, settings)
    client = seaweedfs.client()
    stale, _ = _lease(client, seaweedfs, store, run_id)
    started = time.monotonic()
    with store.lock(run_id):
        waited = time.monotonic() - started
        taken, _ = _lease(client, seaweedfs, store, run_id)
    assert waited >= LEASE_S  # never before the lease could have expired on our clock
    assert taken["owner"] != stale["owner"]


def test_a_lease_taken_over_elsewhere_is_reported_lost_and_left_alone(
    seaweedfs: SeaweedServer, run_id: str
) -> None:
    lost: list[str] = []
    reported = threading.Event()

    def on_lost(reason: str) -> None:
        lost.append(reason)
        reported.set()

    store = _store(seaweedfs, _settings(seaweedfs), on_lock_lost=on_lost)
    client = seaweedfs.client()
    with store.lock(run_id):
        client.put_object(Bucket=seaweedfs.bucket, Key=store.lock_key(run_id), Body=b'{"owner": "x"}')
        assert reported.wait(WAIT_S), "the lost lease was never reported"
    assert len(lost) == 1 and "taken over" in lost[0]
    # The new owner's lease survives our exit.
    body = client.get_object(Bucket=seaweedfs.bucket, Key=store.lock_key(run_id))["Body"].read()
    assert body == b'{"owner": "x"}'


def test_a_lease_that_cannot_be_renewed_is_reported_lost(seaweedfs: SeaweedServer, run_id: str) -> None:
    """The store becomes unreachable while we hold the lock: lost after the lease time."""
    reported = threading.Event()
    broken = threading.Event()
    lost: list[str] = []

    def on_lost(reason: str) -> None:
        lost.append(reason)
        reported.set()

    def factory(s: S3Settings) -> S3Client:
        client = seaweedfs.factory()(s)

        def cut(request: Any, **_: Any) -> None:
            if broken.is_set():
                (port,) = free_ports(1)
                request.url = f"http://127.0.0.1:{port}/"

        client.meta.events.register("before-send.s3", cut)
        return client

    settings = _settings(seaweedfs, max_attempts=1, connect_timeout_s=0.5)
    store = S3DeadlineStore(settings, client_factory=factory, on_lock_lost=on_lost)
    with store.lock(run_id):
        broken.set()
        assert reported.wait(WAIT_S), "the unrenewable lease was never reported"
    assert len(lost) == 1 and "could not be renewed" in lost[0]


def test_attempts_are_numbered_by_conditional_creates(seaweedfs: SeaweedServer, run_id: str) -> None:
    settings = _settings(seaweedfs)
    first, second = _store(seaweedfs, settings), _store(seaweedfs, settings)
    claims = [first.claim_attempt(run_id), second.claim_attempt(run_id), first.claim_attempt(run_id)]
    assert claims == [1, 2, 3]
    other_run = str(uuid.uuid4())
    assert first.claim_attempt(other_run) == 1
    # The ledger the record is checked against: when each claim was made.
    ledger = second.attempt_claims(run_id)
    assert len(ledger) == 3
    assert all(claimed is not None and abs(claimed - time.time()) < 300 for claimed in ledger)
    assert second.attempt_claims(str(uuid.uuid4())) == []


# ---------------------------------------------------------------------- the server's clock


def _identity(store: S3DeadlineStore, run_id: str) -> RunIdentity:
    return make_identity(
        run_id=run_id, command=("python3", "train.py"), budget_s=3600, checkpoint_margin_s=60,
        deadline_store=store.location,
    )  # fmt: skip


def test_the_servers_clock_bounds_a_node_whose_clock_is_behind(seaweedfs: SeaweedServer, run_id: str) -> None:
    store = _store(seaweedfs, _settings(seaweedfs))
    assert store.store_clock(run_id) is None  # no record yet
    # Made on another node (no boot anchor here), with a correct clock.
    identity = _identity(store, run_id)
    record = obtain_record(
        store, identity, now_wall=time.time(), resume_required=False, max_budget_s=7200
    ).record
    reading = store.store_clock(run_id)
    assert reading is not None and reading.source == "the deadline store's clock (S3 LastModified)"
    assert abs(reading.record_written - record.started_unix) < 5 and abs(reading.now - time.time()) < 5
    # This node's wall clock is an hour behind the server's: it would see an hour more.
    with pytest.raises(RefusedError, match=r"the deadline store's clock \(S3 LastModified\) says"):
        DeadlineClock(record, now_wall=time.time() - 3600, now_monotonic=0.0, store=reading)
    # A correct node runs on the least of its clocks.
    reading = store.store_clock(run_id)
    fine = DeadlineClock(record, now_wall=time.time(), now_monotonic=0.0, store=reading)
    assert fine.remaining(time.time(), 0.0) <= 3600


def test_a_record_made_by_a_node_whose_clock_was_ahead_is_refused(
    seaweedfs: SeaweedServer, run_id: str
) -> None:
    store = _store(seaweedfs, _settings(seaweedfs))
    # Its clock 10 minutes ahead: the record would start (and end) 10 minutes late.
    identity = _identity(store, run_id)
    ahead = time.time() + 600
    record = obtain_record(store, identity, now_wall=ahead, resume_required=False, max_budget_s=7200).record
    reading = store.store_clock(run_id)
    with pytest.raises(
        RefusedError, match=r"s later than the deadline store's clock \(S3 LastModified\) dates"
    ):
        DeadlineClock(record, now_wall=time.time() + 600, now_monotonic=0.0, store=reading)


def test_indexes_of_one_run_lock_and_number_their_attempts_apart(
    seaweedfs: SeaweedServer, run_id: str
) -> None:
    """A multi-pod soak: each index holds its own lease and ledger; the run's ledger is all of them."""
    settings = _settings(seaweedfs)
    first, second = _store(seaweedfs, settings), _store(seaweedfs, settings)
    zero, one = run_slot(run_id, 0), run_slot(run_id, 1)
    with first.lock(zero), second.lock(one):
        with pytest.raises(AlreadySupervisedError), _store(seaweedfs, settings).lock(one):
            pass
        assert [first.claim_attempt(zero), second.claim_attempt(one), second.claim_attempt(one)] == [1, 1, 2]
    assert len(first.attempt_claims(run_id)) == 3
    assert first.attempt_claims(str(uuid.uuid4())) == []


def _start_at_once(stores: list[S3DeadlineStore], identity: RunIdentity) -> list[Any]:
    """Each store, on its own thread, creates-or-resumes the run's record then claims its index's
    attempt, all released together; what each got (a record or an exception), in index order."""
    barrier = threading.Barrier(len(stores))
    outcomes: dict[int, Any] = {}

    def start(index: int, store: S3DeadlineStore) -> None:
        barrier.wait(WAIT_S)
        try:
            record = obtain_record(
                store, identity, now_wall=time.time(), resume_required=False, max_budget_s=MAX_BUDGET
            ).record
            store.claim_attempt(run_slot(identity.run_id, index))
            outcomes[index] = record
        except Exception as exc:  # the outcome under test: returned, asserted by the caller
            outcomes[index] = exc

    threads = [threading.Thread(target=start, args=(i, s)) for i, s in enumerate(stores)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT_S)
    return [outcomes.get(index) for index in range(len(stores))]


def test_indexes_starting_at_once_all_resume_one_record(seaweedfs: SeaweedServer) -> None:
    """The indexes of a multi-pod soak start together, each on its own client: every index gets
    the same record and none is refused (a claim seen before its record reads as a deleted one)."""
    settings = _settings(seaweedfs)
    for _ in range(5):
        run_id = str(uuid.uuid4())
        stores = [_store(seaweedfs, settings) for _ in range(6)]
        identity = make_identity(
            run_id=run_id,
            command=("python3", "train.py"),
            budget_s=3600,
            checkpoint_margin_s=60,
            deadline_store=stores[0].location,
        )
        outcomes = _start_at_once(stores, identity)
        assert not [o for o in outcomes if not isinstance(o, DeadlineRecord)], outcomes
        assert all(outcome == outcomes[0] for outcome in outcomes), outcomes
        assert len(stores[0].attempt_claims(run_id)) == len(stores)
