"""One table per seed rule of the run_summary contract: passing and failing cases, exact text."""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from pydantic import TypeAdapter, ValidationError

from sidecar.core.run_summary import (
    REPLAY_INGRESS_INTEGER_FIELDS,
    SHUTDOWN_CLASSIFICATIONS,
    AbnormalRunSummary,
    CompletedRunSummary,
    RunSummary,
    SummaryOutcome,
    describe_shutdown,
    evaluate_parsed,
    evaluate_run_summary,
    run_summary_json_schema,
)

DATA = Path(__file__).resolve().parents[1] / "data" / "run_summary"
DELETE = object()

Doc = dict[str, Any]


def typed_run_summary(data: object) -> CompletedRunSummary | AbnormalRunSummary | None:
    """The typed models' view of ``data``, or None where they refuse it."""
    try:
        return TypeAdapter(RunSummary).validate_python(data)
    except ValidationError:
        return None


def valid_run_summary() -> Doc:
    """The minimal completed run_summary that passes every check (copy its shape)."""
    document: Doc = json.loads((DATA / "minimal_completed.json").read_text())
    return document


def abnormal_run_summary() -> Doc:
    """The minimal summary of a failed run whose contract holds (classification learner_failure)."""
    document: Doc = json.loads((DATA / "minimal_abnormal.json").read_text())
    return document


def with_(document: Doc, path: str, value: object) -> Doc:
    """A copy of ``document`` with the dotted ``path`` set to ``value`` (DELETE removes it)."""
    result = copy.deepcopy(document)
    *parents, last = path.split(".")
    node: Any = result
    for key in parents:
        node = node[key]
    if value is DELETE:
        node.pop(last, None)
    else:
        node[last] = value
    return result


def edits(document: Doc, **changes: object) -> Doc:
    """Several ``with_`` edits; keyword ``a__b`` means path ``a.b``."""
    for key, value in changes.items():
        document = with_(document, key.replace("__", "."), value)
    return document


def judge(document: object) -> tuple[str, ...]:
    return evaluate_parsed(document, manifest_validator=None).failures


RI = "runtime_manifest.replay_ingress"
SD = "runtime_manifest.shutdown"


def test_minimal_documents_pass_and_classify() -> None:
    completed = evaluate_parsed(valid_run_summary(), manifest_validator=None)
    assert completed.passed and completed.classification is None and completed.completed
    assert completed.failure_reason is None
    assert completed.shutdown is not None and completed.shutdown["classification"] == "normal_completion"
    assert isinstance(typed_run_summary(valid_run_summary()), CompletedRunSummary)

    abnormal = evaluate_parsed(abnormal_run_summary(), manifest_validator=None)
    assert abnormal.classification == "learner_failure"
    assert abnormal.classification_overrides
    assert abnormal.failures == (
        "run_summary status is 'failed', expected 'completed'",
        "shutdown classification='learner_failure', owner='learner', phase='train', "
        "exception='RuntimeError': 'CUDA error: an illegal memory access', cleanup_errors=0",
    )
    assert abnormal.failure_reason == "; ".join(abnormal.failures)
    assert isinstance(typed_run_summary(abnormal_run_summary()), AbnormalRunSummary)


# --- _schema_failure -----------------------------------------------------------------------------

