"""Key template rendering and validation (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sidecar.core.errors import ConfigError
from sidecar.core.keys import (
    MAX_KEY_BYTES,
    object_key,
    render_key_prefix,
    sanitize_value,
    template_fields,
    validate_key,
)
from sidecar.settings import S3Settings, load_settings

# The template the settings default to.
DEFAULT_KEY_TEMPLATE: str = S3Settings.model_fields["key_template"].default
RUN = "6f1c2d3e-0000-4000-8000-000000000001"


def test_default_template_in_pod_mode() -> None:
    values: dict[str, str | int] = {
        "prefix": "soak",
        "run_id": RUN,
        "attempt": 3,
        "namespace": "ml-team",
        "job": "soak-llm",
        "pod": "soak-llm-abcde",
    }
    assert render_key_prefix(DEFAULT_KEY_TEMPLATE, values) == (
        f"soak/ml-team/soak-llm/{RUN}/3-soak-llm-abcde/"
    )


def test_prefix_may_nest_and_trailing_slash_is_added() -> None:
    key = render_key_prefix("{prefix}/{run_id}", {"prefix": "a/b", "run_id": "r"})
    assert key == "a/b/r/"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("../../etc", "..-..-etc"),
        ("a/b", "a-b"),
        ("x\\y", "x-y"),
        ("name with spaces", "name-with-spaces"),
        ("ünïcode", "n-code"),
        ("tab\there", "tab-here"),
        (7, "7"),
    ],
)
def test_values_are_squeezed_into_one_safe_segment(value: str | int, expected: str) -> None:
    assert sanitize_value("job", value) == expected


@pytest.mark.parametrize("value", ["", "..", ".", "///", "\x00", "-"])
def test_values_empty_or_dots_after_sanitising_are_refused(value: str) -> None:
    with pytest.raises(ConfigError, match=r"\{job\}"):
        sanitize_value("job", value)


@given(st.text())
def test_any_value_renders_to_a_valid_key_or_a_config_error(value: str) -> None:
    values = {name: value for name in ("run_id", "attempt", "namespace", "job", "pod")}
    values["prefix"] = "soak"
    try:
        key = render_key_prefix(DEFAULT_KEY_TEMPLATE, values)
    except ConfigError:
        return
    assert key.startswith("soak/") and key.endswith("/")
    assert key.count("/") == 5  # values never add segments
    validate_key(key, allow_trailing_slash=True)


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ("{prefix}/{user}/", "unknown placeholder"),
        ("{prefix}/{run_id!r}/", "bare name"),
        ("{prefix}/{attempt:03d}/", "bare name"),
        ("{prefix}/{run_id.hex}/", "unknown placeholder"),
        ("{prefix}/{", "malformed"),
    ],
)
def test_bad_templates_are_refused(template: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        template_fields(template)


def test_missing_value_is_refused() -> None:
    with pytest.raises(ConfigError, match="no value for run_id"):
        render_key_prefix("{prefix}/{run_id}/", {"prefix": "soak"})


@pytest.mark.parametrize(
    ("template", "prefix", "message"),
    [
        ("/{prefix}/{run_id}/", "soak", "starts with '/'"),
        ("{prefix}//{run_id}/", "soak", "empty"),
        ("{prefix}/../{run_id}/", "soak", r"'\.\.'"),
        ("{prefix}/./{run_id}/", "soak", r"'\.'"),
        ("{prefix}\\{run_id}/", "soak", "backslash"),
        ("{prefix}/\x01/{run_id}/", "soak", "control character"),
        ("{prefix}/\ud800/{run_id}/", "soak", "not valid UTF-8"),
        ("{prefix}/{run_id}/", "/abs", "starts with '/'"),
        ("{prefix}/{run_id}/", "a/../b", r"'\.\.'"),
        ("{prefix}/{run_id}/", "a//b", "empty"),
        ("{prefix}/{run_id}/", "a b", "outside"),
        ("{prefix}/{run_id}/" + "x" * MAX_KEY_BYTES, "soak", "more than"),
    ],
)
def test_rendered_keys_that_could_escape_or_break_are_refused(
    template: str, prefix: str, message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        render_key_prefix(template, {"prefix": prefix, "run_id": "r"})


def test_key_length_counts_utf8_bytes() -> None:
    # 512 two-byte characters are 1024 bytes: at the limit, but outside the safe charset.
    with pytest.raises(ConfigError, match="more than"):
        validate_key("é" * 513)
    validate_key("a" * MAX_KEY_BYTES)
    with pytest.raises(ConfigError, match="more than"):
        validate_key("a" * (MAX_KEY_BYTES + 1))


def test_object_key_joins_a_bare_file_name() -> None:
    assert object_key("soak/x/", "artifact.json") == "soak/x/artifact.json"
    with pytest.raises(ConfigError, match="must not contain '/'"):
        object_key("soak/x/", "../artifact.json")
    with pytest.raises(ConfigError, match="must end with '/'"):
        object_key("soak/x", "artifact.json")
    with pytest.raises(ConfigError, match=r"'\.\.'"):
        object_key("soak/x/", "..")


def test_settings_refuse_a_bad_template_or_prefix() -> None:
    with pytest.raises(ConfigError, match="unknown placeholder"):
        load_settings({"s3.key_template": "{prefix}/{nope}/"})
    with pytest.raises(ConfigError, match="starts with '/'"):
        load_settings({"s3.prefix": "/soak"})
    with pytest.raises(ConfigError, match=r"half of s3\.lock_lease_s"):
        load_settings({"s3.lock_lease_s": 10, "s3.lock_renew_interval_s": 6})
