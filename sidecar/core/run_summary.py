"""The trainer's ``run_summary.json`` contract: validation and classification (pure).

Every check of the soak monitor seed survives here with the seed's message texts and order:
``schema_failure`` (metric/runtime-manifest schema versions), ``shutdown_contract_failure`` and
``describe_shutdown`` (the host-only shutdown diagnostics), ``inference_flight_failure`` (a
completed run's inference flight must be drained), ``replay_ingress_failure`` (the replay-ingress
invariants), then the generic runtime-manifest validator, which runs only after the replay-ingress
checks pass so a generic schema error cannot hide the actionable replay-ingress one.

Deliberate differences from the seed, all stricter or clearer, never more permissive:

- The seed imported one hard-coded producer validator (``unilab.rl``). Here the generic
  validator is a plug-in (``ManifestValidator``, loaded by ``sidecar.adapters.validators``):
  ``module:function`` from the settings, or the single entry point of the
  ``soak_sidecar.manifest_validators`` group. With
  neither configured the generic step is skipped: that is not a failure, since the checks above
  are the soak's own contract. A configured validator that cannot be imported is a validation
  failure with the seed's text (``runtime_manifest validation requires ...: <exc>``); one that
  raises something other than TypeError/ValueError is a failure too, never a crash.
- The seed treated unparsable JSON as a missing file and never reached its "must be a JSON
  object" branch; here unreadable JSON, a non-object and an oversized file are
  ``invalid_run_summary`` with their own message, and a file older than the run is
  ``stale_run_summary``.
- Booleans never count as drained inference-flight counters (the seed's ``in (None, 0)`` let
  ``False`` through); integers are compared exactly instead of through ``float``.
- Values quoted in messages are shortened to ``_MAX_SHOWN`` characters of their repr.

Parsing stays as permissive as the seed's ``json.loads`` (``NaN``/``Infinity`` parse), so the
finite-number checks are what reject them, with the seed's messages.

The pydantic models below describe the same contract for the JSON Schema export and typed
access; their validators run the explicit checks, so the models and the checks cannot drift.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Annotated, Any, Literal, Protocol

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    Strict,
    StrictStr,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from sidecar.core.errors import InvalidRunSummaryError

SUPPORTED_METRIC_SCHEMA_VERSION = 1
SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION = 2

SHUTDOWN_CLASSIFICATIONS: tuple[str, ...] = (
    "normal_completion",
    "learner_failure",
    "collector_failure",
    "backend_worker_failure",
    "timeout/stale_tick",
    "external_cancellation",
    "unknown_failure",
)
# What a run_summary alone can be classified as, besides the trainer's own shutdown classification.
SUMMARY_CLASSIFICATIONS: tuple[str, ...] = (
    "missing_run_summary",
    "invalid_run_summary",
    "stale_run_summary",
    "schema_violation",
    "shutdown_contract_violation",
    "unknown_failure",
)
REPLAY_INGRESS_INTEGER_FIELDS: tuple[str, ...] = (
    "ingress_depth",
    "ingress_slot_rows",
    "published_sequence",
    "release_sequence",
    "occupancy",
    "high_water_occupancy",
    "backpressure_waits",
    "early_returns",
    "dropped_batches",
    "closed_returns",
    "stop_returns",
)

_MAX_SHOWN = 500
_MANIFEST_VERSION_TEXT = f"v{SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION}"


def clip(text: str) -> str:
    """A message fragment shortened so one huge value cannot flood the reason."""
    return text if len(text) <= _MAX_SHOWN else f"{text[: _MAX_SHOWN - 3]}..."


def _show(value: object) -> str:
    """``repr`` as the seed quoted it, shortened."""
    return clip(repr(value))


def _finite_number(value: object) -> float | None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range is not a finite number either
        return None
    return number if math.isfinite(number) else None


def _integer(value: object) -> int | None:
    """The seed's "finite and integral" test; exact for ints, whatever their size."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    number = _finite_number(value)
    if number is None or not number.is_integer():
        return None
    return int(number)


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None