SCHEMA_CASES: list[tuple[str, str, object, str | None]] = [
    ("metric ok", "metric_schema_version", 1, None),
    (
        "metric missing",
        "metric_schema_version",
        DELETE,
        "{s}run_summary is missing metric_schema_version",
    ),
    (
        "metric null",
        "metric_schema_version",
        None,
        "{s}run_summary is missing metric_schema_version",
    ),
    (
        "metric bool",
        "metric_schema_version",
        True,
        "{s}run_summary has unsupported metric_schema_version True; expected 1",
    ),
    (
        "metric float",
        "metric_schema_version",
        1.0,
        "{s}run_summary has unsupported metric_schema_version 1.0; expected 1",
    ),
    (
        "metric string",
        "metric_schema_version",
        "1",
        "{s}run_summary has unsupported metric_schema_version '1'; expected 1",
    ),
    (
        "metric other",
        "metric_schema_version",
        2,
        "{s}run_summary has unsupported metric_schema_version 2; expected 1",
    ),
    ("manifest missing", "runtime_manifest", DELETE, "{s}run_summary is missing runtime_manifest"),
    ("manifest list", "runtime_manifest", [], "{s}run_summary is missing runtime_manifest"),
    (
        "manifest version missing",
        "runtime_manifest.schema_version",
        DELETE,
        "{s}runtime_manifest is missing runtime_manifest.schema_version",
    ),
    (
        "manifest version bool",
        "runtime_manifest.schema_version",
        True,
        "{s}runtime_manifest has unsupported runtime_manifest.schema_version True; expected 2",
    ),
    (
        "manifest version float",
        "runtime_manifest.schema_version",
        2.0,
        "{s}runtime_manifest has unsupported runtime_manifest.schema_version 2.0; expected 2",
    ),
    (
        "manifest version old",
        "runtime_manifest.schema_version",
        1,
        "{s}runtime_manifest has unsupported runtime_manifest.schema_version 1; expected 2",
    ),
    (
        "manifest version nan",
        "runtime_manifest.schema_version",
        math.nan,
        "{s}runtime_manifest has unsupported runtime_manifest.schema_version nan; expected 2",
    ),
]


