"""Run identity: UUID run ids, validation, canonical JSON and digest stability."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from sidecar.core.errors import ConfigError
from sidecar.core.identity import (
    RunIdentity,
    is_canonical_absolute,
    make_identity,
    new_run_id,
    parse_run_id,
    redacted_command,
    sha256_hex,
)
from sidecar.core.redaction import DEFAULT_RULES

RUN_ID = "0b6f1c52-8d0e-4a53-9d1c-3f2b1a7e9c10"
HEX = "a" * 64


def fields(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "run_id": RUN_ID,
        "command": ("python3", "train.py", "--steps", "100"),
        "budget_s": 7200,
        "checkpoint_margin_s": 120,
        "deadline_store": "/var/soak/deadlines",
        "dataset_manifest_sha256": HEX,
        "code_sha256": {"train.py": "b" * 64, "core.py": "c" * 64},
        "image_digest": "registry.example/train@sha256:" + "d" * 64,
        "resume_checkpoint_path": "/ckpt/run/latest.pt",
    }
    base.update(overrides)
    return base


def test_new_run_id_is_canonical_uuid4() -> None:
    run_id = new_run_id()
    assert parse_run_id(run_id) == run_id
    assert uuid.UUID(run_id).version == 4
    assert new_run_id() != run_id


def test_parse_run_id_canonicalises_case_and_braces() -> None:
    assert parse_run_id(RUN_ID.upper()) == RUN_ID
    assert parse_run_id("{" + RUN_ID + "}") == RUN_ID


@pytest.mark.parametrize("bad", ["", "run-1", "0b6f1c52-8d0e-4a53-9d1c", None, 12, b"x"])
def test_parse_run_id_rejects_non_uuids(bad: object) -> None:
    with pytest.raises(ConfigError, match="run id must be a UUID"):
        parse_run_id(bad)


def test_sha256_hex() -> None:
    assert sha256_hex(b"") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_digest_is_stable_across_int_float_and_key_order() -> None:
    one = make_identity(**fields())
    two = make_identity(**fields(budget_s=7200.0, checkpoint_margin_s=120.0, command=list(one.command)))
    reordered = RunIdentity.model_validate(json.loads(json.dumps(one.canonical(), sort_keys=False)))
    assert one.digest() == two.digest() == reordered.digest()
    assert one.canonical_json() == two.canonical_json()
    assert json.loads(one.canonical_json()) == one.canonical()


def test_every_field_changes_the_digest() -> None:
    base = make_identity(**fields())
    changes: dict[str, Any] = {
        "run_id": "1b6f1c52-8d0e-4a53-9d1c-3f2b1a7e9c10",
        "command": ("python3", "train.py", "--steps", "101"),
        "command_sha256": "c" * 64,
        "budget_s": 7199,
        "checkpoint_margin_s": 121,
        "deadline_store": "/other",
        "dataset_manifest_sha256": "e" * 64,
        "code_sha256": {"train.py": "b" * 64},
        "image_digest": None,
        "resume_checkpoint_path": None,
    }
    assert set(changes) == set(RunIdentity.model_fields)
    for name, value in changes.items():
        other = make_identity(**fields(**{name: value}))
        assert other.digest() != base.digest(), name
        assert base.differences(other) == [name]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"run_id": "not-a-uuid"}, "run id must be a UUID"),
        ({"command": ()}, "missing command"),
        ({"command": ("",)}, "missing command"),
        ({"budget_s": True}, "budget_s"),
        ({"budget_s": float("nan")}, "budget_s"),
        ({"budget_s": float("inf")}, "budget_s"),
        ({"budget_s": 0}, "budget_s"),
        ({"checkpoint_margin_s": -1}, "checkpoint_margin_s"),
        ({"checkpoint_margin_s": 7200}, "smaller than budget_s"),
        ({"budget_s": "7200"}, "budget_s"),
        ({"deadline_store": ""}, "deadline_store"),
        ({"dataset_manifest_sha256": "A" * 64}, "dataset_manifest_sha256"),
        ({"code_sha256": {"train.py": "xyz"}}, "code_sha256"),
        ({"code_sha256": {"": HEX}}, "code_sha256"),
        ({"image_digest": "latest"}, "image_digest"),
        ({"resume_checkpoint_path": "ckpt/latest.pt"}, "canonical absolute"),
        ({"resume_checkpoint_path": "/ckpt/../latest.pt"}, "canonical absolute"),
        ({"unknown": 1}, "unknown"),
    ],
)
def test_invalid_identity_is_a_config_error(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        make_identity(**fields(**overrides))


def test_identity_is_frozen() -> None:
    identity = make_identity(**fields())
    with pytest.raises(ValueError, match="frozen"):
        identity.budget_s = 1.0  # type: ignore[misc]  # what mypy refuses must fail at run time too


@pytest.mark.parametrize(
    "image",
    [
        "sha256:" + "1" * 64,
        "docker.io/library/busybox@sha256:" + "2" * 64,
        "docker-pullable://repo/train@sha256:" + "3" * 64,
    ],
)
def test_kubernetes_image_id_forms_are_accepted(image: str) -> None:
    assert make_identity(**fields(image_digest=image)).image_digest == image


@pytest.mark.parametrize(
    ("path", "ok"),
    [
        ("/a/b", True),
        ("/", True),
        ("a/b", False),
        ("/a/b/", False),
        ("/a/./b", False),
        ("/a/../b", False),
        ("//a", False),
        ("/a//b", False),
        ("", False),
    ],
)
def test_is_canonical_absolute(path: str, ok: bool) -> None:
    assert is_canonical_absolute(path) is ok


def test_a_command_with_a_secret_is_stored_redacted_and_identified_by_its_hash() -> None:
    def with_password(password: str) -> RunIdentity:
        command = ("python3", "train.py", f"--password={password}")
        return make_identity(**{**fields(), **redacted_command(command, DEFAULT_RULES)})

    first, second = with_password("hunter2"), with_password("hunter3")
    assert first.command == ("python3", "train.py", "--password=<redacted>")
    assert "hunter2" not in first.canonical_json().decode()
    assert first.differences(second) == ["command_sha256"]  # a changed secret is a changed run


def test_a_command_without_secrets_keeps_its_digest() -> None:
    plain = make_identity(**fields())
    assert redacted_command(plain.command, DEFAULT_RULES) == {
        "command": plain.command,
        "command_sha256": None,
    }
    assert "command_sha256" not in plain.canonical()
