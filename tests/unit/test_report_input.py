"""`soak-sidecar report` on any artifact and samples: a page, or one `soak-sidecar: error:` line with
exit 64, never another exception. Through the command's own entry point (`sidecar.cli.main`) on real
files: arbitrary JSON, the number tokens JSON forbids or Python cannot make a float of (NaN,
Infinity, 1e999, 10**400), nesting past the parser's stack, and mutations of a valid artifact and
valid samples (a leaf or a subtree replaced), which reach every field the report reads."""

from __future__ import annotations

import contextlib
import copy
import gzip
import io
import json
import tempfile
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ResponseStreamingError
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from sidecar.adapters.report_source import LINE_LIMIT, S3Source, open_local
from sidecar.cli import main
from sidecar.core.errors import SoakError
from sidecar.core.exitcodes import ExitCode
from sidecar.core.report_input import parse_artifact


class Raw(str):
    """A JSON token written as is: one json.dumps never writes (1e999, a 400-digit integer)."""

    def __repr__(self) -> str:  # a failing example stays readable: 100,000 brackets are not
        return super().__repr__() if len(self) <= 40 else f"<{len(self)} chars: {self[:12]}...{self[-12:]}>"


TOKENS = st.sampled_from(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "1e999",
        "-1e999",
        "1" + "0" * 400,
        "-" + "9" * 5000,  # over Python's digit limit for int()
        "1e308",
        "9223372036854775808",
        "-0.0",
    ]
).map(Raw)
DEEP = st.sampled_from([100, 990, 100_000]).map(lambda n: Raw("[" * n + "]" * n))
KEYS = [
    "status",
    "samples",
    "samples_file",
    "deadline",
    "deadline_unix",
    "post_shutdown",
    "launcher_exit",
    "stop_times_unix",
    "soft_stop",
    "term",
    "kill",
    "residual_processes",
    "pid",
    "fate",
    "command",
    "resource_summary",
    "trends",
    "series",
    "unit",
    "per_hour",
    "low_per_hour",
    "high_per_hour",
    "points",
    "run_summary_figures",
    "context",
    "run_id",
    "failure_classification",
    "failure_reason",
    "exit_code",
    "started_at_utc",
    "duration_s",
    "t_wall",
    "process",
    "rss_kib_total",
    "fd_classes_total",
    "process_count",
    "zombie_count",
    "gpu",
    "devices",
    "memory_used_mib",
    "clock_event_reasons",
    "index",
    "uuid",
    "progress",
    "bytes_total",
]
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
    st.sampled_from(["passed", "failed", "timeout/stale_tick", "samples.jsonl.gz"]),
    TOKENS,
    DEEP,
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.sampled_from(KEYS), st.text(max_size=4)), inner, max_size=5),
    ),
    max_leaves=16,
)

ARTIFACT: dict[str, Any] = {
    "status": "failed",
    "failure_classification": "timeout/stale_tick",
    "failure_reason": "no progress",
    "exit_code": 12,
    "started_at_utc": "2025-01-01T00:00:00Z",
    "duration_s": 30.5,
    "context": {"run_id": "r1"},
    "deadline": {"deadline_unix": 1_700_000_100.0},
    "samples": {"samples_file": "samples.jsonl.gz"},
    "post_shutdown": {
        "launcher_exit": {
            "stop_times_unix": {"soft_stop": 1_700_000_020.0, "term": 1_700_000_025, "kill": None}
        },
        "residual_processes": [{"pid": 7, "fate": "unreaped", "command": "worker"}],
    },
    "resource_summary": {
        "trends": [
            {
                "series": "rss",
                "unit": "KiB",
                "per_hour": 12.5,
                "low_per_hour": -1.0,
                "high_per_hour": 30.0,
                "points": 20,
            }
        ],
        "run_summary_figures": {"max_in_flight": 3, "replay_ingress_backpressure_wait_s": "nan"},
    },
}
SAMPLE: dict[str, Any] = {
    "t_wall": 1_700_000_000.0,
    "process": {
        "rss_kib_total": 2048,
        "fd_classes_total": {"pipe": 4},
        "process_count": 2,
        "zombie_count": 0,
    },
    "gpu": {
        "devices": [
            {
                "index": 0,
                "uuid": "GPU-0123456789abcdef",
                "memory_used_mib": 512.0,
                "clock_event_reasons": ["gpu_idle", "sw_thermal"],
            }
        ]
    },
    "progress": {"bytes_total": 100, "step": 3},
}


