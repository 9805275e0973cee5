"""What the report page shows of a run (pure rendering of a parsed artifact): the whole run on the
time axis, how the trainer ended, the command, the console's tail, trends in human units."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from sidecar.core.errors import ConfigError
from sidecar.core.ledger.record import LOST, Ledger, LedgerEntry
from sidecar.core.report import console_tail, describe_end, render_report
from sidecar.core.report_input import TrainerEnd, parse_artifact
from sidecar.core.report_progress import ProgressPlots
from sidecar.core.report_samples import ReportSample, parse_sample
from sidecar.core.run_page import RunAttempt, render_run_report

T0 = 1_700_000_000.0


def artifact(**launcher: Any) -> dict[str, Any]:
    return {
        "status": "failed",
        "failure_classification": "timeout/deadline",
        "exit_code": 16,
        "context": {"run_id": "r"},
        "command": ["python3", "train.py", "--api-key", "<redacted>"],
        "console_log": "/node/path/attempt-1/console.log",
        "deadline": {"deadline_unix": T0 + 200},
        "samples": {"samples_file": "samples.jsonl.gz"},
        "post_shutdown": {
            "launcher_exit": {
                "reason": "deadline",
                "returncode": None,
                "signal_name": "SIGKILL",
                "ended_unix": T0 + 206,
                "stop_times_unix": {"soft_stop": T0 + 150, "term": T0 + 195, "kill": T0 + 205},
                **launcher,
            }
        },
        "resource_summary": {
            "trends": [
                {
                    "series": "process tree RSS",
                    "unit": "bytes",
                    "per_hour": 3.02e10,
                    "low_per_hour": 2.9e10,
                    "high_per_hour": 3.1e10,
                    "points": 40,
                },
                {
                    "series": "process tree fds",
                    "unit": "fds",
                    "per_hour": 0.5,
                    "low_per_hour": -1.0,
                    "high_per_hour": 2.0,
                    "points": 40,
                },
            ]
        },
    }


def samples(until: float) -> list[ReportSample]:
    return [
        ReportSample(T0 + t, 1024.0 * (1 + t), (("pipe", 3.0),), 2.0, 0.0, (), 10.0 * t)
        for t in range(0, int(until), 10)
    ]


def page(doc: dict[str, Any], until: float = 160.0, tail: str | None = None) -> str:
    return render_report(parse_artifact(json.dumps(doc).encode(), "a"), samples(until), tail)


def test_the_time_axis_runs_to_the_last_event_and_marks_every_stop() -> None:
    # The last sample is at +150: TERM, the deadline, KILL and the trainer's end come after it.
    text = page(artifact())
    for label in ("soft stop", "TERM", "deadline", "KILL", "ended"):
        assert f'class="mark-label">{label}</text>' in text, label
    assert "0:03:26" in text  # the axis's end: the trainer ended 206 s after the first sample


def test_the_page_says_how_the_trainer_ended_and_what_it_ran() -> None:
    text = page(artifact(), tail="step 41\nstep 42: checkpoint saved")
    assert "killed by SIGKILL (deadline)" in text
    assert "python3 train.py --api-key &lt;redacted&gt;" in text
    assert "step 42: checkpoint saved" in text


def test_trends_read_in_human_units_and_a_steady_growth_is_pointed_out() -> None:
    passed = {**artifact(), "status": "passed", "failure_classification": None, "exit_code": 0}
    text = page(passed)
    assert "28.1 GiB per hour" in text and "3.02e+10" not in text
    assert "a leak rule would have failed it" in text
    assert text.count("grows steadily") == 1  # the fds interval spans zero: no note


def test_how_a_trainer_ended_in_words() -> None:
    assert describe_end(TrainerEnd("exited", 0, None, None)) == "exited with code 0"
    assert (
        describe_end(TrainerEnd("heartbeat_lost", None, "SIGKILL", None))
        == "killed by SIGKILL (heartbeat lost)"
    )
    assert describe_end(None).startswith("unknown")


def test_the_console_tail_drops_a_cut_first_line_and_terminal_escapes() -> None:
    data = b"ial line\n\x1b[31mred\x1b[0m\x07\n" + b"".join(b"line %d\n" % n for n in range(100))
    tail = console_tail(data, cut=True)
    assert not tail.startswith("ial") and "\x1b" not in tail and "\x07" not in tail
    assert tail.splitlines()[-1] == "line 99" and len(tail.splitlines()) == 40


def test_a_stalls_stacks_are_shown_escaped_with_why_one_is_missing() -> None:
    doc = artifact()
    doc["stacks"] = {
        "processes": [
            {
                "pid": 7,
                "command": ["python", "train.py"],
                "stack": "    all_reduce (<c10d>.py:9)\n",
                "missing": None,
            },
            {"pid": 8, "command": ["sh"], "stack": None, "missing": "not a Python process"},
        ]
    }
    text = page(doc)
    assert "<h2>Python stacks at the stall</h2>" in text
    assert "all_reduce (&lt;c10d&gt;.py:9)" in text and "no stack: not a Python process" in text
    doc["stacks"] = {"missing": "the launcher wrote no stacks.json"}
    assert "none: the launcher wrote no stacks.json" in page(doc)
    assert "Python stacks" not in page(artifact())


def test_a_malformed_stacks_entry_is_named() -> None:
    doc = artifact()
    doc["stacks"] = {"processes": [{"pid": "7", "command": []}]}
    with pytest.raises(ConfigError, match=r"stacks.processes\[0\].pid"):
        page(doc)


def test_a_provisional_artifact_is_marked_partial_with_how_far_its_evidence_goes() -> None:
    doc = {**artifact(), "status": "stopping", "exit_code": None, "failure_reason": "the sidecar got SIGTERM"}
    doc["lost_attempts"] = [
        {
            "attempt": 1,
            "status": "running",
            "reason": None,
            "last_evidence_at_utc": "2023-11-14T22:15:00Z",
            "evidence": "s3://soaks/run/1-a/provisional-0001.json",
        }
    ]
    parsed = parse_artifact(json.dumps(doc).encode(), "provisional-0002.json")
    assert parsed.partial
    page = render_report(replace(parsed, last_evidence_unix=T0 + 90), [])
    assert "PARTIAL: no verdict (last evidence at 2023-11-14T22:14:50Z)" in page
    assert '<span class="stopping">STOPPING</span>' in page
    assert (
        "attempt 1 ended without a verdict (last evidence at 2023-11-14T22:15:00Z): "
        "s3://soaks/run/1-a/provisional-0001.json" in page
    )
    final = render_report(parse_artifact(json.dumps(artifact()).encode(), "artifact.json"), [])
    assert "PARTIAL" not in final and "ended without a verdict" not in final


def test_a_malformed_lost_attempt_is_one_usage_error() -> None:
    doc = {**artifact(), "lost_attempts": [{"attempt": "one", "status": "running", "evidence": "x"}]}
    with pytest.raises(ConfigError, match=r"lost_attempts\[0\]\.attempt"):
        parse_artifact(json.dumps(doc).encode(), "artifact.json")


def test_the_page_says_where_the_attempts_time_went() -> None:
    doc = {
        **artifact(),
        "phases": {
            "phases": [
                {"kind": "launcher", "start_unix": T0, "seconds": 3.0},
                {"kind": "productive", "start_unix": T0 + 3, "seconds": 90.0},
                {"kind": "lost_work", "start_unix": T0 + 93, "seconds": 7.0},
            ],
            "lost_work_known": True,
            "checkpoint": {"step": 1200, "seen_at_unix": T0 + 93, "records_seen": 4},
        },
    }
    page = render_report(parse_artifact(json.dumps(doc).encode(), "artifact.json"), [])
    assert "<h2>Where the time went</h2>" in page and "lost work" in page and "90%" in page
    assert "last checkpoint reported: step 1200" in page
    unknown = {**doc, "phases": {"phases": doc["phases"]["phases"][:2], "lost_work_known": False}}
    page = render_report(parse_artifact(json.dumps(unknown).encode(), "artifact.json"), [])
    assert "no checkpoint reported: the work lost is not known" in page
    assert "Where the time went" not in render_report(
        parse_artifact(json.dumps(artifact()).encode(), "a"), []
    )


def test_a_runs_page_escapes_what_artifacts_say_and_sums_the_budget() -> None:
    hostile = "<script>alert(1)</script>"
    doc = {
        **artifact(),
        "status": "failed",
        "failure_classification": hostile,
        "context": {"run_id": "r", "attempt": 1},
        "deadline": {"deadline_unix": T0 + 200, "started_unix": T0},
        "phases": {
            "phases": [
                {"kind": "launcher", "start_unix": T0, "seconds": 10.0},
                {"kind": "productive", "start_unix": T0 + 10, "seconds": 80.0},
                {"kind": "teardown", "start_unix": T0 + 90, "seconds": 10.0},
            ],
            "lost_work_known": False,
        },
    }
    attempt = RunAttempt('a"><b>', parse_artifact(json.dumps(doc).encode(), "a"), 'a"><b>/report.html')
    page = render_run_report(hostile, [attempt])
    assert "<script>" not in page and "<b>" not in page
    assert "productive 0:01:20; goodput 80.0%" in page


def test_a_runs_page_shows_the_attempts_only_its_ledger_lists() -> None:
    """An attempt that ended without a verdict has no artifact: the ledger's entry puts it in the
    table and on the time line (a dashed span, no phase guessed), its time charged to that end."""
    doc = {
        **artifact(),
        "status": "passed",
        "context": {"run_id": "r", "attempt": 2},
        "deadline": {"deadline_unix": T0 + 900, "started_unix": T0},
        "phases": {"phases": [{"kind": "productive", "start_unix": T0 + 100, "seconds": 100.0}]},
    }
    attempt = RunAttempt("attempt-2", parse_artifact(json.dumps(doc).encode(), "a"), "attempt-2/report.html")
    lost = LedgerEntry(1, None, LOST, None, T0, T0 + 60, (), artifact="s3://b/<i>/provisional-0001.json")
    ledger = Ledger("r", T0, (lost,))
    page = render_run_report("r", [attempt], ledger)
    assert "no verdict" in page and "ledger: s3://b/&lt;i&gt;/provisional-0001.json" in page
    assert 'stroke-dasharray="4 2"><title>ended without a verdict: 0:01:00' in page
    assert "goodput 50.0%" in page  # 100 s productive of the 200 s since the deadline's start
    same = LedgerEntry(2, None, "passed", None, T0 + 100, T0 + 200, ())
    assert "ledger:" not in render_run_report(
        "r", [attempt], Ledger("r", T0, (same,))
    )  # its artifact is here


def test_evidence_that_does_not_match_its_artifact_is_marked_on_both_pages() -> None:
    digest = "ab" * 32
    doc = {
        **artifact(),
        "samples": {"samples_file": "samples.jsonl.gz", "samples_sha256": digest.upper()},
        "upload": {
            "sha256": {"console.log": "cd" * 32, "bad": "not a digest"},
            "segments": [{"name": "samples.jsonl.gz.seg-000001", "sha256": "ef" * 32}],
            "checksums_unverified": True,
        },
    }
    found = parse_artifact(json.dumps(doc).encode(), "a")
    assert found.sha256_of("samples.jsonl.gz") == digest  # recorded digests compare in lower case
    assert found.sha256_of("samples.jsonl.gz.seg-000001") == "ef" * 32
    assert found.sha256_of("bad") is None and found.checksums_unverified
    line = "s3://b/k/samples.jsonl.gz does not match the SHA-256 its artifact recorded"
    page = render_report(found, [], None, lambda: [line])
    assert f"EVIDENCE NOT MATCHING: {line}" in page and "uploads unverified" in page
    assert "EVIDENCE NOT MATCHING" not in render_report(found, [], None)
    marked = RunAttempt("attempt-1", found, "attempt-1/report.html", evidence_mismatched=True)
    assert "failed (evidence not matching)" in render_run_report("r", [marked])


def test_a_trainer_that_writes_progress_records_gets_its_steps_and_throughput_drawn() -> None:
    doc = parse_artifact(json.dumps(artifact()).encode(), "a")
    plain = [ReportSample(T0 + t, 1024.0, (), 2.0, 0.0, (), 10.0 * t) for t in range(0, 100, 5)]
    stepped = [replace(sample, step=float(2 * n)) for n, sample in enumerate(plain)]
    page = render_report(doc, stepped)
    assert "Training step (progress records)" in page and "Throughput" in page and "steps/s" in page
    without = render_report(doc, plain)
    assert "Training step" not in without and "Throughput" not in without
    assert parse_sample(json.dumps({"t_wall": T0, "progress": {"step": 7}}).encode()).step == 7.0
    with pytest.raises(ConfigError, match=r"progress\.step"):
        parse_sample(json.dumps({"t_wall": T0, "progress": {"step": -1}}).encode())


def test_the_step_time_and_the_samples_and_tokens_per_second_between_samples() -> None:
    base = ReportSample(T0, 1024.0, (), 2.0, 0.0, (), 10.0)
    # Every 5 s: 10 steps, 320 samples; tokens only from the third sample on; the count goes back once.
    steps = [0.0, 10.0, 20.0, 30.0, 5.0, 15.0]
    fed = [
        replace(base, t_wall=T0 + 5 * n, step=step, samples=32 * step, tokens=None if n < 2 else 1000.0 * n)
        for n, step in enumerate(steps)
    ]
    plots = ProgressPlots()
    for sample in fed:
        plots.add(sample.t_wall, sample)
    drawn = {plot.title: plot.series for plot in plots.plots()}
    assert list(drawn) == [
        "Training step (progress records)",
        "Throughput",
        "Step time",
        "Samples per second",
        "Tokens per second",
    ]
    # No rate across the count that went back (30 -> 5).
    assert [v for _, v in drawn["Throughput"]["steps/s"]] == [2.0, 2.0, 2.0, 2.0]
    assert [v for _, v in drawn["Step time"]["s/step"]] == [0.5, 0.5, 0.5, 0.5]
    assert [v for _, v in drawn["Samples per second"]["samples/s"]] == [64.0] * 4
    assert [v for _, v in drawn["Tokens per second"]["tokens/s"]] == [200.0, 200.0]
    # 15 s steps sampled every 5 s, the count going back at 25 s: timed from where each step was first seen.
    long_steps = ProgressPlots()
    for t, step in ((0, 1.0), (5, 1.0), (10, 1.0), (15, 2.0), (20, 2.0), (25, 0.0), (30, 0.0), (35, 1.0)):
        long_steps.add(T0 + t, replace(base, t_wall=T0 + t, step=step))
    timed = {plot.title: plot.series for plot in long_steps.plots()}["Step time"]["s/step"]
    assert timed == [(T0 + 15, 15.0), (T0 + 35, 10.0)]
    assert parse_sample(
        json.dumps({"t_wall": T0, "progress": {"step": 1, "samples": 32, "tokens": 9}}).encode()
    ) == (ReportSample(T0, 0.0, (), 0.0, 0.0, (), 0.0, step=1.0, samples=32.0, tokens=9.0))
