"""Deadline record, create-or-resume and clock: every time is injected, nothing sleeps."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.filestore import FileDeadlineStore
from sidecar.core.boot import BootClock, ReferenceTime, StoreClock
from sidecar.core.deadline import (
    LEDGER_SKEW_TOLERANCE_S,
    MAX_RECORD_BYTES,
    RECORD_FORMAT,
    DeadlineClock,
    DeadlineRecord,
    check_ledger,
    check_startable,
    encode_record,
    new_record,
    obtain_record,
    parse_record,
)
from sidecar.core.errors import (
    ConfigError,
    DeadlineExpiredError,
    DeadlineRecordError,
    InsufficientBudgetError,
    RecordExistsError,
    RefusedError,
)
from sidecar.core.identity import RunIdentity, make_identity, run_slot

RUN_ID = "0b6f1c52-8d0e-4a53-9d1c-3f2b1a7e9c10"
T0 = 1_700_000_000.25
MAX_BUDGET = 7 * 24 * 3600.0


def identity(**overrides: Any) -> RunIdentity:
    fields: dict[str, Any] = {
        "run_id": RUN_ID,
        "command": ("python3", "train.py"),
        "budget_s": 7200,
        "checkpoint_margin_s": 120,
        "deadline_store": "/store",
        "code_sha256": {"train.py": "b" * 64},
    }
    fields.update(overrides)
    return make_identity(**fields)


@pytest.fixture
def store(tmp_path: Path) -> FileDeadlineStore:
    return FileDeadlineStore(tmp_path / "deadlines")


def good_json() -> dict[str, Any]:
    value: dict[str, Any] = json.loads(encode_record(new_record(identity(), now_wall=T0)))
    return value


def test_encode_parse_round_trip_is_exact() -> None:
    record = new_record(identity(), now_wall=T0)
    data = encode_record(record)
    assert parse_record(data, max_budget_s=MAX_BUDGET) == record
    assert record.deadline_unix == T0 + 7200
    assert record.soft_stop_unix == T0 + 7200 - 120
    stored = json.loads(data)
    assert stored["format"] == RECORD_FORMAT == "soak-sidecar-deadline-v3"
    assert stored["identity_sha256"] == identity().digest()


def _mutate(change: Any) -> bytes:
    value = good_json()
    change(value)
    return json.dumps(value).encode()


def _retamper_budget(value: dict[str, Any]) -> None:
    """A careful tamperer: raise the identity's budget and recompute its digest."""
    value["identity"]["budget_s"] = 10800.0
    value["identity_sha256"] = RunIdentity.model_validate(value["identity"]).digest()


