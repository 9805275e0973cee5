"""What the sidecar tells Kubernetes about a verdict (pure): annotations, Event, exit message.

Every value that reaches the API passes through :func:`sanitize`, so a reason of any size or
encoding (megabytes, control characters, invalid UTF-8) yields a valid merge patch whose
annotations stay within a few KiB: all annotations of an object share 256 KiB and a pod whose
annotations overflow can no longer be patched at all. The same map is read back by
``soak-sidecar verdict`` through :func:`parse_annotations`.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass

from sidecar.core.errors import ConfigError
from sidecar.launcher.protocol.names import TERMINATION_MESSAGE_BYTES

DEFAULT_PREFIX = "soak.sidecar.io/"

# Kubernetes limits: annotation name part, key prefix (a DNS-1123 subdomain), termination message.
MAX_NAME_LEN = 63
MAX_PREFIX_LEN = 253
MAX_TERMINATION_MESSAGE_BYTES = TERMINATION_MESSAGE_BYTES
# Events are shown one per line by kubectl; kubelet itself truncates its event messages to 1 KiB.
MAX_EVENT_MESSAGE_BYTES = 1024

# Per-value budgets in UTF-8 bytes. Their sum bounds the whole map (see MAX_ANNOTATIONS_BYTES).
REASON_BYTES = 1024
URI_BYTES = 1024
SHORT_BYTES = 128

ELLIPSIS = "\u2026"

_NAME_RE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_LABEL_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# What a terminal or a page must not be handed as text, by Unicode category: controls (C0, DEL,
# C1: escape sequences), format characters (bidi marks, overrides and isolates, zero-width ones,
# tag characters: invisible, or they reorder or hide what a reason says when `soak-sidecar verdict`
# prints it), lone surrogates, line and paragraph separators, and code points not yet assigned
# (a newer Unicode than Python's may make them format characters).
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp", "Cn"})
_SPACES_RE = re.compile(r"\s+")

# Annotation names (after the prefix) and the budget of each value.
KEY_BUDGETS: dict[str, int] = {
    "verdict": SHORT_BYTES,
    "classification": SHORT_BYTES,
    "reason": REASON_BYTES,
    "exit-code": SHORT_BYTES,
    "artifact": URI_BYTES,
    "artifact-sha256": SHORT_BYTES,
    "attempt": SHORT_BYTES,
    "deadline": SHORT_BYTES,
    "index": SHORT_BYTES,
    "indexes": SHORT_BYTES,
    # The run's goodput as the ledger says once this attempt is in it, and where the ledger is.
    "goodput": SHORT_BYTES,
    "ledger": URI_BYTES,
    # The attempt's mean steps per second (its progress records): what indexes are compared by.
    "steps-per-s": SHORT_BYTES,
}
PROGRESS_KEY_BUDGETS: dict[str, int] = {
    "phase": SHORT_BYTES,
    "heartbeat": SHORT_BYTES,
    # Where the attempt's provisional artifact is, and when its evidence last reached the store.
    "evidence": URI_BYTES,
    "evidence-at": SHORT_BYTES,
    # While it runs: the recent steps per second, and when the declared total is reached at it.
    "steps-per-s": SHORT_BYTES,
    "eta": SHORT_BYTES,
}

# Bound of keys plus values of the verdict and progress maps together, with the longest prefix.
MAX_ANNOTATIONS_BYTES = sum(
    MAX_PREFIX_LEN + 1 + len(name) + budget
    for name, budget in {**KEY_BUDGETS, **PROGRESS_KEY_BUDGETS}.items()
)


@dataclass(frozen=True)
class Publication:
    """The verdict fields that are published; the orchestrator builds it from its Verdict."""

    status: str
    classification: str | None
    reason: str | bytes
    exit_code: int
    artifact_uri: str | None = None
    artifact_sha256: str | None = None
    attempt: int | None = None
    deadline_unix: float | None = None
    # One pod of a multi-pod soak: its index, of how many (None for a single-pod soak).
    index: int | None = None
    indexes: int | None = None
    goodput: float | None = None  # 0..1
    ledger_uri: str | None = None
    steps_per_s: float | None = None

    @property
    def passed(self) -> bool:
        return self.status == "passed" and self.exit_code == 0


def normalize_prefix(prefix: str) -> str:
    """``example.com`` or ``example.com/`` -> ``example.com/``; ConfigError unless DNS-1123.

    The empty string is allowed: unprefixed keys are valid annotations.
    """
    if prefix == "":
        return ""
    domain = prefix[:-1] if prefix.endswith("/") else prefix
    labels = domain.split(".")
    if len(domain) > MAX_PREFIX_LEN or not all(
        len(label) <= 63 and _LABEL_RE.match(label) for label in labels
    ):
        raise ConfigError(
            f"annotation prefix {prefix[:80]!r} is not a DNS-1123 subdomain "
            "(lower-case alphanumerics, '-' and '.', at most 253 characters) followed by '/'"
        )
    return domain + "/"


def annotation_key(prefix: str, name: str) -> str:
    """A valid annotation key, or ConfigError."""
    if len(name) > MAX_NAME_LEN or not _NAME_RE.match(name):
        raise ConfigError(f"annotation name {name[:80]!r} is invalid (at most 63 characters, [-A-Za-z0-9_.])")
    return normalize_prefix(prefix) + name


def sanitize(value: str | bytes, max_bytes: int) -> str:
    """Printable one-line UTF-8 of at most ``max_bytes`` bytes, whatever ``value`` holds.

    Bytes are decoded leniently; controls, format characters and the other unsafe categories become
    a space, and runs of spaces one; truncation never splits a character and ends with an ellipsis
    so it is visible.
    """
    text = value.decode("utf-8", errors="replace") if isinstance(value, bytes) else value
    # Bound the work first, so a multi-megabyte reason costs only its first bytes.
    text = text[: max_bytes * 2 + 8]
    text = "".join(" " if unicodedata.category(char) in _UNSAFE_CATEGORIES else char for char in text)
    text = _SPACES_RE.sub(" ", text).strip()
    return truncate_utf8(text, max_bytes)


def truncate_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to ``max_bytes`` UTF-8 bytes on a character boundary, marked when cut."""
    raw = text.encode("utf-8", errors="replace")
    if len(raw) <= max_bytes:
        return text
    room = max_bytes - len(ELLIPSIS.encode("utf-8"))
    if room < 0:
        return raw[:max_bytes].decode("utf-8", errors="ignore")
    return raw[:room].decode("utf-8", errors="ignore") + ELLIPSIS