@pytest.mark.parametrize(("case", "path", "value", "message"), SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
@pytest.mark.parametrize("completed", [True, False], ids=["completed", "abnormal"])
def test_schema_rule(case: str, path: str, value: object, message: str | None, completed: bool) -> None:
    base = valid_run_summary() if completed else abnormal_run_summary()
    outcome = evaluate_parsed(with_(base, path, value), manifest_validator=None)
    if message is None:
        assert not any("schema_version" in f or "missing runtime_manifest" in f for f in outcome.failures)
        return
    expected = message.format(s="completed " if completed else "")
    # the schema message always comes first
    assert outcome.failures[0] == expected
    if completed:
        assert outcome.classification == "schema_violation"
    else:
        # the seed lets a valid trainer classification replace schema_violation, and skips the
        # status message once something failed
        assert "run_summary status is 'failed', expected 'completed'" not in outcome.failures
        if outcome.shutdown is not None:
            assert outcome.classification == "learner_failure"
        else:
            assert outcome.classification == "schema_violation"


def test_completed_without_manifest_reports_each_seed_message() -> None:
    assert judge(with_(valid_run_summary(), "runtime_manifest", DELETE)) == (
        "completed run_summary is missing runtime_manifest",
        "completed runtime_manifest is missing runtime_manifest",
        "completed runtime_manifest is missing shutdown diagnostics",
    )


# --- _shutdown_contract_failure and _describe_shutdown -----------------------------------------

# (case, path, value, message for a completed run, message for an abnormal run); None = passes
SHUTDOWN_CASES: list[tuple[str, str, object, str | None, str | None]] = [
    ("exception null", f"{SD}.exception", None, None, None),
    ("extra field", f"{SD}.pid", 7, None, None),
    (
        "classification bogus",
        f"{SD}.classification",
        "bogus",
        "shutdown has invalid classification 'bogus'",
        "shutdown has invalid classification 'bogus'",
    ),
    (
        "classification missing",
        f"{SD}.classification",
        DELETE,
        "shutdown has invalid classification None",
        "shutdown has invalid classification None",
    ),
    (
        "classification int",
        f"{SD}.classification",
        1,
        "shutdown has invalid classification 1",
        "shutdown has invalid classification 1",
    ),
    (
        "owner empty",
        f"{SD}.owner",
        "",
        "shutdown has invalid owner ''",
        "shutdown has invalid owner ''",
    ),
    ("owner int", f"{SD}.owner", 5, "shutdown has invalid owner 5", "shutdown has invalid owner 5"),
    (
        "owner missing",
        f"{SD}.owner",
        DELETE,
        "shutdown has invalid owner None",
        "shutdown has invalid owner None",
    ),
    (
        "phase empty",
        f"{SD}.phase",
        "",
        "shutdown has invalid phase ''",
        "shutdown has invalid phase ''",
    ),
    (
        "phase bool",
        f"{SD}.phase",
        False,
        "shutdown has invalid phase False",
        "shutdown has invalid phase False",
    ),
    (
        "exception string",
        f"{SD}.exception",
        "boom",
        "shutdown has invalid exception 'boom'",
        "shutdown has invalid exception 'boom'",
    ),
    (
        "exception type int",
        f"{SD}.exception",
        {"type": 1, "message": "m"},
        "shutdown exception requires string type and message fields",
        "shutdown exception requires string type and message fields",
    ),
    (
        "exception message missing",
        f"{SD}.exception",
        {"type": "E"},
        "shutdown exception requires string type and message fields",
        "shutdown exception requires string type and message fields",
    ),
    (
        "cleanup missing",
        f"{SD}.cleanup",
        DELETE,
        "shutdown has invalid cleanup None",
        "shutdown has invalid cleanup None",
    ),
    (
        "cleanup list",
        f"{SD}.cleanup",
        [],
        "shutdown has invalid cleanup []",
        "shutdown has invalid cleanup []",
    ),
    (
        "cleanup errors missing",
        f"{SD}.cleanup",
        {},
        "shutdown cleanup.errors must be a list",
        "shutdown cleanup.errors must be a list",
    ),
    (
        "cleanup errors dict",
        f"{SD}.cleanup.errors",
        {"a": 1},
        "shutdown cleanup.errors must be a list",
        "shutdown cleanup.errors must be a list",
    ),
    (
        "cleanup errors reported",
        f"{SD}.cleanup.errors",
        ["leaked shm"],
        "completed run reported shutdown cleanup errors: ['leaked shm']",
        None,
    ),
]


@pytest.mark.parametrize(
    ("case", "path", "value", "completed_msg", "abnormal_msg"),
    SHUTDOWN_CASES,
    ids=[c[0] for c in SHUTDOWN_CASES],
)
def test_shutdown_rule(
    case: str, path: str, value: object, completed_msg: str | None, abnormal_msg: str | None
) -> None:
    completed = evaluate_parsed(with_(valid_run_summary(), path, value), manifest_validator=None)
    if completed_msg is None:
        assert completed.passed, completed.failures
    else:
        assert completed.failures == (completed_msg,)
        assert completed.classification == "shutdown_contract_violation"

    abnormal = evaluate_parsed(with_(abnormal_run_summary(), path, value), manifest_validator=None)
    if abnormal_msg is None:
        assert abnormal.classification == "learner_failure"
        assert abnormal.failures[1].startswith("shutdown classification='learner_failure'")
    else:
        assert abnormal.failures == (
            "run_summary status is 'failed', expected 'completed'",
            abnormal_msg,
        )
        assert abnormal.classification == "shutdown_contract_violation"
        assert not abnormal.classification_overrides


@pytest.mark.parametrize("classification", [c for c in SHUTDOWN_CLASSIFICATIONS if c != "normal_completion"])
def test_completed_run_must_be_normal_completion(classification: str) -> None:
    document = with_(valid_run_summary(), f"{SD}.classification", classification)
    assert judge(document) == (
        f"completed run shutdown classification must be normal_completion, got {classification!r}",
    )
    # ... and an abnormal run adopts the trainer's classification
    outcome = evaluate_parsed(
        with_(abnormal_run_summary(), f"{SD}.classification", classification),
        manifest_validator=None,
    )
    assert outcome.classification == classification and outcome.classification_overrides


def test_abnormal_run_cannot_claim_normal_completion() -> None:
    outcome = evaluate_parsed(
        with_(abnormal_run_summary(), f"{SD}.classification", "normal_completion"),
        manifest_validator=None,
    )
    assert outcome.failures[-1] == "abnormal run shutdown classification cannot be normal_completion"
    assert outcome.classification == "shutdown_contract_violation"


@pytest.mark.parametrize(
    "shutdown", [DELETE, None, "crashed", [1]], ids=["missing", "null", "string", "list"]
)
def test_shutdown_absent_or_not_an_object(shutdown: object) -> None:
    assert judge(with_(valid_run_summary(), SD, shutdown)) == (
        "completed runtime_manifest is missing shutdown diagnostics",
    )
    outcome = evaluate_parsed(with_(abnormal_run_summary(), SD, shutdown), manifest_validator=None)
    assert outcome.failures == (
        "run_summary status is 'failed', expected 'completed'",
        "shutdown diagnostics are unavailable",
    )
    assert outcome.classification == "unknown_failure" and outcome.shutdown is None


def test_describe_shutdown_texts() -> None:
    assert describe_shutdown({"classification": "collector_failure", "owner": "o", "phase": "p"}) == (
        "shutdown classification='collector_failure', owner='o', phase='p'"
    )
    assert (
        describe_shutdown(
            {
                "classification": "x",
                "owner": "o",
                "phase": "p",
                "exception": {"type": "E", "message": "m"},
                "cleanup": {"errors": [1, 2]},
            }
        )
        == "shutdown classification='x', owner='o', phase='p', exception='E': 'm', cleanup_errors=2"
    )
    # the exception is quoted only when it is an object, the count only when errors is a list
    assert describe_shutdown({"exception": "s", "cleanup": {"errors": "no"}}) == (
        "shutdown classification=None, owner=None, phase=None"
    )


def test_long_values_are_shortened_in_messages() -> None:
    failures = judge(with_(valid_run_summary(), f"{SD}.classification", "x" * 10_000))
    assert len(failures) == 1
    assert failures[0].startswith("shutdown has invalid classification 'xxx")
    assert failures[0].endswith("...") and len(failures[0]) < 600


# --- status --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "shown"),
    [(DELETE, "None"), ("COMPLETED", "'COMPLETED'"), (True, "True"), ("failed", "'failed'")],
)
def test_status_other_than_completed_fails(status: object, shown: str) -> None:
    outcome = evaluate_parsed(with_(valid_run_summary(), "status", status), manifest_validator=None)
    assert outcome.failures[0] == f"run_summary status is {shown}, expected 'completed'"
    assert outcome.status_first
    assert not outcome.completed
    # a completed-run shutdown in an abnormal summary is a contract violation
    assert outcome.failures[1] == "abnormal run shutdown classification cannot be normal_completion"