CORRUPT: list[tuple[str, bytes, str]] = [
    ("bad json", b'{"format": "soak-sidecar-deadline-v1",', "not valid JSON"),
    ("not utf-8", b"\xff\xfe{}", "not valid JSON"),
    ("empty file", b"", "not valid JSON"),
    ("not an object", b"[1, 2]", "not a JSON object"),
    ("wrong format", _mutate(lambda v: v.update(format="chess-total-deadline-v1")), "format"),
    ("missing format", _mutate(lambda v: v.pop("format")), "format"),
    ("bool number", _mutate(lambda v: v.update(budget_seconds=True)), "invalid deadline number"),
    ("string number", _mutate(lambda v: v.update(started_unix="1")), "invalid deadline number"),
    ("null number", _mutate(lambda v: v.update(deadline_unix=None)), "invalid deadline number"),
    (
        "NaN",
        encode_record(new_record(identity(), now_wall=T0)).replace(
            f'"started_unix": {T0!r}'.encode(), b'"started_unix": NaN'
        ),
        "non-finite",
    ),
    (
        "inf",
        encode_record(new_record(identity(), now_wall=T0)).replace(
            f'"started_unix": {T0!r}'.encode(), b'"started_unix": Infinity'
        ),
        "non-finite",
    ),
    (
        "overflow to inf",
        encode_record(new_record(identity(), now_wall=T0)).replace(
            f'"started_unix": {T0!r}'.encode(), b'"started_unix": 1e999'
        ),
        "invalid deadline number",
    ),
    ("negative budget", _mutate(lambda v: v.update(budget_seconds=-7200)), "budget_seconds"),
    ("zero budget", _mutate(lambda v: v.update(budget_seconds=0)), "budget_seconds"),
    (
        "budget over cap",
        _mutate(lambda v: v.update(budget_seconds=MAX_BUDGET + 1)),
        "budget_seconds",
    ),
    ("margin >= budget", _mutate(lambda v: v.update(checkpoint_margin_seconds=7200)), "margin"),
    ("margin zero", _mutate(lambda v: v.update(checkpoint_margin_seconds=0)), "margin"),
    (
        "inconsistent deadline",
        _mutate(lambda v: v.update(deadline_unix=v["deadline_unix"] + 3600)),
        "inconsistent deadline",
    ),
    (
        "extended budget, consistent numbers",
        _mutate(lambda v: v.update(budget_seconds=10800, deadline_unix=v["started_unix"] + 10800)),
        "disagree with its identity",
    ),
    (
        "tampered identity",
        _mutate(lambda v: v["identity"].update(command=["python3", "other.py"])),
        "tampered",
    ),
    (
        "tampered digest",
        _mutate(lambda v: v.update(identity_sha256="0" * 64)),
        "tampered",
    ),
    (
        "re-digested budget change",
        _mutate(_retamper_budget),
        "disagree with its identity",
    ),
    (
        "invalid identity",
        _mutate(lambda v: v["identity"].update(run_id="x")),
        "identity is invalid",
    ),
    ("identity extra key", _mutate(lambda v: v["identity"].update(extra=1)), "identity is invalid"),
    ("missing key", _mutate(lambda v: v.pop("checkpoint_margin_seconds")), "missing"),
    ("missing identity", _mutate(lambda v: v.pop("identity")), "missing"),
    ("extra key", _mutate(lambda v: v.update(extended=True)), "unknown"),
    (
        "duplicate key",
        encode_record(new_record(identity(), now_wall=T0)).replace(
            b'"budget_seconds": 7200.0', b'"budget_seconds": 7200.0, "budget_seconds": 99999.0'
        ),
        "duplicate key",
    ),
    ("oversized", b" " * (MAX_RECORD_BYTES + 1), "larger than"),
]


@pytest.mark.parametrize(("data", "message"), [c[1:] for c in CORRUPT], ids=[c[0] for c in CORRUPT])
def test_corrupt_record_fails_closed(data: bytes, message: str) -> None:
    with pytest.raises(DeadlineRecordError, match=message):
        parse_record(data, max_budget_s=MAX_BUDGET)


def test_corrupt_cases_mutate_a_valid_record() -> None:
    # Guard for the table above: the untouched record parses, so each failure is the mutation's.
    assert parse_record(json.dumps(good_json()).encode(), max_budget_s=MAX_BUDGET)


def test_corrupt_stored_record_refuses_to_run(store: FileDeadlineStore) -> None:
    store.create(RUN_ID, _mutate(lambda v: v.update(deadline_unix=v["deadline_unix"] + 1)))
    with pytest.raises(DeadlineRecordError, match="inconsistent") as caught:
        obtain_record(store, identity(), now_wall=T0, resume_required=False, max_budget_s=MAX_BUDGET)
    assert isinstance(caught.value, RefusedError)


def test_consistently_extended_record_is_refused_on_resume(store: FileDeadlineStore) -> None:
    """Budget, deadline and identity all rewritten coherently: parses, but is not this run."""

    def extend(value: dict[str, Any]) -> None:
        _retamper_budget(value)
        value["budget_seconds"] = 10800
        value["deadline_unix"] = value["started_unix"] + 10800

    store.create(RUN_ID, _mutate(extend))
    with pytest.raises(RefusedError, match="differs in budget_s"):
        obtain_record(store, identity(), now_wall=T0, resume_required=True, max_budget_s=MAX_BUDGET)


