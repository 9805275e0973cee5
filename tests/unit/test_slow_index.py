"""The slow index of a multi-pod soak (sidecar.core.slow_index) and where it is named: the pods'
annotations and `soak-sidecar verdict`'s rows, the run's ledger, the run's page."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from sidecar.core.errors import ConfigError
from sidecar.core.job_pods import AttemptRow, attempt_rows, slow_rows
from sidecar.core.ledger.record import (
    Ledger,
    LedgerEntry,
    check_entry,
    dumps_ledger,
    ledger_rate,
    parse_ledger,
)
from sidecar.core.pod_facts import PodFacts
from sidecar.core.publication import DEFAULT_PREFIX, Publication, build_annotations, parse_annotations
from sidecar.core.report_input import parse_artifact
from sidecar.core.run_page import RunAttempt, render_run_report
from sidecar.core.running_annotations import (
    ProgressFigures,
    build_progress_annotations,
    parse_progress_figures,
)
from sidecar.core.slow_index import SLOW_BELOW, IndexRate, slow_indexes

T0 = 1_700_000_000.0
INDEX = "batch.kubernetes.io/job-completion-index"


def test_of_two_pods_the_one_30_percent_slower_is_named_with_its_node_and_ratio() -> None:
    slow = slow_indexes([IndexRate(0, 1, 10.0, "node-a"), IndexRate(1, 1, 7.0, "node-b")])
    assert [(s.index, s.node, s.steps_per_s, s.others_median) for s in slow] == [(1, "node-b", 7.0, 10.0)]
    assert slow[0].describe() == (
        "index 1 on node node-b ran at 7 steps/s, 0.70x the median of the other indexes (10 steps/s)"
    )
    # A step time 30 % longer is a rate 0.77x: named too; a few percent of noise is not.
    assert [s.index for s in slow_indexes([IndexRate(0, 1, 1.3, None), IndexRate(1, 1, 1.0, None)])] == [1]
    assert slow_indexes([IndexRate(0, 1, 1.0, None), IndexRate(1, 1, 0.95, None)]) == []


def test_each_index_counts_by_its_latest_attempt_and_no_rate_is_no_rate() -> None:
    rates = [
        IndexRate(0, 1, 10.0),
        IndexRate(1, 1, 2.0),  # an earlier attempt of index 1, slow
        IndexRate(1, 2, 9.5),
        IndexRate(2, 1, 9.0),
        IndexRate(3, 1, math.nan),
        IndexRate(4, 1, -1.0),
    ]
    assert slow_indexes(rates) == []
    assert slow_indexes([IndexRate(0, 1, 10.0)]) == []  # one index: nothing to compare with
    many = [IndexRate(i, 1, 10.0) for i in range(7)] + [IndexRate(7, 1, 10.0 * SLOW_BELOW * 0.99)]
    assert [s.index for s in slow_indexes(many)] == [7]


def test_a_running_pod_annotates_its_rate_and_finish_and_a_verdict_its_mean_rate() -> None:
    running = build_progress_annotations("running", T0, DEFAULT_PREFIX, ProgressFigures(12.5, T0 + 600.7))
    assert running[f"{DEFAULT_PREFIX}steps-per-s"] == "12.5" and running[f"{DEFAULT_PREFIX}eta"] == str(
        int(T0 + 600)
    )
    shown = {k: v for k, v in running.items() if v is not None}
    assert parse_progress_figures(shown) == ProgressFigures(12.5, float(int(T0 + 600)))
    # A trainer without progress records: no key of theirs; one whose rate is gone: deleted (a merge
    # patch's null), never left stale.
    assert set(build_progress_annotations("running", T0)) == {
        f"{DEFAULT_PREFIX}phase",
        f"{DEFAULT_PREFIX}heartbeat",
    }
    gone = build_progress_annotations("running", T0, DEFAULT_PREFIX, ProgressFigures())
    assert gone[f"{DEFAULT_PREFIX}steps-per-s"] is None and gone[f"{DEFAULT_PREFIX}eta"] is None
    pub = Publication("passed", None, "", 0, attempt=1, index=1, indexes=2, steps_per_s=7.25)
    done = {k: v for k, v in build_annotations(pub).items() if v is not None}
    assert done[f"{DEFAULT_PREFIX}steps-per-s"] == "7.25"
    parsed = parse_annotations(done)
    assert parsed is not None and parsed.steps_per_s == 7.25


@pytest.mark.parametrize("hostile", ["nan", "inf", "-3", "0", "1e999", "1_0", "٣", " 5", "5" * 40])
def test_a_rate_that_is_no_rate_reads_as_absent(hostile: str) -> None:
    key = f"{DEFAULT_PREFIX}steps-per-s"
    parsed = parse_annotations(
        {f"{DEFAULT_PREFIX}verdict": "passed", f"{DEFAULT_PREFIX}exit-code": "0", key: hostile}
    )
    assert parsed is not None and parsed.steps_per_s is None
    assert parse_progress_figures({key: hostile}) is None


def test_the_verdicts_rows_carry_node_and_rate_and_name_the_slow_index() -> None:
    def pod(index: int, node: str, annotations: dict[str, str]) -> PodFacts:
        return PodFacts(
            f"job-{index}", f"uid-{index}", {INDEX: str(index), **annotations}, node=node, phase="Running"
        )

    fast = build_progress_annotations("running", T0, DEFAULT_PREFIX, ProgressFigures(10.0, None))
    slow = build_progress_annotations("running", T0, DEFAULT_PREFIX, ProgressFigures(7.0, None))
    pods = [pod(0, "node-a", _set(fast)), pod(1, "node-b", _set(slow))]
    rows = attempt_rows(pods, prefix=DEFAULT_PREFIX, sidecar_container="soak-sidecar")
    assert [(r.index, r.node, r.steps_per_s) for r in rows] == [(0, "node-a", 10.0), (1, "node-b", 7.0)]
    (named,) = slow_rows(rows)
    assert (named.index, named.node, round(named.ratio, 2)) == (1, "node-b", 0.7)
    assert slow_rows([replace(r, index=None) for r in rows]) == []  # a single-pod soak has no index


def _set(annotations: dict[str, str | None]) -> dict[str, str]:
    return {k: v for k, v in annotations.items() if v is not None}


def test_the_ledger_keeps_each_attempts_rate_and_node_and_refuses_a_rate_that_is_none() -> None:
    entry = LedgerEntry(1, 0, "passed", None, T0, T0 + 90, (), steps_per_s=7.5, node="node-b")
    data = dumps_ledger(Ledger("r", T0, (entry,)), now=T0 + 100)
    (back,) = parse_ledger(data, "ledger").entries
    assert (back.steps_per_s, back.node) == (7.5, "node-b")
    doc = json.loads(data)
    for key in ("steps_per_s", "node"):  # a ledger written before them reads the same
        del doc["attempts"][0][key]
    (old,) = parse_ledger(json.dumps(doc).encode(), "ledger").entries
    assert (old.steps_per_s, old.node) == (None, None)
    doc["attempts"][0]["steps_per_s"] = 0
    with pytest.raises(ConfigError, match="steps_per_s must be above zero"):
        parse_ledger(json.dumps(doc).encode(), "ledger")


def test_the_runs_page_names_the_slow_index_from_its_artifacts_and_its_ledger() -> None:
    def artifact(index: int, rate: float) -> RunAttempt:
        doc = {
            "status": "passed",
            "context": {"run_id": "r", "attempt": 1, "index": index, "node": f"node-{index}"},
            "deadline": {"started_unix": T0},
            "resource_summary": {"progress": {"mean_steps_per_s": rate}},
            "phases": {"phases": [{"kind": "productive", "start_unix": T0, "seconds": 100.0}]},
        }
        name = f"index-{index}"
        return RunAttempt(name, parse_artifact(json.dumps(doc).encode(), name), f"{name}/report.html")

    page = render_run_report("r", [artifact(0, 10.0), artifact(1, 7.0)])
    assert "<h2>Slow index</h2>" in page
    assert (
        "index 1 on node node-1 ran at 7 steps/s, 0.70x the median of the other indexes (10 steps/s)" in page
    )
    assert "Slow index" not in render_run_report("r", [artifact(0, 10.0), artifact(1, 9.5)])
    # Index 1's artifact is not here; the ledger's entry stands in for it.
    entry = LedgerEntry(1, 1, "passed", None, T0, T0 + 100, (), steps_per_s=6.0, node="node-x")
    page = render_run_report("r", [artifact(0, 10.0)], Ledger("r", T0, (entry,)))
    assert "index 1 on node node-x ran at 6 steps/s, 0.60x" in page


def test_rows_without_a_rate_name_nothing() -> None:
    row = AttemptRow(1, "job-0", 0, "Running", None, None, None, "", None, None, None, None)
    assert slow_rows([row, replace(row, index=1, pod="job-1", steps_per_s=1.0)]) == []


@pytest.mark.parametrize("per_s", [1.4e-7, 1e-300, 3.0, 123456789.123])
def test_a_rate_the_ledger_keeps_is_one_its_readers_take(per_s: float) -> None:
    """Six significant digits: a month-long attempt of few steps never rounds to zero, which the
    ledger's readers refuse with the whole entry (and the lost attempts written with it)."""
    kept = ledger_rate(per_s)
    assert kept is not None and kept == pytest.approx(per_s, rel=1e-5)
    check_entry(LedgerEntry(1, 0, "passed", None, T0, T0 + 90, (), steps_per_s=kept))
    assert [ledger_rate(bad) for bad in (None, 0.0, -1.0, math.nan, math.inf)] == [None] * 5


def test_a_finish_further_off_than_a_year_is_not_annotated() -> None:
    far = build_progress_annotations("running", T0, DEFAULT_PREFIX, ProgressFigures(1e-9, T0 + 400 * 86_400))
    assert far[f"{DEFAULT_PREFIX}eta"] is None and far[f"{DEFAULT_PREFIX}steps-per-s"] == "1e-09"
