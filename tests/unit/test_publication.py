"""Pure publication rules: valid keys, bounded sanitised values, termination message, Event text."""

from __future__ import annotations

import json
import re
import unicodedata

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.core.errors import ConfigError
from sidecar.core.publication import (
    DEFAULT_PREFIX,
    ELLIPSIS,
    MAX_ANNOTATIONS_BYTES,
    MAX_EVENT_MESSAGE_BYTES,
    MAX_TERMINATION_MESSAGE_BYTES,
    REASON_BYTES,
    Publication,
    annotation_key,
    build_annotations,
    event_message,
    event_reason,
    event_type,
    normalize_prefix,
    parse_annotations,
    parse_termination_message,
    sanitize,
    termination_message,
    truncate_utf8,
)
from sidecar.core.running_annotations import build_progress_annotations

# Kubernetes' own rules (apimachinery validation): qualified name part and DNS-1123 subdomain.
K8S_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
K8S_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def valid_key(key: str) -> bool:
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not K8S_SUBDOMAIN.match(prefix)):
        return False
    return len(name) <= 63 and bool(K8S_NAME.match(name))


def total_bytes(annotations: dict[str, str | None]) -> int:
    return sum(len(k.encode()) + len((v or "").encode()) for k, v in annotations.items())


def pub(**overrides: object) -> Publication:
    fields: dict[str, object] = {
        "status": "failed",
        "classification": "stale_progress",
        "reason": "no progress for 120 s",
        "exit_code": 12,
        "artifact_uri": "s3://bucket/soak/ns/job/run/1-pod/artifact.json",
        "artifact_sha256": "ab" * 32,
        "attempt": 2,
        "deadline_unix": 1_900_000_000.7,
    }
    fields.update(overrides)
    return Publication(**fields)  # type: ignore[arg-type]


reasons = st.one_of(
    st.text(max_size=5000),
    st.binary(max_size=5000),
    st.text(alphabet=st.characters(codec=None), max_size=3000),
)


def test_round_trip_keeps_short_values_exactly() -> None:
    original = pub()
    annotations = build_annotations(original)
    assert annotations[f"{DEFAULT_PREFIX}verdict"] == "failed"
    assert annotations[f"{DEFAULT_PREFIX}deadline"] == "1900000000"
    back = parse_annotations({k: v for k, v in annotations.items() if v is not None})
    assert back == pub(deadline_unix=1_900_000_000.0)
    assert not back.passed
    assert pub(status="passed", exit_code=0).passed


def test_absent_fields_become_deletes_in_the_merge_patch() -> None:
    annotations = build_annotations(pub(artifact_uri=None, artifact_sha256=None, attempt=None))
    assert annotations["soak.sidecar.io/artifact"] is None
    assert annotations["soak.sidecar.io/attempt"] is None
    assert annotations["soak.sidecar.io/reason"] == "no progress for 120 s"


def test_non_finite_deadline_is_not_published() -> None:
    assert build_annotations(pub(deadline_unix=float("nan")))["soak.sidecar.io/deadline"] is None


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("soak.sidecar.io/", "soak.sidecar.io/"),
        ("example.com", "example.com/"),
        ("a-b.c1", "a-b.c1/"),
        ("", ""),
    ],
)
def test_prefix_normalised(prefix: str, expected: str) -> None:
    assert normalize_prefix(prefix) == expected


@pytest.mark.parametrize(
    "prefix", ["Upper.io/", "under_score.io", "-lead.io", "trail-.io", "a..b", "a/b/", "x" * 254]
)
def test_invalid_prefix_refused(prefix: str) -> None:
    with pytest.raises(ConfigError, match="DNS-1123"):
        normalize_prefix(prefix)


@pytest.mark.parametrize("name", ["", "-x", "x-", "a" * 64, "a/b", "sp ace"])
def test_invalid_names_refused(name: str) -> None:
    with pytest.raises(ConfigError):
        annotation_key(DEFAULT_PREFIX, name)