def unix_text(unix: float | None) -> str | None:
    """Whole seconds since the epoch, as the deadline and the ETA are published."""
    if unix is None or not math.isfinite(unix):
        return None
    return str(int(unix))


def _fields(pub: Publication) -> dict[str, str | bytes | None]:
    return {
        "verdict": pub.status,
        "classification": pub.classification,
        "reason": pub.reason,
        "exit-code": str(pub.exit_code),
        "artifact": pub.artifact_uri,
        "artifact-sha256": pub.artifact_sha256,
        "attempt": None if pub.attempt is None else str(pub.attempt),
        "deadline": unix_text(pub.deadline_unix),
        "index": None if pub.index is None else str(pub.index),
        "indexes": None if pub.indexes is None else str(pub.indexes),
        "goodput": _goodput_text(pub.goodput),
        "ledger": pub.ledger_uri,
        "steps-per-s": rate_text(pub.steps_per_s),
    }


def rate_text(per_s: float | None) -> str | None:
    return None if per_s is None or not (math.isfinite(per_s) and per_s > 0) else f"{per_s:.6g}"


_RATE = re.compile(r"[0-9]{1,12}(?:\.[0-9]{1,12})?(?:e[-+]?[0-9]{1,3})?")


def rate_or_none(text: str | None) -> float | None:
    """A rate as rate_text writes it (ASCII, finite, above zero); anything else reads as absent."""
    if text is None or not _RATE.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) and value > 0 else None


def _goodput_text(goodput: float | None) -> str | None:
    if goodput is None or not 0 <= goodput <= 1:
        return None
    return f"{goodput:.4f}"


_GOODPUT = re.compile(r"0(?:\.[0-9]{1,6})?|1(?:\.0{1,6})?")


def _goodput_or_none(text: str | None) -> float | None:
    """A ratio as _goodput_text writes it (ASCII digits, 0 to 1); anything else reads as absent."""
    return float(text) if text is not None and _GOODPUT.fullmatch(text) else None