def encode(value: object) -> str:
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(k)}:{encode(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode(v) for v in value) + "]"
    return json.dumps(value)  # NaN and Infinity as the JavaScript constants


def paths(doc: object, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every position in ``doc``, containers included."""
    found = [prefix]
    if isinstance(doc, dict):
        found += [p for key, value in doc.items() for p in paths(value, (*prefix, key))]
    elif isinstance(doc, list):
        found += [p for index, value in enumerate(doc) for p in paths(value, (*prefix, index))]
    return found


@st.composite
def mutated(draw: st.DrawFn, valid: dict[str, Any]) -> object:
    """``valid`` with one to three positions replaced by arbitrary values, or deleted."""
    doc: Any = copy.deepcopy(valid)
    for _ in range(draw(st.integers(1, 3))):
        where = draw(st.sampled_from(paths(doc)))
        if not where:
            return draw(values)
        parent = doc
        for step in where[:-1]:
            parent = parent[step]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[where[-1]]
        else:
            parent[where[-1]] = draw(values)
    return doc


artifacts = st.one_of(mutated(ARTIFACT), mutated(ARTIFACT), values)
samples = st.one_of(st.just(SAMPLE), mutated(SAMPLE), values)


def report(artifact: str, lines: list[str]) -> tuple[int, str, str]:
    """Exit code and stderr of `soak-sidecar report DIR -o PAGE`, and the page ("" if none)."""
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        (directory / "artifact.json").write_text(artifact, encoding="utf-8")
        samples = "".join(f"{line}\n" for line in lines).encode()
        (directory / "samples.jsonl.gz").write_bytes(gzip.compress(samples))
        page = directory / "page.html"
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            code = main(["report", str(directory), "-o", str(page)])
        return code, err.getvalue(), page.read_text(encoding="utf-8") if page.exists() else ""


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(artifact=artifacts, lines=st.lists(samples, max_size=5))
@example(artifact=ARTIFACT, lines=[SAMPLE])
@example(artifact={**ARTIFACT, "deadline": {"deadline_unix": Raw("1" + "0" * 400)}}, lines=[])
@example(artifact={**ARTIFACT, "context": Raw("[" * 100_000 + "]" * 100_000)}, lines=[])
def test_any_artifact_gives_a_page_or_one_usage_error_line(artifact: object, lines: list[object]) -> None:
    code, err, page = report(encode(artifact), [encode(line) for line in lines])
    assert err.count("\n") == 1, err
    if code == 0:
        assert page.startswith("<!DOCTYPE html>") and err.startswith("soak-sidecar: report "), err
    else:
        assert code == ExitCode.USAGE and err.startswith("soak-sidecar: error: "), err


def test_the_valid_documents_give_a_page_with_every_series_and_mark() -> None:
    lines = [encode({**SAMPLE, "t_wall": SAMPLE["t_wall"] + 10 * n}) for n in range(4)]
    code, err, page = report(encode(ARTIFACT), lines)
    assert code == 0 and "skipped" not in err, err
    assert 'data-series="GPU 0 GPU-01234567"' in page and ">stall (timeout/stale_tick)<" in page
    assert 'data-reason="sw_thermal"' in page
    assert ">soft stop<" in page and ">TERM<" in page


def test_a_sample_the_report_cannot_draw_is_skipped_and_counted() -> None:
    bad = [
        encode({**SAMPLE, "t_wall": Raw(token)})
        for token in ("NaN", "Infinity", "1e999", "1" + "0" * 400, '"soon"', "[1]")
    ]
    deep = encode({**SAMPLE, "process": Raw("[" * 100_000 + "]" * 100_000)})
    listed = encode({**SAMPLE, "process": [SAMPLE["process"]]})
    code, err, _ = report(encode(ARTIFACT), [encode(SAMPLE), *bad, deep, listed])
    assert code == 0 and "(8 unreadable sample lines skipped)" in err, err


class BrokenStream(io.BytesIO):
    """An S3 body whose connection drops after the first bytes."""

    def read(self, size: int | None = -1) -> bytes:
        if self.tell() >= 100:
            raise ResponseStreamingError(error="connection reset")
        return super().read(min(100 - self.tell(), size if size is not None and size >= 0 else 100))


class OneObject:
    def get_object(self, **_: object) -> dict[str, object]:
        return {"Body": BrokenStream(gzip.compress((encode(SAMPLE) + "\n").encode() * 1000))}


def test_a_broken_s3_stream_is_the_sidecars_own_error() -> None:
    artifact = parse_artifact(encode(ARTIFACT).encode(), "s3://b/k/artifact.json")
    source = S3Source(artifact, client=OneObject(), bucket="b", prefix="k/")
    with pytest.raises(SoakError, match=r"cannot read s3://b/k/samples.jsonl.gz: .*connection reset"):
        list(source.samples())


def test_an_endless_sample_line_is_skipped_within_the_line_bound(tmp_path: Path) -> None:
    (tmp_path / "artifact.json").write_text(encode(ARTIFACT), encoding="utf-8")
    with gzip.open(tmp_path / "samples.jsonl.gz", "wb") as samples:
        samples.write(b'{"t_wall": 1700000000, "x": "')
        for _ in range(16 * LINE_LIMIT // (1024 * 1024)):  # 64 MiB in one line, written a MiB at a time
            samples.write(b"y" * 1024 * 1024)
        samples.write(b'"}\n' + encode(SAMPLE).encode() + b"\n")
    source = open_local(tmp_path)
    tracemalloc.start()
    try:
        read = list(source.samples())
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(read) == 1 and source.skipped_lines == 1
    assert peak < 4 * LINE_LIMIT, f"{peak / 2**20:.0f} MiB held for a {16 * LINE_LIMIT / 2**20:.0f} MiB line"
