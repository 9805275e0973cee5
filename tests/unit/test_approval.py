"""Approval: exact match releases the run; any difference, or an unapproved resume, refuses."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from sidecar.core.approval import APPROVAL_FORMAT, attempt_command, check_approval, render_approval
from sidecar.core.errors import RefusedError
from sidecar.core.identity import RunIdentity, make_identity

RUN_ID = "0b6f1c52-8d0e-4a53-9d1c-3f2b1a7e9c10"
CKPT = "/ckpt/run/latest.pt"


def identity(**overrides: Any) -> RunIdentity:
    fields: dict[str, Any] = {
        "run_id": RUN_ID,
        "command": ("python3", "train.py", "--steps", "100"),
        "budget_s": 7200,
        "checkpoint_margin_s": 120,
        "deadline_store": "/var/soak/deadlines",
        "dataset_manifest_sha256": "a" * 64,
        "code_sha256": {"train.py": "b" * 64},
        "image_digest": "sha256:" + "c" * 64,
        "resume_checkpoint_path": CKPT,
    }
    fields.update(overrides)
    return make_identity(**fields)


def approval(change: Callable[[dict[str, Any]], object] | None = None) -> bytes:
    value = json.loads(render_approval(identity()))
    if change is not None:
        change(value)
    return json.dumps(value).encode()


def test_rendered_approval_schema() -> None:
    value = json.loads(render_approval(identity()))
    assert value == {
        "format": APPROVAL_FORMAT,
        "approved": True,
        "run_id": RUN_ID,
        "command": ["python3", "train.py", "--steps", "100"],
        "budget_seconds": 7200.0,
        "checkpoint_margin_seconds": 120.0,
        "deadline_store": "/var/soak/deadlines",
        "resume_checkpoint_path": CKPT,
        "identity": {
            "dataset_manifest_sha256": "a" * 64,
            "code_sha256": {"train.py": "b" * 64},
            "image_digest": "sha256:" + "c" * 64,
        },
    }


def test_exact_match_passes() -> None:
    check_approval(render_approval(identity()), identity(), required=True)
    check_approval(render_approval(identity()), identity(), required=False)


def test_integer_budget_written_by_hand_matches() -> None:
    check_approval(approval(lambda v: v.update(budget_seconds=7200)), identity(), required=True)


def test_not_required_and_absent_passes() -> None:
    check_approval(None, identity(), required=False)


def test_required_and_absent_refuses() -> None:
    with pytest.raises(RefusedError, match=r"needs an approval \(--require-approval\) and none was given"):
        check_approval(None, identity(), required=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("run_id", "1b6f1c52-8d0e-4a53-9d1c-3f2b1a7e9c10"),
        ("command", ["python3", "train.py", "--steps", "1000"]),
        ("command", ["python3", "train.py", "--steps"]),
        ("budget_seconds", 7201),
        ("budget_seconds", "7200"),
        ("checkpoint_margin_seconds", 60),
        ("deadline_store", "/tmp/fresh-budget"),
        ("resume_checkpoint_path", "/ckpt/run/other.pt"),
        ("resume_checkpoint_path", None),
    ],
)
def test_each_top_level_field_changed_refuses(field: str, value: Any) -> None:
    with pytest.raises(RefusedError, match=f"does not match this run in {field}[ .]"):
        check_approval(approval(lambda v: v.update({field: value})), identity(), required=True)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("dataset_manifest_sha256", "d" * 64),
        ("dataset_manifest_sha256", None),
        ("code_sha256", {"train.py": "e" * 64}),
        ("code_sha256", {}),
        ("image_digest", None),
    ],
)
def test_each_identity_field_changed_refuses(field: str, value: Any) -> None:
    with pytest.raises(RefusedError, match=f"does not match this run in identity.{field}"):
        check_approval(approval(lambda v: v["identity"].update({field: value})), identity(), required=True)


def test_approval_for_another_identity_refuses() -> None:
    """The other direction: the approval is unchanged but the run's identity moved on."""
    good = render_approval(identity())
    for changed in (
        identity(command=("python3", "train.py")),
        identity(budget_s=3600),
        identity(code_sha256={"train.py": "f" * 64}),
        identity(image_digest=None),
    ):
        with pytest.raises(RefusedError, match=r"does not match this run in .*soak-sidecar approve"):
            check_approval(good, changed, required=False)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda v: v.update(approved=False), "does not approve the run"),
        (lambda v: v.update(approved=1), "does not approve the run"),
        (lambda v: v.update(approved="true"), "does not approve the run"),
        (lambda v: v.pop("approved"), "does not approve the run"),
        (lambda v: v.update(format="v0"), "approval format"),
        (lambda v: v.update(run_id="run-1"), "run_id must be the run's UUID in lowercase"),
        (lambda v: v.update(run_id=RUN_ID.upper()), "run_id must be the run's UUID in lowercase"),
        (lambda v: v.update(run_id=None), "run_id must be the run's UUID in lowercase"),
        (lambda v: v.update(resume_checkpoint_path="ckpt/latest.pt"), "must be an absolute path"),
        (
            lambda v: v.update(resume_checkpoint_path="/ckpt/run/../run/latest.pt"),
            "must be an absolute path",
        ),
        (lambda v: v.update(resume_checkpoint_path=5), "must be an absolute path"),
        (lambda v: v.update(deadline_path="/x"), r"deadline_path \(unexpected\)"),
        (lambda v: v.pop("command"), r"command \(missing\)"),
        (lambda v: v["identity"].update(extra="x"), r"identity.extra \(unexpected\)"),
    ],
)
def test_malformed_approval_refuses(change: Callable[[dict[str, Any]], object], message: str) -> None:
    with pytest.raises(RefusedError, match=message):
        check_approval(approval(change), identity(), required=False)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "not valid JSON"),
        (b"\xff", "not valid JSON"),
        (b'{"approved": true', "not valid JSON"),
        (b'{"approved": NaN}', "not valid JSON"),
        (b"[]", "not a JSON object"),
        (b"true", "not a JSON object"),
    ],
)
def test_unparsable_approval_refuses(data: bytes, message: str) -> None:
    with pytest.raises(RefusedError, match=message):
        check_approval(data, identity(), required=False)