# --- inference flight (completed runs) -----------------------------------------------------------

FLIGHT = "runtime_manifest.inference_flight"
FLIGHT_CASES: list[tuple[str, object, str | None]] = [
    ("absent", DELETE, None),
    ("not an object", "busy", None),
    ("zeros", {"queue_depth": 0, "publication_lag": 0, "max_in_flight": 8}, None),
    ("nulls", {"queue_depth": None, "publication_lag": None}, None),
    ("float zero", {"queue_depth": 0.0}, None),
    ("queued", {"queue_depth": 3, "publication_lag": 0}, "queue_depth=3, publication_lag=0"),
    ("lagging", {"publication_lag": 2}, "queue_depth=None, publication_lag=2"),
    ("bool is not zero", {"queue_depth": False}, "queue_depth=False, publication_lag=None"),
    ("nan", {"queue_depth": math.nan}, "queue_depth=nan, publication_lag=None"),
    ("string", {"publication_lag": "0"}, "queue_depth=None, publication_lag='0'"),
]


@pytest.mark.parametrize(("case", "flight", "detail"), FLIGHT_CASES, ids=[c[0] for c in FLIGHT_CASES])
def test_inference_flight_rule(case: str, flight: object, detail: str | None) -> None:
    outcome = evaluate_parsed(with_(valid_run_summary(), FLIGHT, flight), manifest_validator=None)
    if detail is None:
        assert outcome.passed, outcome.failures
    else:
        assert outcome.failures == (f"final inference flight is not drained: {detail}",)
        assert outcome.classification == "unknown_failure"


def test_inference_flight_skipped_after_schema_failure_and_for_abnormal_runs() -> None:
    undrained = with_(valid_run_summary(), FLIGHT, {"queue_depth": 9})
    failures = judge(with_(undrained, "metric_schema_version", 7))
    assert not any("inference flight" in f for f in failures)
    abnormal = with_(abnormal_run_summary(), FLIGHT, {"queue_depth": 9})
    assert not any("inference flight" in f for f in judge(abnormal))


# --- replay ingress (completed runs) ------------------------------------------------------------


@pytest.mark.parametrize("name", REPLAY_INGRESS_INTEGER_FIELDS)
@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("4", "'4'"),
        (True, "True"),
        (1.5, "1.5"),
        (math.nan, "nan"),
        (math.inf, "inf"),
        (DELETE, "None"),
        ([], "[]"),
    ],
    ids=["string", "bool", "fraction", "nan", "inf", "missing", "list"],
)
def test_replay_ingress_integer_fields(name: str, value: object, shown: str) -> None:
    failures = judge(with_(valid_run_summary(), f"{RI}.{name}", value))
    assert failures == (f"replay_ingress.{name} must be an integer, got {shown}",)


