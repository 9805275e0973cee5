"""The one classification table: every wire string once, the trainer's claims the run_summary
contract's shutdown classes, and the verdict's views of it (observed kinds, claims that need the
sidecar to have seen their cause) as the verdict rules state them."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from sidecar.core.classification import (
    CLASSIFICATION_EXIT_CODES,
    OBSERVED,
    RULES,
    SEEN_ONLY,
    STOPPED_FROM_OUTSIDE,
    Classification,
)
from sidecar.core.exitcodes import ExitCode
from sidecar.core.run_summary.contract import SHUTDOWN_CLASSIFICATIONS

SIDECAR = Path(__file__).resolve().parents[2] / "sidecar"


def test_every_classification_has_one_rule_and_a_wire_string_of_its_own() -> None:
    assert set(RULES) == set(Classification)
    assert len({c.value for c in Classification}) == len(Classification)
    assert all(str(c) == c.value and json.dumps(c) == json.dumps(c.value) for c in Classification)


def test_the_trainer_may_claim_exactly_the_contracts_abnormal_shutdown_classes() -> None:
    claimable = {c.value for c, rule in RULES.items() if rule.claimable}
    assert claimable == set(SHUTDOWN_CLASSIFICATIONS) - {"normal_completion"}
    # what a trainer may claim of its own failure is the trainer's failure (10), or a stop or a
    # stall the sidecar must have seen: never a retryable code
    assert all(RULES[Classification(c)].exit_code in (10, 12, 17) for c in claimable)


def test_a_cause_only_the_sidecar_sees_counts_only_when_it_saw_it() -> None:
    assert {
        "external_cancellation": STOPPED_FROM_OUTSIDE,
        "timeout/stale_tick": {Classification.STALE_PROGRESS, Classification.STARTUP_TIMEOUT},
    } == SEEN_ONLY
    assert (
        STOPPED_FROM_OUTSIDE
        | {
            Classification.STALE_PROGRESS,
            Classification.STARTUP_TIMEOUT,
            Classification.RESOURCE_LEAK,
            Classification.OUT_OF_MEMORY,
            Classification.DEADLINE_EXHAUSTED,
            Classification.GPU_FAULT,
            Classification.THROUGHPUT_DROPPED,
        }
        == OBSERVED
    )


def test_exit_codes_by_classification_take_plain_strings() -> None:
    assert CLASSIFICATION_EXIT_CODES["evicted"] is ExitCode.CANCELLED
    assert CLASSIFICATION_EXIT_CODES["job_suspended"] is ExitCode.JOB_SUSPENDED
    assert not ExitCode.JOB_SUSPENDED.failure and ExitCode.GPU_FAULT.failure


def test_no_classification_is_spelled_out_beside_the_table() -> None:
    """Each classification is named through the enum: its string is written in the table, in the
    run_summary contract (what a trainer may write), in the launcher's own reason vocabulary (a
    stdlib program of its own) and in the example trainer, nowhere else."""
    wire = {c.value for c in Classification}
    allowed = (
        SIDECAR / "core" / "classification.py",
        SIDECAR / "core" / "run_summary",
        SIDECAR / "launcher",
        SIDECAR / "examples",
    )
    spelled = [
        f"{path.relative_to(SIDECAR.parent)}:{node.lineno} {node.value}"
        for path in sorted(SIDECAR.rglob("*.py"))
        if not any(path == root or root in path.parents for root in allowed)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in wire
    ]
    assert not spelled, spelled