def test_budget_over_cap_is_a_config_error(store: FileDeadlineStore) -> None:
    with pytest.raises(ConfigError, match="exceeds max_budget_s"):
        obtain_record(store, identity(), now_wall=T0, resume_required=False, max_budget_s=3600)
    assert store.load(RUN_ID) is None


def test_create_then_resume_never_extends(store: FileDeadlineStore) -> None:
    obtained = obtain_record(store, identity(), now_wall=T0, resume_required=False, max_budget_s=MAX_BUDGET)
    assert obtained.created
    first = obtained.record
    assert first.started_unix == T0
    assert first.deadline_unix == T0 + 7200
    stored = store.load(RUN_ID)
    for later in (T0 + 1, T0 + 3600, T0 + 7199, T0 + 10**6):
        again = obtain_record(
            store, identity(), now_wall=later, resume_required=True, max_budget_s=MAX_BUDGET
        ).record
        assert again == first
    assert store.load(RUN_ID) == stored
    assert not obtain_record(
        store, identity(), now_wall=T0 + 1, resume_required=True, max_budget_s=MAX_BUDGET
    ).created


def test_a_record_a_concurrent_creator_made_first_is_a_resume(
    store: FileDeadlineStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two indexes start at once: both find no record, one creates it, the other's create is
    refused. The other resumed that record; it did not create one (found under load in CI)."""
    obtain_record(store, identity(), now_wall=T0, resume_required=False, max_budget_s=MAX_BUDGET)
    loads = {"count": 0}
    real_load = store.load

    def load_after_the_race(run_id: str) -> bytes | None:
        loads["count"] += 1
        return None if loads["count"] == 1 else real_load(run_id)  # the first look came too early

    monkeypatch.setattr(store, "load", load_after_the_race)
    late = obtain_record(store, identity(), now_wall=T0 + 1, resume_required=False, max_budget_s=MAX_BUDGET)
    assert not late.created and late.record.started_unix == T0


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"budget_s": 10800}, "budget_s"),
        ({"checkpoint_margin_s": 60}, "checkpoint_margin_s"),
        ({"command": ("python3", "train.py", "--more")}, "command"),
        ({"code_sha256": {"train.py": "c" * 64}}, "code_sha256"),
        ({"dataset_manifest_sha256": "d" * 64}, "dataset_manifest_sha256"),
        ({"deadline_store": "/elsewhere"}, "deadline_store"),
        ({"image_digest": "sha256:" + "e" * 64}, "image_digest"),
        ({"resume_checkpoint_path": "/ckpt/latest.pt"}, "resume_checkpoint_path"),
    ],
)
def test_identity_mismatch_is_refused_naming_the_field(
    store: FileDeadlineStore, change: dict[str, Any], field: str
) -> None:
    obtain_record(store, identity(), now_wall=T0, resume_required=False, max_budget_s=MAX_BUDGET)
    before = store.load(RUN_ID)
    with pytest.raises(RefusedError, match="never extend an existing job") as caught:
        obtain_record(
            store,
            identity(**change),
            now_wall=T0 + 5,
            resume_required=False,
            max_budget_s=MAX_BUDGET,
        )
    assert f"differs in {field}:" in str(caught.value)
    assert store.load(RUN_ID) == before


def test_mismatch_lists_every_differing_field(store: FileDeadlineStore) -> None:
    obtain_record(store, identity(), now_wall=T0, resume_required=False, max_budget_s=MAX_BUDGET)
    with pytest.raises(RefusedError, match=r"differs in command, budget_s: command: record"):
        obtain_record(
            store,
            identity(budget_s=3600, command=("python3", "x.py")),
            now_wall=T0,
            resume_required=False,
            max_budget_s=MAX_BUDGET,
        )


def test_explicit_resume_without_record_is_refused(store: FileDeadlineStore) -> None:
    with pytest.raises(RefusedError, match="explicit resume requires the original deadline record"):
        obtain_record(store, identity(), now_wall=T0, resume_required=True, max_budget_s=MAX_BUDGET)
    assert store.load(RUN_ID) is None


class RacingStore(FileDeadlineStore):
    """A real file store where another supervisor creates the record just before this one."""

    def __init__(self, directory: Path, rival: DeadlineRecord) -> None:
        super().__init__(directory)
        self.rival = rival
        self.lost = False

    def create(self, run_id: str, payload: bytes) -> None:
        super().create(run_id, encode_record(self.rival))
        try:
            super().create(run_id, payload)
        except RecordExistsError:
            self.lost = True
            raise


def test_lost_create_race_adopts_the_winners_record(tmp_path: Path) -> None:
    rival = new_record(identity(), now_wall=T0 - 30)
    store = RacingStore(tmp_path, rival)
    got = obtain_record(store, identity(), now_wall=T0, resume_required=False, max_budget_s=MAX_BUDGET).record
    assert store.lost
    assert got == rival


def test_lost_create_race_to_another_identity_is_refused(tmp_path: Path) -> None:
    store = RacingStore(tmp_path, new_record(identity(budget_s=3600), now_wall=T0))
    with pytest.raises(RefusedError, match="differs in budget_s"):
        obtain_record(store, identity(), now_wall=T0, resume_required=False, max_budget_s=MAX_BUDGET)


class ConcurrentCreatorStore(FileDeadlineStore):
    """A real file store where another index of the same soak creates the record and claims its
    first attempt (as a supervisor does) right after this supervisor's ``after``-th store call."""

    def __init__(self, directory: Path, rival: DeadlineRecord, after: int) -> None:
        super().__init__(directory)
        self.rival, self.after, self.calls = rival, after, 0

    def _step(self) -> None:
        self.calls += 1
        if self.calls == self.after:
            # The rival creates its record unless one exists (then it resumes that), and claims.
            with contextlib.suppress(RecordExistsError):
                super().create(RUN_ID, encode_record(self.rival))
            super().claim_attempt(run_slot(RUN_ID, 1))

    def attempt_claims(self, run_id: str) -> list[float | None]:
        claims = super().attempt_claims(run_id)
        self._step()
        return claims

    def load(self, run_id: str) -> bytes | None:
        data = super().load(run_id)
        self._step()
        return data

    def create(self, run_id: str, payload: bytes) -> None:
        super().create(run_id, payload)  # raises RecordExistsError once the rival has created
        self._step()


@pytest.mark.parametrize("after", [1, 2, 3, 4, 5])
def test_a_concurrent_creator_between_any_two_store_calls_is_adopted_never_refused(
    tmp_path: Path, after: int
) -> None:
    """Two indexes start at once: whichever store call the other one's create-and-claim lands
    after, this one resumes a record of the run (the rival's, or its own that the rival adopted)."""
    rival = new_record(identity(), now_wall=T0 - 1)
    store = ConcurrentCreatorStore(tmp_path, rival, after)
    got = obtain_record(store, identity(), now_wall=T0, resume_required=False, max_budget_s=MAX_BUDGET).record
    assert got == parse_record(store.load(RUN_ID) or b"", max_budget_s=MAX_BUDGET)
    assert got.started_unix in (rival.started_unix, T0)


class BlackHoleStore(FileDeadlineStore):
    """Accepts a create but never shows it: the read-back must catch this."""

    def create(self, run_id: str, payload: bytes) -> None:
        return None


def test_record_missing_after_create_fails_closed(tmp_path: Path) -> None:
    with pytest.raises(DeadlineRecordError, match="vanished"):
        obtain_record(
            BlackHoleStore(tmp_path),
            identity(),
            now_wall=T0,
            resume_required=False,
            max_budget_s=MAX_BUDGET,
        )


# --- the clock -------------------------------------------------------------------------------

M0 = 500.0  # an arbitrary monotonic origin


def clock_at(wall: float, mono: float = M0) -> DeadlineClock:
    return DeadlineClock(new_record(identity(), now_wall=T0), now_wall=wall, now_monotonic=mono)


def test_remaining_tracks_both_clocks() -> None:
    clock = clock_at(T0)
    assert clock.remaining(T0, M0) == 7200
    assert clock.remaining(T0 + 100, M0 + 100) == 7100


def test_wall_clock_rollback_does_not_extend() -> None:
    clock = clock_at(T0 + 1000, M0)
    # One hour later the wall clock is set back two hours: the monotonic bound holds.
    assert clock.remaining(T0 + 1000 + 3600 - 7200, M0 + 3600) == pytest.approx(7200 - 1000 - 3600)
    assert not clock.expired(T0 - 10**6, M0 + 6199.999)
    assert clock.expired(T0 - 10**6, M0 + 6200)
    assert clock.remaining(T0 - 10**6, M0 + 6200 - 3) == pytest.approx(3)


def test_wall_clock_jump_forward_shortens() -> None:
    clock = clock_at(T0, M0)
    assert clock.remaining(T0 + 7200, M0 + 1) == 0
    assert clock.expired(T0 + 7200, M0 + 1)


def test_resumed_clock_starts_from_the_original_deadline() -> None:
    # An attempt resumed 7000 s into the budget has 200 s left, whatever its own start time.
    clock = clock_at(T0 + 7000, M0)
    assert clock.remaining(T0 + 7000, M0) == 200


def test_expired_once_nothing_is_left() -> None:
    clock = clock_at(T0, M0)

    def expired_with(remaining: float) -> bool:
        elapsed = 7200 - remaining
        return clock.expired(T0 + elapsed, M0 + elapsed)

    assert [expired_with(left) for left in (7200, 120, 0.5, 0, -3)] == [False, False, False, True, True]


def test_check_startable_accepts_enough_budget() -> None:
    check_startable(clock_at(T0), T0, M0)
    check_startable(clock_at(T0), T0 + 7079, M0 + 7079)


def test_insufficient_budget_is_refused() -> None:
    clock = clock_at(T0)
    with pytest.raises(InsufficientBudgetError, match="insufficient original budget to start/resume"):
        check_startable(clock, T0 + 7080, M0 + 7080)


def test_expired_deadline_is_a_verdict_not_a_crash() -> None:
    clock = clock_at(T0 + 9000)
    with pytest.raises(DeadlineExpiredError, match=r"expired 1800\.0 s ago") as caught:
        check_startable(clock, T0 + 9000, M0)
    assert isinstance(caught.value, InsufficientBudgetError)
    assert caught.value.exit_code == InsufficientBudgetError.exit_code


def test_non_finite_wall_clock_is_rejected() -> None:
    with pytest.raises(ConfigError):
        new_record(identity(), now_wall=float("nan"))


# --- the attempt ledger ----------------------------------------------------------------------


def test_the_ledger_refuses_a_deleted_record_and_a_later_start() -> None:
    record = new_record(identity(), now_wall=T0)
    check_ledger(None, [], run_id=RUN_ID, location="/store")  # a new run
    check_ledger(record, [], run_id=RUN_ID, location="/store")  # the first attempt died before claiming
    check_ledger(record, [T0 + 0.5, T0 + 900, None], run_id=RUN_ID, location="/store")
    check_ledger(record, [T0 - LEDGER_SKEW_TOLERANCE_S], run_id=RUN_ID, location="/store")  # within skew
    with pytest.raises(RefusedError, match=r"holds 2 attempt\(s\) .* record is missing from /store"):
        check_ledger(None, [T0, None], run_id=RUN_ID, location="/store")
    with pytest.raises(RefusedError, match=r"3600\.0 s after the first attempt was claimed"):
        check_ledger(record, [T0 - 3600, T0 + 5], run_id=RUN_ID, location="/store")


# --- clocks across attempts ------------------------------------------------------------------

BOOT = BootClock("boot-a", 5000.0)


def anchored() -> DeadlineRecord:
    return new_record(identity(), now_wall=T0, boot=BOOT)


def test_same_boot_wall_clock_set_back_between_attempts_is_refused_with_the_figures() -> None:
    later = BootClock("boot-a", BOOT.boottime_s + 1000)  # 1000 s of real time went by
    figures = r"claims 7200\.0 s left .* says 6200\.0 s \(1000\.0 s apart, tolerance 60 s\)"
    with pytest.raises(RefusedError, match=figures):
        DeadlineClock(anchored(), now_wall=T0, now_monotonic=M0, boot=later)  # wall set back 1000 s
    # within the tolerance: the least of the two, never the more generous
    clock = DeadlineClock(anchored(), now_wall=T0 + 970, now_monotonic=M0, boot=later)
    assert clock.remaining(T0 + 970, M0) == pytest.approx(6200.0)


def test_same_boot_wall_clock_ahead_only_shortens_and_a_big_jump_expires() -> None:
    later = BootClock("boot-a", BOOT.boottime_s + 1000)
    ahead = DeadlineClock(anchored(), now_wall=T0 + 1500, now_monotonic=M0, boot=later)
    assert ahead.remaining(T0 + 1500, M0) == pytest.approx(5700.0)
    jumped = DeadlineClock(anchored(), now_wall=T0 + 10**6, now_monotonic=M0, boot=later)
    assert jumped.expired(T0 + 10**6, M0)
    with pytest.raises(DeadlineExpiredError):
        check_startable(jumped, T0 + 10**6, M0)


def test_another_boot_or_a_v1_record_falls_back_to_the_wall_clock() -> None:
    other = DeadlineClock(anchored(), now_wall=T0 + 100, now_monotonic=M0, boot=BootClock("boot-b", 3.0))
    assert other.remaining(T0 + 100, M0) == pytest.approx(7100.0)
    legacy = json.loads(encode_record(anchored()))
    legacy["format"] = "soak-sidecar-deadline-v1"
    del legacy["boot"], legacy["reference"]
    record = parse_record(json.dumps(legacy).encode(), max_budget_s=MAX_BUDGET)
    assert record.boot is None
    clock = DeadlineClock(record, now_wall=T0 + 100, now_monotonic=M0, boot=BOOT)
    assert clock.remaining(T0 + 100, M0) == 7100.0


@pytest.mark.parametrize(
    "boot",
    [
        {"id": "", "boottime_s": 1.0},
        {"id": "b", "boottime_s": -1},
        {"id": "b", "boottime_s": "1"},
        {"id": "b"},
        [],
    ],
)
def test_a_malformed_boot_anchor_fails_closed(boot: object) -> None:
    value = json.loads(encode_record(anchored()))
    value["boot"] = boot
    with pytest.raises(DeadlineRecordError, match="boot"):
        parse_record(json.dumps(value).encode(), max_budget_s=MAX_BUDGET)


def test_a_v1_record_with_a_boot_key_is_refused() -> None:
    value = json.loads(encode_record(anchored()))
    value["format"] = "soak-sidecar-deadline-v1"
    del value["reference"]
    with pytest.raises(DeadlineRecordError, match="unknown \\['boot'\\]"):
        parse_record(json.dumps(value).encode(), max_budget_s=MAX_BUDGET)


def test_a_v2_record_is_resumed_and_may_not_carry_a_reference() -> None:
    value = json.loads(encode_record(anchored()))
    value["format"] = "soak-sidecar-deadline-v2"
    with pytest.raises(DeadlineRecordError, match="unknown \\['reference'\\]"):
        parse_record(json.dumps(value).encode(), max_budget_s=MAX_BUDGET)
    del value["reference"]
    record = parse_record(json.dumps(value).encode(), max_budget_s=MAX_BUDGET)
    assert record.boot == BOOT and record.reference is None


def test_the_stores_clock_bounds_the_wall_clock_and_dates_the_record() -> None:
    record = new_record(identity(), now_wall=T0)  # no boot anchor: another node
    server = StoreClock(
        record_written=T0, now=T0 + 1000, source="the deadline store's clock (S3 LastModified)"
    )
    # A node an hour behind the server would see an hour more: refused with the figures.
    with pytest.raises(RefusedError, match=r"S3 LastModified\) says 6200\.0 s \(3600\.0 s apart"):
        DeadlineClock(record, now_wall=T0 + 1000 - 3600, now_monotonic=M0, store=server)
    # A node ahead of the server only loses time.
    ahead = DeadlineClock(record, now_wall=T0 + 1030, now_monotonic=M0, store=server)
    assert ahead.remaining(T0 + 1030, M0) == pytest.approx(6170.0)
    # A record that claims to start ten minutes after the store wrote it is refused.
    late = StoreClock(
        record_written=T0 - 600, now=T0 + 1000, source="the deadline store's clock (S3 LastModified)"
    )
    with pytest.raises(
        RefusedError, match=r"600\.0 s later than the deadline store's clock \(S3 LastModified\) dates"
    ):
        DeadlineClock(record, now_wall=T0 + 1000, now_monotonic=M0, store=late)


APISERVER = "the Kubernetes apiserver's clock (Date)"


def referenced() -> DeadlineRecord:
    return new_record(identity(), now_wall=T0, reference=ReferenceTime(APISERVER, T0 + 0.5))


def test_the_reference_time_round_trips_through_the_record() -> None:
    record = referenced()
    assert parse_record(encode_record(record), max_budget_s=MAX_BUDGET) == record


def test_the_reference_clock_bounds_an_attempt_on_another_boot() -> None:
    # Another boot (or node) whose wall clock is an hour behind the apiserver's: refused.
    with pytest.raises(RefusedError, match=r"apiserver's clock \(Date\) says 6200\.5 s \(3599\.5 s apart"):
        DeadlineClock(
            referenced(),
            now_wall=T0 + 1000 - 3600,
            now_monotonic=M0,
            boot=BootClock("boot-b", 3.0),
            reference=ReferenceTime(APISERVER, T0 + 1000),
        )
    fine = DeadlineClock(
        referenced(), now_wall=T0 + 1000, now_monotonic=M0, reference=ReferenceTime(APISERVER, T0 + 1000)
    )
    assert fine.remaining(T0 + 1000, M0) == pytest.approx(6200.0)


def test_a_reference_from_another_clock_is_not_compared() -> None:
    clock = DeadlineClock(
        referenced(),
        now_wall=T0 + 1000 - 3600,
        now_monotonic=M0,
        reference=ReferenceTime("another clock", T0 + 1000),
    )
    assert clock.remaining(T0 + 1000 - 3600, M0) == pytest.approx(9800.0)


def test_a_record_started_after_its_reference_time_is_refused() -> None:
    # Made on a node ten minutes ahead of the apiserver, or its window shifted afterwards.
    record = new_record(identity(), now_wall=T0 + 600, reference=ReferenceTime(APISERVER, T0))
    with pytest.raises(RefusedError, match=r"600\.0 s later than the Kubernetes apiserver's clock"):
        DeadlineClock(
            record, now_wall=T0 + 700, now_monotonic=M0, reference=ReferenceTime(APISERVER, T0 + 100)
        )


@pytest.mark.parametrize(
    "reference",
    [
        {"source": "", "unix": 1.0},
        {"source": "x", "unix": -1},
        {"source": "x", "unix": True},
        {"source": "x"},
        "x",
    ],
)
def test_a_malformed_reference_fails_closed(reference: object) -> None:
    value = json.loads(encode_record(referenced()))
    value["reference"] = reference
    with pytest.raises(DeadlineRecordError, match="reference"):
        parse_record(json.dumps(value).encode(), max_budget_s=MAX_BUDGET)


def test_create_or_resume_stamps_a_new_record_with_the_reference_time(store: FileDeadlineStore) -> None:
    made = obtain_record(
        store,
        identity(),
        now_wall=T0,
        resume_required=False,
        max_budget_s=MAX_BUDGET,
        reference=ReferenceTime(APISERVER, T0 + 2),
    ).record
    assert made.reference == ReferenceTime(APISERVER, T0 + 2)
    again = obtain_record(
        store,
        identity(),
        now_wall=T0 + 50,
        resume_required=True,
        max_budget_s=MAX_BUDGET,
        reference=ReferenceTime(APISERVER, T0 + 52),
    ).record
    assert again.reference == ReferenceTime(APISERVER, T0 + 2)  # the first making's, never moved
