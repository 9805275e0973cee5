"""Property: any bytes/JSON document yields a SummaryOutcome (valid or a clear failure), never raises.

Arbitrary JSON reaches only the top of the contract, so half of the documents are mutations of the
valid summaries (a leaf replaced, nudged or deleted), which reach every replay-ingress and shutdown
rule. The typed models must agree with the checks on every document.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import TypeAdapter, ValidationError

from sidecar.core.classification import SEEN_ONLY
from sidecar.core.exitcodes import ExitCode
from sidecar.core.run_summary import (
    REPLAY_INGRESS_INTEGER_FIELDS,
    SHUTDOWN_CLASSIFICATIONS,
    SUMMARY_CLASSIFICATIONS,
    AbnormalRunSummary,
    CompletedRunSummary,
    ManifestValidator,
    RunSummary,
    SummaryOutcome,
    ValidatorUnavailable,
    evaluate_run_summary,
    schema_failure,
    shutdown_contract_failure,
    shutdown_diagnostics,
)
from sidecar.core.verdict import decide, exit_code_for

DATA = Path(__file__).resolve().parents[1] / "data" / "run_summary"
VALID = [
    json.loads((DATA / "minimal_completed.json").read_text()),
    json.loads((DATA / "minimal_abnormal.json").read_text()),
]
VALID[0]["runtime_manifest"]["inference_flight"] = {"queue_depth": 0, "publication_lag": 0}
KEYS = sorted(
    {
        "status",
        "metric_schema_version",
        "runtime_manifest",
        "schema_version",
        "shutdown",
        "classification",
        "owner",
        "phase",
        "exception",
        "type",
        "message",
        "cleanup",
        "errors",
        "replay_ingress",
        "inference_flight",
        "queue_depth",
        "publication_lag",
        "total_env_steps",
        "backpressure_wait_s",
        *REPLAY_INGRESS_INTEGER_FIELDS,
    }
)
ALLOWED_CLASSIFICATIONS = {
    *SUMMARY_CLASSIFICATIONS,
    *(c for c in SHUTDOWN_CLASSIFICATIONS if c != "normal_completion"),
}

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.integers(min_value=-3, max_value=80),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.sampled_from(["completed", "failed", *SHUTDOWN_CLASSIFICATIONS]),
)
keys = st.sampled_from(KEYS) | st.text(max_size=5)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(keys, children, max_size=4),
    max_leaves=10,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found: list[tuple[Any, ...]] = []
    items: list[tuple[Any, Any]] = []
    if isinstance(node, dict):
        items = list(node.items())
    elif isinstance(node, list):
        items = list(enumerate(node))
    for key, child in items:
        found.append((*prefix, key))
        found.extend(_paths(child, (*prefix, key)))
    return found


def _nudge(value: Any, delta: int) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return delta
    return value + delta


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    document = copy.deepcopy(draw(st.sampled_from(VALID)))
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(document)
        if not paths:
            break
        *parents, last = draw(st.sampled_from(paths))
        node: Any = document
        for key in parents:
            node = node[key]
        action = draw(st.sampled_from(["replace", "nudge", "delete", "retype"]))
        if action == "delete" and isinstance(node, dict):
            del node[last]
        elif action == "nudge":
            node[last] = _nudge(node[last], draw(st.sampled_from([-2, -1, 1, 2, 16])))
        elif action == "retype":
            current = node[last]
            node[last] = draw(
                st.sampled_from([str(current), [current], {"v": current}, True, None, math.nan, -math.inf])
            )
        else:
            node[last] = draw(scalars | json_values)
    return document


def _strict(manifest: Mapping[str, Any], /, *, completed: bool) -> None:
    if "producer" not in manifest:
        raise ValueError("producer is required")


def _crashes(manifest: Mapping[str, Any], /, *, completed: bool) -> None:
    raise KeyError(completed)


VALIDATORS: list[ManifestValidator | ValidatorUnavailable | None] = [
    None,
    None,
    _strict,
    _crashes,
    ValidatorUnavailable("runtime_manifest validation requires x:y: No module named 'x'"),
]


def _encode(document: Any) -> bytes:
    return json.dumps(document).encode()


raw_documents = st.one_of(
    json_values.map(_encode),
    st.dictionaries(keys, json_values, max_size=4).map(_encode),
    mutated().map(_encode),
    mutated().map(_encode),
    st.binary(max_size=40),
    st.none(),
)


@settings(
    max_examples=10_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    raw=raw_documents,
    validator=st.sampled_from(VALIDATORS),
    mtime=st.none() | st.floats(min_value=0, max_value=2e9),
)
def test_every_document_yields_an_outcome(
    raw: bytes | None,
    validator: ManifestValidator | ValidatorUnavailable | None,
    mtime: float | None,
) -> None:
    outcome = evaluate_run_summary(
        raw, mtime=mtime, run_started_wall=1e9, max_bytes=4096, manifest_validator=validator
    )
    assert isinstance(outcome, SummaryOutcome)
    assert all(isinstance(f, str) and f for f in outcome.failures)
    assert outcome.passed == (outcome.classification is None)
    if not outcome.passed:
        assert outcome.classification in ALLOWED_CLASSIFICATIONS
        assert outcome.failure_reason is not None and len(outcome.failure_reason) < 10_000
    if outcome.status_first:
        assert outcome.failures[0].startswith("run_summary status is ")
    verdict = decide(
        monitor_failure=None,
        returncode=0,
        duration_s=1.0,
        min_duration_s=0.0,
        residuals=(),
        summary=outcome,
        deadline=None,
        gpu_fault=None,
    )
    # A stop or a stall the sidecar did not see is not taken from the trainer: its own failure.
    claimed = outcome.classification
    expected = ExitCode.TRAINER_FAILED if claimed in SEEN_ONLY else exit_code_for(claimed)
    assert verdict.exit_code == expected

    if outcome.data is None:
        return
    # the typed models accept exactly what the checks accept
    try:
        typed: object = TypeAdapter(RunSummary).validate_python(outcome.data)
    except ValidationError:
        typed = None
    if validator is None:
        assert isinstance(typed, CompletedRunSummary) == outcome.passed
    elif outcome.passed:
        assert isinstance(typed, CompletedRunSummary)
    if not outcome.completed:
        contract_holds = (
            schema_failure(outcome.data, completed=False) is None
            and shutdown_contract_failure(shutdown_diagnostics(outcome.data), require_normal_completion=False)
            is None
        )
        assert isinstance(typed, AbnormalRunSummary) == contract_holds