@pytest.mark.parametrize("name", REPLAY_INGRESS_INTEGER_FIELDS)
def test_replay_ingress_negative_fields(name: str) -> None:
    assert judge(with_(valid_run_summary(), f"{RI}.{name}", -1)) == (
        f"replay_ingress.{name} must be nonnegative, got -1",
    )


def test_replay_ingress_integral_floats_are_integers() -> None:
    document = valid_run_summary()
    for name in REPLAY_INGRESS_INTEGER_FIELDS:
        document = with_(
            document, f"{RI}.{name}", float(document["runtime_manifest"]["replay_ingress"][name])
        )
    document = with_(document, "total_env_steps", 64.0)
    assert judge(document) == ()
    assert isinstance(typed_run_summary(document), CompletedRunSummary)


WAIT_CASES: list[tuple[object, str | None]] = [
    (0, None),
    (12.5, None),
    (DELETE, "replay_ingress.backpressure_wait_s must be finite, got None"),
    (math.nan, "replay_ingress.backpressure_wait_s must be finite, got nan"),
    (-math.inf, "replay_ingress.backpressure_wait_s must be finite, got -inf"),
    (True, "replay_ingress.backpressure_wait_s must be finite, got True"),
    ("1", "replay_ingress.backpressure_wait_s must be finite, got '1'"),
    (10**400, f"replay_ingress.backpressure_wait_s must be finite, got {10**400!r}"),
    (-0.5, "replay_ingress.backpressure_wait_s must be nonnegative, got -0.5"),
    (-1, "replay_ingress.backpressure_wait_s must be nonnegative, got -1.0"),
]


@pytest.mark.parametrize(("value", "message"), WAIT_CASES)
def test_replay_ingress_backpressure_wait(value: object, message: str | None) -> None:
    failures = judge(with_(valid_run_summary(), f"{RI}.backpressure_wait_s", value))
    if message is None:
        assert failures == ()
    else:
        assert failures == (message,)


INVARIANT_CASES: list[tuple[str, dict[str, object], str | None]] = [
    ("depth zero", {"ingress_depth": 0}, "replay_ingress.ingress_depth must be positive, got 0"),
    (
        "slot rows zero",
        {"ingress_slot_rows": 0},
        "replay_ingress.ingress_slot_rows must be positive, got 0",
    ),
    (
        "release beyond publish",
        {"release_sequence": 5},
        "replay_ingress release_sequence exceeds published_sequence: 5 > 4",
    ),
    (
        "occupancy mismatch",
        {"occupancy": 1},
        "replay_ingress occupancy does not match publication sequences: 1 != 0",
    ),
    (
        "occupancy over depth",
        {"published_sequence": 10, "occupancy": 6, "high_water_occupancy": 4},
        "replay_ingress occupancy exceeds ingress_depth: 6 > 4",
    ),
    (
        "high water over depth",
        {"high_water_occupancy": 5},
        "replay_ingress high_water_occupancy exceeds ingress_depth: 5 > 4",
    ),
    (
        "high water below occupancy",
        {"published_sequence": 6, "occupancy": 2, "high_water_occupancy": 1},
        "replay_ingress high_water_occupancy is below final occupancy: 1 < 2",
    ),
    (
        "early returns vs drops",
        {"early_returns": 1},
        "replay_ingress early_returns and dropped_batches disagree: 1 != 0",
    ),
    (
        "return counters",
        {"early_returns": 2, "dropped_batches": 2, "closed_returns": 1},
        "replay_ingress shutdown return counters disagree with early_returns: 1 + 0 != 2",
    ),
    (
        "final occupancy",
        {"published_sequence": 5, "occupancy": 1},
        "final replay ingress occupancy is nonzero: 1",
    ),
    (
        "dropped batches",
        {"early_returns": 2, "dropped_batches": 2, "closed_returns": 1, "stop_returns": 1},
        "replay ingress dropped batches during normal run: 2",
    ),
    (
        "high water zero",
        {"high_water_occupancy": 0},
        "completed replay_ingress high_water_occupancy must be positive",
    ),
    ("high water at depth", {"high_water_occupancy": 4}, None),
    ("waits counted", {"backpressure_waits": 17, "backpressure_wait_s": 3.25}, None),
    ("big depth", {"ingress_depth": 10**30}, None),
]