# --- the seed's checks, one function each ------------------------------------------------------


def schema_failure(summary: Mapping[str, Any], *, completed: bool) -> str | None:
    """Producer schema versions, for both normal and minimal failure summaries."""
    scope = "completed " if completed else ""
    metric_schema_version = summary.get("metric_schema_version")
    if metric_schema_version is None:
        return f"{scope}run_summary is missing metric_schema_version"
    if (
        isinstance(metric_schema_version, bool)
        or not isinstance(metric_schema_version, int)
        or metric_schema_version != SUPPORTED_METRIC_SCHEMA_VERSION
    ):
        return (
            f"{scope}run_summary has unsupported metric_schema_version "
            f"{_show(metric_schema_version)}; expected {SUPPORTED_METRIC_SCHEMA_VERSION}"
        )
    manifest = _mapping(summary.get("runtime_manifest"))
    if manifest is None:
        return f"{scope}run_summary is missing runtime_manifest"
    runtime_schema_version = manifest.get("schema_version")
    if runtime_schema_version is None:
        return f"{scope}runtime_manifest is missing runtime_manifest.schema_version"
    if (
        isinstance(runtime_schema_version, bool)
        or not isinstance(runtime_schema_version, int)
        or runtime_schema_version != SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION
    ):
        return (
            f"{scope}runtime_manifest has unsupported runtime_manifest.schema_version "
            f"{_show(runtime_schema_version)}; expected "
            f"{SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION}"
        )
    return None