def test_approved_resume_checkpoint_that_exists_passes() -> None:
    check_approval(
        render_approval(identity()),
        identity(),
        required=True,
        resume_checkpoint=CKPT,
        resume_checkpoint_exists=True,
    )


def test_unapproved_resume_checkpoint_refuses() -> None:
    with pytest.raises(RefusedError, match=r"cannot resume from /ckpt/run/older\.pt: the run's checkpoint"):
        check_approval(
            render_approval(identity()),
            identity(),
            required=True,
            resume_checkpoint="/ckpt/run/older.pt",
            resume_checkpoint_exists=True,
        )


def test_resume_without_a_declared_checkpoint_refuses() -> None:
    bare = identity(resume_checkpoint_path=None)
    with pytest.raises(RefusedError, match=r"this run declares no checkpoint\. Give every attempt"):
        check_approval(None, bare, required=False, resume_checkpoint=CKPT, resume_checkpoint_exists=True)


@pytest.mark.parametrize("exists", [False, None])
def test_missing_resume_checkpoint_refuses(exists: bool | None) -> None:
    with pytest.raises(RefusedError, match=r"no such file\. The trainer writes it at a soft stop"):
        check_approval(
            render_approval(identity()),
            identity(),
            required=True,
            resume_checkpoint=CKPT,
            resume_checkpoint_exists=exists,
        )


def test_resume_rules_apply_without_an_approval_file() -> None:
    check_approval(None, identity(), required=False, resume_checkpoint=CKPT, resume_checkpoint_exists=True)
    with pytest.raises(RefusedError, match=r"no such file\. The trainer writes it at a soft stop"):
        check_approval(
            None, identity(), required=False, resume_checkpoint=CKPT, resume_checkpoint_exists=False
        )


def test_attempt_command_appends_the_resume_flag() -> None:
    base = ("python3", "train.py", "--steps", "100")
    assert attempt_command(identity(), None, resume_flag="--resume") == base
    assert attempt_command(identity(), CKPT, resume_flag="--resume") == (*base, "--resume", CKPT)
    assert attempt_command(identity(), CKPT, resume_flag="--from") == (*base, "--from", CKPT)
    assert attempt_command(identity(), CKPT, resume_flag=None) == base
    assert attempt_command(identity(), CKPT, resume_flag="") == base
    with pytest.raises(RefusedError, match=r"cannot resume from /ckpt/other\.pt: the run's checkpoint"):
        attempt_command(identity(), "/ckpt/other.pt", resume_flag="--resume")