@pytest.mark.parametrize(("case", "changes", "message"), INVARIANT_CASES, ids=[c[0] for c in INVARIANT_CASES])
def test_replay_ingress_invariants(case: str, changes: dict[str, object], message: str | None) -> None:
    document = valid_run_summary()
    for name, value in changes.items():
        document = with_(document, f"{RI}.{name}", value)
    outcome = evaluate_parsed(document, manifest_validator=None)
    if message is None:
        assert outcome.passed, outcome.failures
    else:
        assert outcome.failures == (message,)
        assert outcome.classification == "schema_violation"


@pytest.mark.parametrize("replay", [DELETE, "full", None], ids=["missing", "string", "null"])
def test_replay_ingress_missing(replay: object) -> None:
    assert judge(with_(valid_run_summary(), RI, replay)) == (
        "completed runtime_manifest is missing replay_ingress",
    )


TOTAL_CASES: list[tuple[object, str | None]] = [
    (64, None),
    (64.0, None),
    (DELETE, "completed total_env_steps must be an integer, got None"),
    ("64", "completed total_env_steps must be an integer, got '64'"),
    (True, "completed total_env_steps must be an integer, got True"),
    (64.5, "completed total_env_steps must be an integer, got 64.5"),
    (math.inf, "completed total_env_steps must be an integer, got inf"),
    (0, "completed total_env_steps must be positive, got 0"),
    (-64, "completed total_env_steps must be positive, got -64"),
    (63, "total_env_steps is not divisible by replay_ingress.ingress_slot_rows: 63 % 16"),
    (80, "replay_ingress published_sequence does not match total_env_steps: 4 != 5"),
    (2**64, f"replay_ingress published_sequence does not match total_env_steps: 4 != {2**60}"),
]


@pytest.mark.parametrize(("total", "message"), TOTAL_CASES)
def test_total_env_steps(total: object, message: str | None) -> None:
    outcome = evaluate_parsed(with_(valid_run_summary(), "total_env_steps", total), manifest_validator=None)
    if message is None:
        assert outcome.passed, outcome.failures
    else:
        assert outcome.failures == (message,)
        assert outcome.classification == "schema_violation"


def test_replay_ingress_not_checked_for_abnormal_runs() -> None:
    document = with_(abnormal_run_summary(), RI, {"occupancy": "garbage"})
    assert not any("replay" in f for f in judge(document))
    assert isinstance(typed_run_summary(document), AbnormalRunSummary)


def test_failures_accumulate_in_seed_order() -> None:
    document = edits(
        valid_run_summary(),
        runtime_manifest__inference_flight={"queue_depth": 1},
        runtime_manifest__replay_ingress__occupancy=2,
        runtime_manifest__shutdown__cleanup={"errors": ["x"]},
    )
    outcome = evaluate_parsed(document, manifest_validator=None)
    assert outcome.failures == (
        "final inference flight is not drained: queue_depth=1, publication_lag=None",
        "replay_ingress occupancy does not match publication sequences: 2 != 0",
        "completed run reported shutdown cleanup errors: ['x']",
    )
    # the first failure's kind wins, as in the seed
    assert outcome.classification == "unknown_failure"
    assert outcome.failure_reason == "; ".join(outcome.failures)


# --- the file itself ---------------------------------------------------------------------------


def evaluate_bytes(raw: bytes | None, **kwargs: Any) -> SummaryOutcome:
    options: dict[str, Any] = {"mtime": None, "run_started_wall": None, "max_bytes": 1 << 20}
    options.update(kwargs)
    return evaluate_run_summary(raw, manifest_validator=None, **options)