def shutdown_diagnostics(summary: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``runtime_manifest.shutdown`` when it is an object; anything else counts as absent."""
    if summary is None:
        return None
    manifest = _mapping(summary.get("runtime_manifest"))
    if manifest is None:
        return None
    return _mapping(manifest.get("shutdown"))


def shutdown_contract_failure(
    shutdown: Mapping[str, Any] | None, *, require_normal_completion: bool
) -> str | None:
    """The durable, host-only shutdown fields the soak consumes."""
    if shutdown is None:
        return (
            "completed runtime_manifest is missing shutdown diagnostics"
            if require_normal_completion
            else None
        )
    return (
        _shutdown_identity_failure(shutdown)
        or _shutdown_details_failure(shutdown)
        or _shutdown_outcome_failure(shutdown, require_normal_completion=require_normal_completion)
    )


def _shutdown_identity_failure(shutdown: Mapping[str, Any]) -> str | None:
    classification = shutdown.get("classification")
    owner = shutdown.get("owner")
    phase = shutdown.get("phase")
    if not isinstance(classification, str) or classification not in SHUTDOWN_CLASSIFICATIONS:
        return f"shutdown has invalid classification {_show(classification)}"
    if not isinstance(owner, str) or not owner:
        return f"shutdown has invalid owner {_show(owner)}"
    if not isinstance(phase, str) or not phase:
        return f"shutdown has invalid phase {_show(phase)}"
    return None


def _shutdown_details_failure(shutdown: Mapping[str, Any]) -> str | None:
    exception = shutdown.get("exception")
    if exception is not None and not isinstance(exception, Mapping):
        return f"shutdown has invalid exception {_show(exception)}"
    if isinstance(exception, Mapping) and (
        not isinstance(exception.get("type"), str) or not isinstance(exception.get("message"), str)
    ):
        return "shutdown exception requires string type and message fields"
    cleanup = shutdown.get("cleanup")
    if not isinstance(cleanup, Mapping):
        return f"shutdown has invalid cleanup {_show(cleanup)}"
    if not isinstance(cleanup.get("errors"), list):
        return "shutdown cleanup.errors must be a list"
    return None


def _shutdown_outcome_failure(shutdown: Mapping[str, Any], *, require_normal_completion: bool) -> str | None:
    """Whether the (well-formed) shutdown matches how the run ended."""
    classification = shutdown.get("classification")
    if not require_normal_completion:
        if classification == "normal_completion":
            return "abnormal run shutdown classification cannot be normal_completion"
        return None
    if classification != "normal_completion":
        return f"completed run shutdown classification must be normal_completion, got {_show(classification)}"
    cleanup_errors = shutdown["cleanup"]["errors"]
    if cleanup_errors:
        return f"completed run reported shutdown cleanup errors: {_show(cleanup_errors)}"
    return None


def describe_shutdown(shutdown: Mapping[str, Any]) -> str:
    """One line naming the trainer's own diagnosis of an abnormal run."""
    exception = shutdown.get("exception")
    exception_text = ""
    if isinstance(exception, Mapping):
        exception_text = f", exception={_show(exception.get('type'))}: {_show(exception.get('message'))}"
    cleanup = shutdown.get("cleanup")
    cleanup_count = ""
    if isinstance(cleanup, Mapping) and isinstance(cleanup.get("errors"), list):
        cleanup_count = f", cleanup_errors={len(cleanup['errors'])}"
    return (
        "shutdown classification="
        f"{_show(shutdown.get('classification'))}, owner={_show(shutdown.get('owner'))}, "
        f"phase={_show(shutdown.get('phase'))}{exception_text}{cleanup_count}"
    )


def _drained(value: object) -> bool:
    if value is None:
        return True
    number = _finite_number(value)
    return number is not None and number == 0


def inference_flight_failure(summary: Mapping[str, Any]) -> str | None:
    """A completed run must end with no queued inference and no unpublished weights."""
    manifest = _mapping(summary.get("runtime_manifest"))
    flight = _mapping(manifest.get("inference_flight")) if manifest is not None else None
    if flight is None:
        return None
    queue_depth = flight.get("queue_depth")
    publication_lag = flight.get("publication_lag")
    if _drained(queue_depth) and _drained(publication_lag):
        return None
    return (
        "final inference flight is not drained: "
        f"queue_depth={_show(queue_depth)}, publication_lag={_show(publication_lag)}"
    )


def replay_ingress_failure(summary: Mapping[str, Any]) -> str | None:
    """The final replay-ingress invariants of a completed run (the seed's order, first failure)."""
    manifest = _mapping(summary.get("runtime_manifest"))
    if manifest is None:
        return "completed runtime_manifest is missing runtime_manifest"
    replay_ingress = _mapping(manifest.get("replay_ingress"))
    if replay_ingress is None:
        return "completed runtime_manifest is missing replay_ingress"
    values = _ingress_values(replay_ingress)
    if isinstance(values, str):
        return values
    return (
        _ingress_sequence_failure(values)
        or _ingress_occupancy_failure(values)
        or _ingress_returns_failure(values)
        or _ingress_totals_failure(values, summary.get("total_env_steps"))
    )


def _ingress_values(replay_ingress: Mapping[str, Any]) -> dict[str, int] | str:
    """The integer fields, all nonnegative, once backpressure_wait_s is valid; else the failure."""
    values: dict[str, int] = {}
    for name in REPLAY_INGRESS_INTEGER_FIELDS:
        raw = replay_ingress.get(name)
        number = _integer(raw)
        if number is None:
            return f"replay_ingress.{name} must be an integer, got {_show(raw)}"
        values[name] = number
    wait_s = replay_ingress.get("backpressure_wait_s")
    finite_wait_s = _finite_number(wait_s)
    if finite_wait_s is None:
        return f"replay_ingress.backpressure_wait_s must be finite, got {_show(wait_s)}"
    if finite_wait_s < 0:
        return f"replay_ingress.backpressure_wait_s must be nonnegative, got {finite_wait_s!r}"
    for name in REPLAY_INGRESS_INTEGER_FIELDS:
        if values[name] < 0:
            return f"replay_ingress.{name} must be nonnegative, got {values[name]}"
    return values


def _ingress_sequence_failure(values: Mapping[str, int]) -> str | None:
    depth = values["ingress_depth"]
    slot_rows = values["ingress_slot_rows"]
    published = values["published_sequence"]
    released = values["release_sequence"]
    occupancy = values["occupancy"]
    if depth <= 0:
        return f"replay_ingress.ingress_depth must be positive, got {depth}"
    if slot_rows <= 0:
        return f"replay_ingress.ingress_slot_rows must be positive, got {slot_rows}"
    if released > published:
        return f"replay_ingress release_sequence exceeds published_sequence: {released} > {published}"
    if occupancy != published - released:
        return (
            "replay_ingress occupancy does not match publication sequences: "
            f"{occupancy} != {published - released}"
        )
    return None


def _ingress_occupancy_failure(values: Mapping[str, int]) -> str | None:
    depth = values["ingress_depth"]
    occupancy = values["occupancy"]
    high_water = values["high_water_occupancy"]
    if occupancy > depth:
        return f"replay_ingress occupancy exceeds ingress_depth: {occupancy} > {depth}"
    if high_water > depth:
        return f"replay_ingress high_water_occupancy exceeds ingress_depth: {high_water} > {depth}"
    if high_water < occupancy:
        return f"replay_ingress high_water_occupancy is below final occupancy: {high_water} < {occupancy}"
    return None


def _ingress_returns_failure(values: Mapping[str, int]) -> str | None:
    early = values["early_returns"]
    dropped = values["dropped_batches"]
    if early != dropped:
        return f"replay_ingress early_returns and dropped_batches disagree: {early} != {dropped}"
    if values["closed_returns"] + values["stop_returns"] != early:
        return (
            "replay_ingress shutdown return counters disagree with early_returns: "
            f"{values['closed_returns']} + {values['stop_returns']} != {early}"
        )
    if values["occupancy"] != 0:
        return f"final replay ingress occupancy is nonzero: {values['occupancy']}"
    if dropped != 0:
        return f"replay ingress dropped batches during normal run: {dropped}"
    # The seed's "early returns during normal run" check is omitted: early_returns equals
    # dropped_batches, which is 0 here, so it could never fire.
    return None


def _ingress_totals_failure(values: Mapping[str, int], total_env_steps: object) -> str | None:
    slot_rows = values["ingress_slot_rows"]
    published = values["published_sequence"]
    total_steps = _integer(total_env_steps)
    if total_steps is None:
        return f"completed total_env_steps must be an integer, got {_show(total_env_steps)}"
    if total_steps <= 0:
        return f"completed total_env_steps must be positive, got {total_steps}"
    if total_steps % slot_rows != 0:
        return (
            "total_env_steps is not divisible by replay_ingress.ingress_slot_rows: "
            f"{total_steps} % {slot_rows}"
        )
    expected_sequence = total_steps // slot_rows
    if published != expected_sequence:
        return (
            "replay_ingress published_sequence does not match total_env_steps: "
            f"{published} != {expected_sequence}"
        )
    # The seed's release_sequence counterpart is omitted: occupancy = published - released = 0
    # was enforced above, so released equals published here and it could never fire.
    if values["high_water_occupancy"] <= 0:
        return "completed replay_ingress high_water_occupancy must be positive"
    return None


# --- the pluggable runtime-manifest validator ---------------------------------------------------


class ManifestValidator(Protocol):
    """Called as ``validator(manifest, completed=bool)``; raises TypeError/ValueError if violated.

    It receives the summary's own ``runtime_manifest`` object and must not modify it.
    """

    def __call__(self, manifest: Mapping[str, Any], /, *, completed: bool) -> None: ...


@dataclass(frozen=True)
class ValidatorUnavailable:
    """A configured validator that could not be loaded: every validation reports ``message``."""

    message: str


def manifest_contract_failure(
    summary: Mapping[str, Any],
    *,
    completed: bool,
    validator: ManifestValidator | ValidatorUnavailable | None,
) -> str | None:
    """The generic producer validator (skipped when none is configured)."""
    manifest = _mapping(summary.get("runtime_manifest"))
    if manifest is None or validator is None:
        return None
    if isinstance(validator, ValidatorUnavailable):
        return validator.message
    try:
        validator(manifest, completed=completed)
    except (TypeError, ValueError) as exc:
        return f"runtime_manifest violates {_MANIFEST_VERSION_TEXT} contract: {clip(str(exc))}"
    except Exception as exc:  # a crashing plug-in is a failed validation, never a lost verdict
        return f"runtime_manifest validator failed: {type(exc).__name__}: {clip(str(exc))}"
    return None


# --- the outcome --------------------------------------------------------------------------------


@dataclass(frozen=True)
class SummaryOutcome:
    """What ``run_summary.json`` alone says about the run.

    ``failures`` are the seed's messages in the seed's order; ``classification`` is the seed's
    ``monitor_failure_kind`` had nothing failed before the summary was read. Two seed rules
    depend on earlier failures, so ``verdict.decide`` composes them through ``reason_parts`` and
    ``classification_overrides``: the "status is X, expected 'completed'" message (kept in
    ``status_failure``, then always ``failures[0]``) is reported only when nothing failed before,
    and a valid abnormal shutdown classification from the trainer replaces any earlier kind.
    """

    present: bool
    data: dict[str, Any] | None
    classification: str | None
    shutdown: Mapping[str, Any] | None = None
    failures: tuple[str, ...] = ()
    status_failure: str | None = None
    classification_overrides: bool = False
    completed: bool = False

    @property
    def failure_reason(self) -> str | None:
        return "; ".join(self.failures) if self.failures else None

    @property
    def passed(self) -> bool:
        return not self.failures

    def reason_parts(self, *, after_failure: bool) -> tuple[str, ...]:
        """The messages to append to a reason; ``after_failure``: something failed already."""
        if after_failure and self.status_failure is not None:
            return self.failures[1:]
        return self.failures


def _utc(epoch: float) -> str:
    try:
        return datetime.fromtimestamp(epoch, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except (OverflowError, OSError, ValueError):
        return repr(epoch)


class _DuplicateKeyError(ValueError):
    pass


def _refuse_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """Stricter than the seed, which kept the last: ``{"status": "failed", ..., "status":
    "completed"}`` must not pass as completed."""
    document: dict[str, Any] = {}
    for key, value in pairs:
        if key in document:
            raise _DuplicateKeyError(f"run_summary.json repeats the key {clip(key)!r} in one object")
        document[key] = value
    return document


# Far deeper than the contract's documents; bounds every recursive walk of the trainer's data.
MAX_NESTING = 64


def _depth(value: object) -> int:
    """How deeply ``value`` nests lists and objects, counted without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        node, level = pending.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if deepest > MAX_NESTING:
            return deepest
        pending.extend((child, level + 1) for child in children)
    return deepest


def load_run_summary(data: bytes, *, max_bytes: int) -> object:
    """Parse run_summary.json as the seed did (``NaN``/``Infinity`` parse; checks reject them).

    Raises ``InvalidRunSummaryError`` for an oversized, non-UTF-8, unparsable or too deeply
    nested document. A caller reading the file may stop after ``max_bytes + 1`` bytes.
    """
    if len(data) > max_bytes:
        raise InvalidRunSummaryError(f"run_summary.json exceeds the {max_bytes} byte limit")
    try:
        value = json.loads(data.decode("utf-8"), object_pairs_hook=_refuse_duplicate_keys)
    except UnicodeDecodeError as exc:
        raise InvalidRunSummaryError(f"run_summary.json is not UTF-8: {exc}") from exc
    except RecursionError as exc:
        raise InvalidRunSummaryError("run_summary.json is nested too deeply to parse") from exc
    except _DuplicateKeyError as exc:
        raise InvalidRunSummaryError(str(exc)) from exc
    except ValueError as exc:  # JSONDecodeError, and integers over Python's digit limit
        raise InvalidRunSummaryError(f"run_summary.json is not valid JSON: {clip(str(exc))}") from exc
    if _depth(value) > MAX_NESTING:
        raise InvalidRunSummaryError(f"run_summary.json is nested deeper than {MAX_NESTING} levels")
    return value


def evaluate_run_summary(
    raw: bytes | None,
    *,
    mtime: float | None,
    run_started_wall: float | None,
    max_bytes: int,
    manifest_validator: ManifestValidator | ValidatorUnavailable | None,
) -> SummaryOutcome:
    """Judge the file's bytes; ``raw`` None: it does not exist. Never raises for any input.

    ``mtime``/``run_started_wall`` (epoch seconds): a file last written before the run started
    is left over from an earlier attempt. Pass None for either to skip that check (offline).
    """
    if raw is None:
        return SummaryOutcome(
            present=False,
            data=None,
            classification="missing_run_summary",
            failures=("trainer did not write run_summary.json",),
        )
    if mtime is not None and run_started_wall is not None and mtime < run_started_wall:
        return SummaryOutcome(
            present=True,
            data=None,
            classification="stale_run_summary",
            failures=(
                f"run_summary.json predates this run (written {_utc(mtime)}, run started "
                f"{_utc(run_started_wall)}): left over from an earlier attempt",
            ),
        )
    try:
        value = load_run_summary(raw, max_bytes=max_bytes)
    except InvalidRunSummaryError as exc:
        return SummaryOutcome(
            present=True, data=None, classification="invalid_run_summary", failures=(str(exc),)
        )
    return evaluate_parsed(value, manifest_validator=manifest_validator)


def evaluate_parsed(
    value: object, *, manifest_validator: ManifestValidator | ValidatorUnavailable | None
) -> SummaryOutcome:
    """Judge an already parsed document (the seed's classification, from the summary alone)."""
    if not isinstance(value, dict):
        return SummaryOutcome(
            present=True,
            data=None,
            classification="invalid_run_summary",
            failures=(f"run_summary must be a JSON object, got {type(value).__name__}",),
        )
    summary: dict[str, Any] = value
    completed = summary.get("status") == "completed"
    shutdown = shutdown_diagnostics(summary)
    found = _Findings()
    schema = schema_failure(summary, completed=completed)
    found.add(schema, "schema_violation")
    if completed:
        _judge_completed(found, summary, shutdown, schema_ok=schema is None, validator=manifest_validator)
    else:
        _judge_abnormal(found, summary, shutdown, validator=manifest_validator)
    return SummaryOutcome(
        present=True,
        data=summary,
        classification=found.kind or ("unknown_failure" if found.failures else None),
        shutdown=shutdown,
        failures=tuple(found.failures),
        status_failure=found.status_failure,
        classification_overrides=found.overrides,
        completed=completed,
    )


@dataclass
class _Findings:
    """What ``evaluate_parsed`` has found so far; the first failure with a kind classifies."""

    failures: list[str] = field(default_factory=list)
    kind: str | None = None
    status_failure: str | None = None
    overrides: bool = False

    def add(self, failure: str | None, kind: str | None = None) -> None:
        if failure is not None:
            self.failures.append(failure)
            self.kind = self.kind or kind


def _judge_completed(
    found: _Findings,
    summary: Mapping[str, Any],
    shutdown: Mapping[str, Any] | None,
    *,
    schema_ok: bool,
    validator: ManifestValidator | ValidatorUnavailable | None,
) -> None:
    if schema_ok:
        found.add(inference_flight_failure(summary), "unknown_failure")
    ingress = replay_ingress_failure(summary) or manifest_contract_failure(
        summary, completed=True, validator=validator
    )
    found.add(ingress, "schema_violation")
    found.add(
        shutdown_contract_failure(shutdown, require_normal_completion=True),
        "shutdown_contract_violation",
    )


def _judge_abnormal(
    found: _Findings,
    summary: Mapping[str, Any],
    shutdown: Mapping[str, Any] | None,
    *,
    validator: ManifestValidator | ValidatorUnavailable | None,
) -> None:
    if not found.failures:
        found.status_failure = f"run_summary status is {_show(summary.get('status'))}, expected 'completed'"
        found.add(found.status_failure)
    found.add(manifest_contract_failure(summary, completed=False, validator=validator))
    contract = shutdown_contract_failure(shutdown, require_normal_completion=False)
    if contract is not None:
        found.add(contract, "shutdown_contract_violation")
    elif shutdown is not None:
        found.add(describe_shutdown(shutdown))
        # the contract held, so the classification is one of the six abnormal ones
        found.kind = str(shutdown.get("classification"))
        found.overrides = True
    else:
        found.add("shutdown diagnostics are unavailable")


# --- typed models: the same contract for JSON Schema export and typed access -------------------


def _json_integer(value: object) -> object:
    # the seed accepts 3.0 where it wants an integer, never True
    if isinstance(value, bool):
        raise ValueError("a boolean is not an integer")
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _json_finite(value: object) -> object:
    number = _finite_number(value)
    if number is None:
        raise ValueError("must be a finite number")
    return number


def _object_or_none(value: object) -> object:
    # the seed ignores a non-object here as if the field were absent
    return value if isinstance(value, Mapping) else None


# constraints sit inside the before-validator so they stay JSON Schema keywords
NonNegativeInt = Annotated[int, Strict(), Field(ge=0), BeforeValidator(_json_integer)]
PositiveInt = Annotated[int, Strict(), Field(gt=0), BeforeValidator(_json_integer)]
NonNegativeFinite = Annotated[float, Strict(), Field(ge=0), BeforeValidator(_json_finite)]
NonEmptyStr = Annotated[StrictStr, Field(min_length=1)]
ShutdownClassification = Literal[
    "normal_completion",
    "learner_failure",
    "collector_failure",
    "backend_worker_failure",
    "timeout/stale_tick",
    "external_cancellation",
    "unknown_failure",
]


class _Open(BaseModel):
    # producers add fields freely; only the ones below are part of the soak contract
    model_config = ConfigDict(extra="allow", frozen=True)


class ShutdownException(_Open):
    type: StrictStr = Field(description="Exception class name.")
    message: StrictStr = Field(description="Exception message.")


class ShutdownCleanup(_Open):
    errors: list[Any] = Field(description="Cleanup errors; must be empty for a completed run.")


class ShutdownDiagnostics(_Open):
    """``runtime_manifest.shutdown``: the trainer's own diagnosis of how it ended."""

    classification: ShutdownClassification = Field(
        description="normal_completion for a completed run, never for an abnormal one."
    )
    owner: NonEmptyStr = Field(description="Component that owned the shutdown.")
    phase: NonEmptyStr = Field(description="Phase the run was in when it ended.")
    exception: ShutdownException | None = Field(None, description="The exception that ended it.")
    cleanup: ShutdownCleanup


class ReplayIngress(_Open):
    """``runtime_manifest.replay_ingress`` of a completed run: the final ingress queue state.

    Invariants: release_sequence <= published_sequence; occupancy = published_sequence -
    release_sequence, and 0 at the end; occupancy <= high_water_occupancy <= ingress_depth;
    high_water_occupancy > 0; early_returns = dropped_batches = closed_returns + stop_returns = 0;
    published_sequence = release_sequence = total_env_steps / ingress_slot_rows (exactly).
    """

    ingress_depth: PositiveInt
    ingress_slot_rows: PositiveInt
    published_sequence: NonNegativeInt
    release_sequence: NonNegativeInt
    occupancy: NonNegativeInt
    high_water_occupancy: PositiveInt
    backpressure_waits: NonNegativeInt
    backpressure_wait_s: NonNegativeFinite
    early_returns: NonNegativeInt
    dropped_batches: NonNegativeInt
    closed_returns: NonNegativeInt
    stop_returns: NonNegativeInt


class InferenceFlight(_Open):
    """``runtime_manifest.inference_flight``; a completed run must end drained."""

    queue_depth: Any = Field(None, description="Queued inference requests at the end: 0 or null.")
    publication_lag: Any = Field(None, description="Unpublished weights at the end: 0 or null.")
    max_in_flight: Any = Field(None, description="Informational (copied to the artifact).")
    max_publication_lag: Any = Field(None, description="Informational (copied to the artifact).")


class InferenceMemoryBudget(_Open):
    """``runtime_manifest.inference_memory_budget``: informational."""

    ipc_event_count: Any = Field(None, description="Informational (copied to the artifact).")


class RuntimeManifest(_Open):
    """``runtime_manifest`` of a run that did not complete (only the schema and shutdown count)."""

    schema_version: Literal[2]
    shutdown: Annotated[ShutdownDiagnostics | None, BeforeValidator(_object_or_none)] = Field(
        None, description="Absent means 'shutdown diagnostics are unavailable'."
    )
    replay_ingress: Any = None
    inference_flight: Any = None
    inference_memory_budget: Any = None


class CompletedRuntimeManifest(_Open):
    """``runtime_manifest`` of a completed run."""

    schema_version: Literal[2]
    shutdown: Annotated[ShutdownDiagnostics, BeforeValidator(_object_or_none)] = Field(
        description="classification normal_completion and no cleanup errors."
    )
    replay_ingress: ReplayIngress
    inference_flight: Annotated[InferenceFlight | None, BeforeValidator(_object_or_none)] = None
    inference_memory_budget: Any = None


def _completed_contract(data: object) -> object:
    if isinstance(data, dict):
        if data.get("status") != "completed":
            raise ValueError("status must be 'completed'")
        outcome = evaluate_parsed(data, manifest_validator=None)
        if outcome.failures:
            raise ValueError(outcome.failure_reason)
    return data


def _abnormal_contract(data: object) -> object:
    if isinstance(data, dict):
        if data.get("status") == "completed":
            raise ValueError("status must not be 'completed'")
        problems = [
            problem
            for problem in (
                schema_failure(data, completed=False),
                shutdown_contract_failure(shutdown_diagnostics(data), require_normal_completion=False),
            )
            if problem is not None
        ]
        if problems:
            raise ValueError("; ".join(problems))
    return data


class CompletedRunSummary(_Open):
    """A completed run's summary that satisfies the whole soak contract."""

    status: Literal["completed"]
    metric_schema_version: Literal[1]
    total_env_steps: PositiveInt = Field(description="A multiple of ingress_slot_rows.")
    runtime_manifest: CompletedRuntimeManifest

    _contract = model_validator(mode="before")(_completed_contract)


class AbnormalRunSummary(_Open):
    """The minimal summary of a run that did not complete (the run fails; the contract holds)."""

    status: Any = Field(
        None,
        description="Anything but 'completed' (e.g. 'failed').",
        json_schema_extra={"not": {"const": "completed"}},
    )
    metric_schema_version: Literal[1]
    runtime_manifest: RuntimeManifest

    _contract = model_validator(mode="before")(_abnormal_contract)


RunSummary = Annotated[CompletedRunSummary | AbnormalRunSummary, Field(union_mode="left_to_right")]
_RUN_SUMMARY: TypeAdapter[CompletedRunSummary | AbnormalRunSummary] = TypeAdapter(RunSummary)


def typed_run_summary(data: object) -> CompletedRunSummary | AbnormalRunSummary | None:
    """The typed view of a summary that satisfies its contract, else None."""
    try:
        return _RUN_SUMMARY.validate_python(data)
    except ValidationError:
        return None


def run_summary_json_schema() -> dict[str, Any]:
    """JSON Schema (2020-12) of run_summary.json, for trainer authors."""
    schema = _RUN_SUMMARY.json_schema()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "soak-sidecar run_summary.json",
        "description": (
            "Written by the trainer into the progress directory when it ends. A completed run "
            f"(status 'completed') needs metric_schema_version {SUPPORTED_METRIC_SCHEMA_VERSION}, "
            "total_env_steps and a runtime_manifest with schema_version "
            f"{SUPPORTED_RUNTIME_MANIFEST_SCHEMA_VERSION}, replay_ingress and shutdown; any other "
            "status fails the soak with the trainer's shutdown classification."
        ),
        **schema,
    }
