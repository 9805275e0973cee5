"""Object-key rendering and validation for the S3 artifact sink and deadline store (pure).

Identity values (namespace, job, run id, attempt, pod) come from the pod and may contain
anything, so they are squeezed into a safe charset and can never add a key segment. The
template and the prefix are operator configuration: they are validated, not rewritten, so a
typo fails loudly instead of writing somewhere unexpected.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from string import Formatter

from sidecar.core.errors import ConfigError

PLACEHOLDERS = frozenset({"prefix", "namespace", "job", "run_id", "attempt", "pod"})
# S3's hard limit on key length, in UTF-8 bytes.
MAX_KEY_BYTES = 1024
# Longest sanitised identity value; keeps one odd label from eating the key budget.
MAX_VALUE_CHARS = 128

_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")
# AWS's "safe characters" for keys; anything else needs escaping somewhere downstream.
_SEGMENT_OK = re.compile(r"[A-Za-z0-9._!*'()-]+")


def sanitize_value(name: str, value: str | int) -> str:
    """One identity value as a single safe key segment (``[A-Za-z0-9._-]``).

    Runs of other characters (``/`` included) become one ``-``. A value that is empty or only
    dots afterwards is refused: it would vanish or mean a relative path.
    """
    text = str(value)
    cleaned = _UNSAFE_RUN.sub("-", text).strip("-")[:MAX_VALUE_CHARS]
    if not cleaned.strip("."):
        raise ConfigError(f"key value {{{name}}}={text!r} is empty or only dots after sanitising")
    return cleaned


def template_fields(template: str) -> list[str]:
    """The placeholder names of ``template``; anything but a bare known name is refused."""
    try:
        parsed = list(Formatter().parse(template))
    except ValueError as exc:
        raise ConfigError(f"key template {template!r} is malformed: {exc}") from exc
    fields: list[str] = []
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        if field not in PLACEHOLDERS:
            known = ", ".join(sorted(PLACEHOLDERS))
            raise ConfigError(f"key template {template!r}: unknown placeholder {{{field}}} (known: {known})")
        if spec or conversion:
            raise ConfigError(f"key template {template!r}: {{{field}}} must be a bare name")
        fields.append(field)
    return fields


def validate_key(key: str, *, allow_trailing_slash: bool = False) -> str:
    """Refuse keys that could escape their prefix or that S3 stores would mangle.

    Rejected: empty, leading ``/``, empty / ``.`` / ``..`` segments, backslashes, control
    characters, text that is not valid UTF-8 (lone surrogates), more than 1024 bytes.
    """
    if not key:
        raise ConfigError("object key is empty")
    try:
        size = len(key.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigError(f"object key {key!r} is not valid UTF-8") from exc
    if size > MAX_KEY_BYTES:
        raise ConfigError(f"object key is {size} bytes, more than S3's {MAX_KEY_BYTES}")
    if key.startswith("/"):
        raise ConfigError(f"object key {key!r} starts with '/'")
    if "\\" in key:
        raise ConfigError(f"object key {key!r} contains a backslash")
    if any(ord(ch) < 0x20 or 0x7F <= ord(ch) < 0xA0 for ch in key):
        raise ConfigError(f"object key {key!r} contains a control character")
    body = key[:-1] if allow_trailing_slash and key.endswith("/") else key
    for segment in body.split("/"):
        if segment in ("", ".", ".."):
            raise ConfigError(f"object key {key!r} has an empty, '.' or '..' segment")
        if not _SEGMENT_OK.fullmatch(segment):
            raise ConfigError(
                f"object key {key!r}: segment {segment!r} has characters outside A-Za-z0-9!-_.*'()"
            )
    return key


def render_key_prefix(template: str, values: Mapping[str, str | int]) -> str:
    """Render the artifact key prefix; always ends with ``/``.

    ``values`` must name every placeholder the template uses. ``prefix`` may contain ``/``
    (it is validated as key segments); every other value is sanitised into one segment.
    """
    fields = template_fields(template)
    missing = sorted(set(fields) - set(values))
    if missing:
        raise ConfigError(f"key template {template!r}: no value for {', '.join(missing)}")
    rendered: dict[str, str] = {}
    for name in set(fields):
        value = values[name]
        if name == "prefix":
            rendered[name] = validate_key(str(value))
        else:
            rendered[name] = sanitize_value(name, value)
    key = template.format_map(rendered)
    if not key.endswith("/"):
        key += "/"
    return validate_key(key, allow_trailing_slash=True)


def object_key(key_prefix: str, name: str) -> str:
    """The key of one file (``name`` is a bare file name) under a rendered prefix."""
    validate_key(key_prefix, allow_trailing_slash=True)
    if not key_prefix.endswith("/"):
        raise ConfigError(f"key prefix {key_prefix!r} must end with '/'")
    if "/" in name:
        raise ConfigError(f"file name {name!r} must not contain '/'")
    return validate_key(key_prefix + name)