FILE_CASES: list[tuple[str, bytes, str, str]] = [
    (
        "not json",
        b"{oops",
        "invalid_run_summary",
        "run_summary.json is not valid JSON: Expecting property name",
    ),
    ("empty", b"", "invalid_run_summary", "run_summary.json is not valid JSON: Expecting value"),
    ("not utf-8", b'{"a": "\xff"}', "invalid_run_summary", "run_summary.json is not UTF-8:"),
    (
        "bom",
        b"\xef\xbb\xbf{}",
        "invalid_run_summary",
        "run_summary.json is not valid JSON: Unexpected UTF-8 BOM",
    ),
    (
        "deep",
        b"[" * 200_000,
        "invalid_run_summary",
        "run_summary.json is nested too deeply to parse",
    ),
    (
        "huge int",
        b"1" * 5000,
        "invalid_run_summary",
        "run_summary.json is not valid JSON: Exceeds the limit",
    ),
    ("list", b"[1, 2]", "invalid_run_summary", "run_summary must be a JSON object, got list"),
    ("null", b"null", "invalid_run_summary", "run_summary must be a JSON object, got NoneType"),
    ("number", b"3", "invalid_run_summary", "run_summary must be a JSON object, got int"),
    ("empty object", b"{}", "schema_violation", "run_summary is missing metric_schema_version"),
    (
        "nan",
        b'{"metric_schema_version": NaN}',
        "schema_violation",
        "run_summary has unsupported metric_schema_version nan",
    ),
]


@pytest.mark.parametrize(
    ("case", "raw", "classification", "prefix"), FILE_CASES, ids=[c[0] for c in FILE_CASES]
)
def test_file_level_failures(case: str, raw: bytes, classification: str, prefix: str) -> None:
    outcome = evaluate_bytes(raw)
    assert outcome.present
    assert outcome.classification == classification
    assert outcome.failures[0].startswith(prefix), outcome.failures


def test_missing_file() -> None:
    outcome = evaluate_bytes(None)
    assert not outcome.present and outcome.data is None
    assert outcome.failures == ("trainer did not write run_summary.json",)
    assert outcome.classification == "missing_run_summary"


def test_size_cap() -> None:
    raw = json.dumps(valid_run_summary()).encode()
    assert evaluate_bytes(raw, max_bytes=len(raw)).passed
    outcome = evaluate_bytes(raw, max_bytes=len(raw) - 1)
    assert outcome.failures == (f"run_summary.json exceeds the {len(raw) - 1} byte limit",)
    assert outcome.classification == "invalid_run_summary" and outcome.data is None


def test_stale_file_from_an_earlier_attempt() -> None:
    raw = json.dumps(valid_run_summary()).encode()
    started = 1_800_000_000.0
    assert evaluate_bytes(raw, mtime=started, run_started_wall=started).passed
    assert evaluate_bytes(raw, mtime=started + 30, run_started_wall=started).passed
    outcome = evaluate_bytes(raw, mtime=started - 0.5, run_started_wall=started)
    assert outcome.classification == "stale_run_summary" and outcome.data is None
    assert outcome.failures == (
        "run_summary.json predates this run (written 2027-01-15T07:59:59.500000Z, run started "
        "2027-01-15T08:00:00.000000Z): left over from an earlier attempt",
    )


def test_valid_file_round_trip_keeps_the_raw_object() -> None:
    document = edits(valid_run_summary(), extra_metric=3.5, runtime_manifest__producer={"name": "x"})
    outcome = evaluate_bytes(json.dumps(document).encode())
    assert outcome.passed and outcome.data == document


# --- the models -----------------------------------------------------------------------------------


def test_models_reject_with_the_seed_message() -> None:
    document = with_(valid_run_summary(), f"{RI}.occupancy", 1)
    with pytest.raises(ValidationError, match="occupancy does not match publication sequences: 1 != 0"):
        CompletedRunSummary.model_validate(document)
    assert typed_run_summary(document) is None
    with pytest.raises(ValidationError, match="status must not be 'completed'"):
        AbnormalRunSummary.model_validate(valid_run_summary())


def test_typed_access() -> None:
    typed = typed_run_summary(valid_run_summary())
    assert isinstance(typed, CompletedRunSummary)
    assert typed.runtime_manifest.replay_ingress.ingress_slot_rows == 16
    assert typed.runtime_manifest.shutdown.classification == "normal_completion"
    assert typed.total_env_steps == 64