def build_annotations(pub: Publication, prefix: str = DEFAULT_PREFIX) -> dict[str, str | None]:
    """The merge-patch annotation map for a verdict.

    Absent fields map to None, which a JSON merge patch turns into a delete, so a stale value
    from an earlier publication on the same pod (a restarted sidecar) never survives.
    """
    out: dict[str, str | None] = {}
    for name, value in _fields(pub).items():
        key = annotation_key(prefix, name)
        out[key] = None if value is None else sanitize(value, KEY_BUDGETS[name])
    return out


def parse_annotations(
    annotations: Mapping[str, str] | None, prefix: str = DEFAULT_PREFIX
) -> Publication | None:
    """The verdict published on a pod, or None when there is none (no verdict or exit-code key).

    Tolerant of hand-edited values: an unparsable number reads as absent, never raises.
    """
    if not annotations:
        return None
    base = normalize_prefix(prefix)

    def get(name: str) -> str | None:
        return annotations.get(base + name)

    status = get("verdict")
    exit_code = int_or_none(get("exit-code"))
    if status is None or exit_code is None:
        return None
    deadline = int_or_none(get("deadline"))
    return Publication(
        status=status,
        classification=get("classification"),
        reason=get("reason") or "",
        exit_code=exit_code,
        artifact_uri=get("artifact"),
        artifact_sha256=get("artifact-sha256"),
        attempt=int_or_none(get("attempt")),
        deadline_unix=None if deadline is None else float(deadline),
        index=int_or_none(get("index")),
        indexes=int_or_none(get("indexes")),
        goodput=_goodput_or_none(get("goodput")),
        ledger_uri=get("ledger"),
        steps_per_s=rate_or_none(get("steps-per-s")),
    )


def int_or_none(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text.strip())
    except ValueError:
        return None


def termination_message(pub: Publication) -> str:
    """One JSON line of at most 4096 UTF-8 bytes, so the verdict survives an API outage.

    Kubernetes keeps it in the container's terminated state; ``soak-sidecar verdict`` reads it
    back when the annotations never arrived.
    """
    reason_budget = REASON_BYTES
    uri_budget = URI_BYTES
    while True:
        payload = {
            name: (sanitize(value, _termination_budget(name, reason_budget, uri_budget)))
            for name, value in _fields(pub).items()
            if value is not None
        }
        text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
        if len(text.encode("utf-8")) <= MAX_TERMINATION_MESSAGE_BYTES:
            return text
        # JSON escaping can double a value's size; shrink the long free-text fields until it fits.
        reason_budget //= 2
        uri_budget //= 2


def _termination_budget(name: str, reason_budget: int, uri_budget: int) -> int:
    if name == "reason":
        return reason_budget
    if name in ("artifact", "ledger"):
        return uri_budget
    return KEY_BUDGETS[name]


def parse_termination_message(text: str | None) -> Publication | None:
    """The verdict inside a termination message written by :func:`termination_message`, or None."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    fields = {str(k): str(v) for k, v in data.items() if isinstance(v, str)}
    return parse_annotations(fields, prefix="")


VERDICT_EVENT_REASONS = ("SoakPassed", "SoakFailed")


def event_reason(pub: Publication) -> str:
    """The Event's machine-readable reason (UpperCamelCase, as kubectl shows them)."""
    return VERDICT_EVENT_REASONS[0] if pub.passed else VERDICT_EVENT_REASONS[1]


def event_type(pub: Publication) -> str:
    return "Normal" if pub.passed else "Warning"


def event_message(pub: Publication) -> str:
    """A one-line human summary of at most 1 KiB."""
    head = f"soak {sanitize(pub.status, SHORT_BYTES)} (exit {pub.exit_code}"
    if pub.classification:
        head += f", {sanitize(pub.classification, SHORT_BYTES)}"
    head += ")"
    if pub.attempt is not None:
        head += f" attempt {pub.attempt}"
    tail = f"; artifact {sanitize(pub.artifact_uri, URI_BYTES // 2)}" if pub.artifact_uri else ""
    room = MAX_EVENT_MESSAGE_BYTES - len(head.encode("utf-8")) - len(tail.encode("utf-8")) - 2
    reason = sanitize(pub.reason, max(room, 0))
    message = f"{head}: {reason}{tail}" if reason else head + tail
    return truncate_utf8(message, MAX_EVENT_MESSAGE_BYTES)
