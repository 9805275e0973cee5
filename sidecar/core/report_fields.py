"""Fields of a JSON document the report reads (pure): each checked for its type and bound, a
ConfigError naming where and what was found otherwise."""

from __future__ import annotations

from collections.abc import Mapping

from sidecar.core.errors import ConfigError

# Every number the report uses lies within this bound (10**400 or 1e999 do not): the plots' scaling
# and the labels' formatting stay finite. Times, counts, bytes and MiB are also never negative.
MAX_NUMBER = 2.0**63


def as_object(value: object, where: str) -> Mapping[str, object]:
    """An optional object: absent or null reads as empty."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where} must be an object, got {got(value)}")
    return value


def as_list(value: object, where: str) -> list[object]:
    """An optional list: absent or null reads as empty."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ConfigError(f"{where} must be a list, got {got(value)}")
    return value


def number(value: object, where: str, *, low: float = 0.0) -> float:
    # A bool is no number here. Comparing is exact for ints of any size, and NaN compares false.
    if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= MAX_NUMBER:
        return float(value)
    raise ConfigError(f"{where} must be a number from {low:g} to {MAX_NUMBER:g}, got {got(value)}")


def optional_number(value: object, where: str) -> float | None:
    return None if value is None else number(value, where)


def integer(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or abs(value) > MAX_NUMBER:
        raise ConfigError(f"{where} must be an integer within {MAX_NUMBER:g}, got {got(value)}")
    return value


def text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"{where} must be text, got {got(value)}")
    return value


def optional_text(value: object, where: str) -> str | None:
    return None if value is None else text(value, where)


def console_file(path: object) -> str | None:
    """The name of the console log's copy in the attempt's directory (the artifact holds the path it
    had on the node); None when there is none or the name could leave that directory."""
    name = optional_text(path, "console_log")
    base = None if name is None else name.rsplit("/", 1)[-1]
    return base if base and not base.startswith(".") else None


def samples_file(name: object) -> str | None:
    """None for an attempt without samples (refused or unable to start: the trainer never ran)."""
    if name is None:
        return None
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise ConfigError(f"samples.samples_file must be a file name beside the artifact, got {got(name)}")
    return name


def clip(text: str) -> str:
    return text if len(text) <= 80 else f"{text[:77]}..."


def got(value: object) -> str:
    """A value as an error shows it: short, and never a walk of a deeply nested one."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return repr(clip(value))
    return clip(repr(value))


def recorded_sha256(doc: Mapping[str, object]) -> tuple[tuple[str, str], ...]:
    """Object name -> SHA-256 hex, as the artifact recorded them (bad entries are left out: they
    verify nothing, and the rest of the report stands)."""
    upload = as_object(doc.get("upload"), "upload")
    found: dict[str, str] = {}
    samples = as_object(doc.get("samples"), "samples")
    if isinstance(samples.get("samples_file"), str) and isinstance(samples.get("samples_sha256"), str):
        found[str(samples["samples_file"])] = str(samples["samples_sha256"])
    for name, digest in as_object(upload.get("sha256"), "upload.sha256").items():
        if isinstance(digest, str):
            found[name] = digest
    for n, item in enumerate(as_list(upload.get("segments"), "upload.segments")):
        segment = as_object(item, f"upload.segments[{n}]")
        if isinstance(segment.get("name"), str) and isinstance(segment.get("sha256"), str):
            found[str(segment["name"])] = str(segment["sha256"])
    return tuple(sorted((name, digest.lower()) for name, digest in found.items() if _is_sha256(digest)))


def _is_sha256(digest: str) -> bool:
    return len(digest) == 64 and all(c in "0123456789abcdefABCDEF" for c in digest)