def test_json_schema_describes_both_shapes() -> None:
    schema = run_summary_json_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    defs = schema["$defs"]
    assert {
        "CompletedRunSummary",
        "AbnormalRunSummary",
        "ReplayIngress",
        "ShutdownDiagnostics",
    } <= set(defs)
    replay = defs["ReplayIngress"]
    assert set(replay["required"]) == {*REPLAY_INGRESS_INTEGER_FIELDS, "backpressure_wait_s"}
    assert replay["properties"]["ingress_depth"] == {
        "exclusiveMinimum": 0,
        "title": "Ingress Depth",
        "type": "integer",
    }
    assert defs["ShutdownDiagnostics"]["properties"]["classification"]["enum"] == list(
        SHUTDOWN_CLASSIFICATIONS
    )
    assert defs["AbnormalRunSummary"]["properties"]["status"]["not"] == {"const": "completed"}
    json.dumps(schema)  # serialisable as is


def test_checks_never_mutate_the_document() -> None:
    document = abnormal_run_summary()
    snapshot = copy.deepcopy(document)
    evaluate_parsed(document, manifest_validator=None)
    typed_run_summary(document)
    assert document == snapshot


def test_a_key_repeated_in_one_object_is_invalid_not_last_wins() -> None:
    completed = json.dumps(valid_run_summary())
    repeated = '{"status": "failed", ' + completed[1:]  # the seed's parser kept the last "status"
    outcome = evaluate_run_summary(
        repeated.encode(), mtime=None, run_started_wall=None, max_bytes=1 << 20, manifest_validator=None
    )
    assert outcome.classification == "invalid_run_summary"
    assert outcome.failures == ("run_summary.json repeats the key 'status' in one object",)
    nested = json.dumps({"a": 1}).replace("}", ', "a": 2}')
    assert evaluate_run_summary(
        nested.encode(), mtime=None, run_started_wall=None, max_bytes=1 << 20, manifest_validator=None
    ).failures == ("run_summary.json repeats the key 'a' in one object",)


def test_a_deeply_nested_summary_is_invalid_not_a_crash() -> None:
    nested = ("[" * 300 + "]" * 300).encode()  # 600 bytes, 300 deep
    outcome = evaluate_run_summary(
        nested, mtime=None, run_started_wall=None, max_bytes=1 << 20, manifest_validator=None
    )
    assert outcome.classification == "invalid_run_summary"
    assert outcome.failures == ("run_summary.json is nested deeper than 64 levels",)
    inside = json.dumps({**valid_run_summary(), "extra": json.loads("[" * 100 + "]" * 100)}).encode()
    deep = evaluate_run_summary(
        inside, mtime=None, run_started_wall=None, max_bytes=1 << 20, manifest_validator=None
    )
    assert deep.classification == "invalid_run_summary"


def test_the_core_profile_drops_only_the_replay_and_inference_rules() -> None:
    supervised = with_(with_(valid_run_summary(), "runtime_manifest.replay_ingress", DELETE),
                       "runtime_manifest.inference_flight", DELETE)  # fmt: skip
    core = evaluate_parsed(supervised, manifest_validator=None, profile="core")
    assert core.passed and core.completed, core.failures
    replay = evaluate_parsed(supervised, manifest_validator=None, profile="replay")
    assert replay.failures == ("completed runtime_manifest is missing replay_ingress",)
    assert replay.classification == "schema_violation"
    # Everything else still holds under core: versions, status, the shutdown contract.
    for broken in (
        with_(supervised, "metric_schema_version", 2),
        with_(supervised, f"{SD}.classification", "learner_failure"),
        with_(supervised, f"{SD}.owner", None),
        with_(supervised, "status", "failed"),
    ):
        assert not evaluate_parsed(broken, manifest_validator=None, profile="core").passed
    # A replay trainer's summary meets both.
    assert evaluate_parsed(valid_run_summary(), manifest_validator=None, profile="core").passed


def test_the_core_profiles_schema_accepts_what_validate_core_accepts() -> None:
    """A summary with no replay_ingress: the core profile passes it, and so does its schema; the
    replay profile's schema requires replay_ingress, as that profile does."""
    import jsonschema

    document = valid_run_summary()
    del document["runtime_manifest"]["replay_ingress"]
    del document["total_env_steps"]
    assert not evaluate_parsed(document, manifest_validator=None, profile="core").failures
    core = run_summary_json_schema("core")
    jsonschema.validate(document, core)
    assert core["title"].endswith("(core profile)") and "ReplayIngress" not in core["$defs"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, run_summary_json_schema("replay"))