@settings(max_examples=150, deadline=None)
@given(
    reason=reasons,
    classification=st.one_of(st.none(), st.text(max_size=600)),
    status=st.text(min_size=1, max_size=300),
    uri=st.one_of(st.none(), st.text(max_size=4000)),
    prefix=st.sampled_from([DEFAULT_PREFIX, "", "a" * 63 + "." + "b" * 63 + "." + "c" * 63 + "/"]),
)
def test_any_input_gives_a_valid_bounded_patch(
    reason: str | bytes, classification: str | None, status: str, uri: str | None, prefix: str
) -> None:
    annotations = build_annotations(
        pub(reason=reason, classification=classification, status=status, artifact_uri=uri), prefix
    )
    progress = build_progress_annotations(status, 1.5e9, prefix)
    for key, value in {**annotations, **progress}.items():
        assert valid_key(key), key
        if value is not None:
            assert not CONTROL.search(value)
            value.encode("utf-8")  # strict: no lone surrogates survive
    body = json.dumps({"metadata": {"annotations": annotations}}, ensure_ascii=False)
    assert json.loads(body)["metadata"]["annotations"] == annotations
    assert total_bytes({**annotations, **progress}) <= MAX_ANNOTATIONS_BYTES
    if prefix == DEFAULT_PREFIX:
        assert total_bytes(annotations) <= 4096


@settings(max_examples=150, deadline=None)
@given(reason=reasons, uri=st.one_of(st.none(), st.text(max_size=3000)), cls=st.text(max_size=500))
def test_termination_message_and_event_always_fit(reason: str | bytes, uri: str | None, cls: str) -> None:
    p = pub(reason=reason, artifact_uri=uri, classification=cls)
    message = termination_message(p)
    assert len(message.encode("utf-8")) <= MAX_TERMINATION_MESSAGE_BYTES
    back = parse_termination_message(message)
    assert back is not None
    assert (back.status, back.exit_code, back.attempt) == ("failed", 12, 2)
    assert len(event_message(p).encode("utf-8")) <= MAX_EVENT_MESSAGE_BYTES
    assert not CONTROL.search(event_message(p))


def test_worst_case_json_escaping_still_fits_4096() -> None:
    # Quotes and backslashes double under JSON escaping; the message shrinks the free text.
    p = pub(reason='"\\' * 5000, artifact_uri='"' * 5000, classification='"' * 500)
    message = termination_message(p)
    assert len(message.encode("utf-8")) <= MAX_TERMINATION_MESSAGE_BYTES
    assert json.loads(message)["exit-code"] == "12"


def test_megabytes_of_hostile_reason() -> None:
    hostile = (b"\xff\xfe\x00\x1b[31mred\x1b[0m\r\n" + "é€😀".encode() + b"\x80") * 400_000
    assert len(hostile) > 8_000_000
    value = build_annotations(pub(reason=hostile))["soak.sidecar.io/reason"]
    assert value is not None
    assert len(value.encode("utf-8")) <= REASON_BYTES
    assert value.endswith(ELLIPSIS)
    assert "\ufffd" in value  # invalid bytes shown, not dropped silently
    assert "[31mred" in value and "\x1b" not in value


def test_surrogate_escaped_and_bidi_text_is_neutralised() -> None:
    text = b"bad \xff byte".decode("utf-8", "surrogateescape") + " \u202eevil\u2066 \u200b"
    assert sanitize(text, 100) == "bad byte evil"


# Invisible format characters (Unicode category Cf) a terminal shows as nothing or that reorder text.
FORMAT_CHARACTERS = {
    "tag characters (ASCII smuggling)": "".join(chr(0xE0000 + ord(c)) for c in " PASSED") + "\U000e007f",
    "tag U+E0001": "\U000e0001",
    "bidi marks": "\u200e\u200f\u061c",
    "bidi override": "\u202e",
    "bidi isolates": "\u2066\u2067\u2068\u2069",
    "zero width": "\u200b\u200c\u200d\u2060\ufeff",
    "soft hyphen": "\u00ad",
    "invisible operators": "\u2061\u2062\u2063\u2064",
    "Mongolian vowel separator": "\u180e",
}


@pytest.mark.parametrize("hidden", FORMAT_CHARACTERS.values(), ids=FORMAT_CHARACTERS.keys())
def test_every_format_character_is_taken_out(hidden: str) -> None:
    assert all(unicodedata.category(char) == "Cf" for char in hidden)
    assert sanitize(f"failed{hidden}: leak{hidden}", 100) == "failed : leak"


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet=st.characters(codec=None), max_size=200))
def test_nothing_invisible_or_unsafe_survives(text: str) -> None:
    assert not any(
        unicodedata.category(char) in {"Cc", "Cf", "Cs", "Zl", "Zp", "Cn"} for char in sanitize(text, 1000)
    )


def test_whitespace_collapsed_to_one_line() -> None:
    assert sanitize("a\n\n\tb   c\r\n", 100) == "a b c"


@pytest.mark.parametrize("limit", range(0, 12))
def test_truncation_never_splits_a_character(limit: int) -> None:
    cut = truncate_utf8("€€€€€", limit)
    assert len(cut.encode("utf-8")) <= limit
    cut.encode("utf-8")
    assert cut == "€€€€€" or cut.endswith(ELLIPSIS) or limit < len(ELLIPSIS.encode())


def test_event_reason_and_type() -> None:
    ok = pub(status="passed", exit_code=0, classification=None, reason="")
    assert (event_reason(ok), event_type(ok)) == ("SoakPassed", "Normal")
    assert (event_reason(pub()), event_type(pub())) == ("SoakFailed", "Warning")
    assert event_message(ok).startswith("soak passed (exit 0) attempt 2; artifact s3://")
    assert event_message(pub()).startswith(
        "soak failed (exit 12, stale_progress) attempt 2: no progress for 120 s"
    )


@pytest.mark.parametrize(
    "annotations",
    [
        None,
        {},
        {"soak.sidecar.io/verdict": "passed"},
        {"soak.sidecar.io/verdict": "passed", "soak.sidecar.io/exit-code": "zero"},
        {"other.io/verdict": "passed", "other.io/exit-code": "0"},
    ],
)
def test_no_verdict_read_from_incomplete_annotations(annotations: dict[str, str] | None) -> None:
    assert parse_annotations(annotations) is None


def test_hand_edited_attempt_reads_as_absent() -> None:
    back = parse_annotations(
        {
            "soak.sidecar.io/verdict": "passed",
            "soak.sidecar.io/exit-code": "0",
            "soak.sidecar.io/attempt": "x",
        }
    )
    assert back is not None and back.attempt is None and back.passed


@pytest.mark.parametrize("text", [None, "", "not json", "[1, 2]", '{"verdict": "passed"}'])
def test_foreign_termination_messages_are_ignored(text: str | None) -> None:
    assert parse_termination_message(text) is None


def test_the_runs_goodput_and_ledger_round_trip_and_nonsense_reads_as_absent() -> None:
    told = pub(goodput=0.87654, ledger_uri="s3://b/soak/ns/job/run/ledger.json")
    annotations = build_annotations(told)
    assert annotations[f"{DEFAULT_PREFIX}goodput"] == "0.8765"
    back = parse_annotations({k: v for k, v in annotations.items() if v is not None})
    assert back is not None and back.goodput == 0.8765 and back.ledger_uri == told.ledger_uri
    assert build_annotations(pub(goodput=float("nan")))[f"{DEFAULT_PREFIX}goodput"] is None
    for hand_edited in (
        "1.5",
        "-0.1",
        "-0",
        "nan",
        "x",
        "0." + "9" * 40,
        "\u0661",
        "\uff10.\uff15",
        "1_0e-1",
    ):
        edited = {**annotations, f"{DEFAULT_PREFIX}goodput": hand_edited}
        back = parse_annotations({k: v for k, v in edited.items() if v is not None})
        assert back is not None and back.goodput is None, hand_edited
