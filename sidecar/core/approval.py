"""Approval records: a reviewer's sign-off bound to one run's exact identity.

Pure: the caller reads the approval file and checks the checkpoint's existence.

Schema (``soak-sidecar-approval-v1``), a JSON object with exactly these keys::

    {
      "format": "soak-sidecar-approval-v1",
      "approved": true,
      "run_id": "<canonical lowercase UUID>",
      "command": ["<argv0>", "..."],
      "budget_seconds": 7200.0,
      "checkpoint_margin_seconds": 120.0,
      "deadline_store": "<store location>",
      "resume_checkpoint_path": "<canonical absolute path>" | null,
      "identity": {
        "dataset_manifest_sha256": "<hex>" | null,
        "code_sha256": {"<name>": "<hex>", ...},
        "image_digest": "<...sha256:hex>" | null
      }
    }

The approval must equal the expected object exactly (numbers by value;
``true`` is not ``1``); any extra, missing or different key refuses the run. Binding the
deadline store keeps a reviewed run from being pointed at an empty store for a fresh budget.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from sidecar.core.errors import RefusedError
from sidecar.core.identity import RunIdentity, is_canonical_absolute

APPROVAL_FORMAT = "soak-sidecar-approval-v1"
# An approval is a few KiB; a bigger file is not one.
MAX_APPROVAL_BYTES = 1024 * 1024


def expected_approval(identity: RunIdentity) -> dict[str, Any]:
    """The one approval object that releases ``identity``."""
    return {
        "format": APPROVAL_FORMAT,
        "approved": True,
        "run_id": identity.run_id,
        "command": list(identity.command),
        "budget_seconds": identity.budget_s,
        "checkpoint_margin_seconds": identity.checkpoint_margin_s,
        "deadline_store": identity.deadline_store,
        "resume_checkpoint_path": identity.resume_checkpoint_path,
        "identity": {
            "dataset_manifest_sha256": identity.dataset_manifest_sha256,
            "code_sha256": dict(identity.code_sha256),
            "image_digest": identity.image_digest,
        },
    }


def render_approval(identity: RunIdentity) -> bytes:
    """The approval for ``identity``, for a reviewer to read and save as the approval file."""
    return (json.dumps(expected_approval(identity), sort_keys=True, indent=2) + "\n").encode()


def _same(a: Any, b: Any) -> bool:
    """JSON equality without Python's ``True == 1``."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and bool(a == b)


def _mismatches(found: dict[str, Any], wanted: dict[str, Any], prefix: str = "") -> list[str]:
    names: list[str] = []
    for key in sorted(found.keys() | wanted.keys()):
        label = prefix + key
        if key not in wanted:
            names.append(f"{label} (unexpected)")
        elif key not in found:
            names.append(f"{label} (missing)")
        elif isinstance(found[key], dict) and isinstance(wanted[key], dict):
            names.extend(_mismatches(found[key], wanted[key], label + "."))
        elif not _same(found[key], wanted[key]):
            names.append(label)
    return names


def _reject_constant(token: str) -> float:
    raise ValueError(f"non-finite number {token}")


def _parse(approval: bytes) -> dict[str, Any]:
    if len(approval) > MAX_APPROVAL_BYTES:
        raise RefusedError(f"approval is larger than {MAX_APPROVAL_BYTES} bytes")
    try:
        value = json.loads(approval.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise RefusedError(f"approval is not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise RefusedError("approval is not a JSON object")
    return value


def check_approval(
    approval: bytes | None,
    identity: RunIdentity,
    *,
    required: bool,
    resume_checkpoint: str | None = None,
    resume_checkpoint_exists: bool | None = None,
) -> None:
    """Refuse unless the approval (when given or required) releases exactly this run, and
    any requested resume is from the run's approved checkpoint, which exists.

    ``resume_checkpoint`` is this attempt's request, already resolved to a canonical absolute
    path by the caller; ``resume_checkpoint_exists`` is whether it is a regular file (None:
    not checked, which refuses).
    """
    if approval is None:
        if required:
            raise RefusedError(
                "this run needs an approval (--require-approval) and none was given: make one with "
                "`soak-sidecar approve` and the same run id, flags and command, review it, and pass "
                "it with --approval FILE"
            )
    else:
        _check_approval_object(_parse(approval), identity)
    _check_resume_request(identity, resume_checkpoint, resume_checkpoint_exists)


def _check_approval_object(value: dict[str, Any], identity: RunIdentity) -> None:
    if value.get("format") != APPROVAL_FORMAT:
        raise RefusedError(f"approval format is {value.get('format')!r}, expected {APPROVAL_FORMAT!r}")
    if value.get("approved") is not True:
        raise RefusedError('the approval file does not approve the run: its "approved" must be true')
    run_id = value.get("run_id")
    try:
        canonical_run_id = str(uuid.UUID(run_id)) if isinstance(run_id, str) else None
    except ValueError:
        canonical_run_id = None
    if canonical_run_id is None or canonical_run_id != run_id:
        raise RefusedError(
            "the approval file's run_id must be the run's UUID in lowercase (as `soak-sidecar approve` "
            "writes it)"
        )
    resume_path = value.get("resume_checkpoint_path")
    if resume_path is not None and (
        not isinstance(resume_path, str) or not is_canonical_absolute(resume_path)
    ):
        raise RefusedError(
            "the approval file's resume_checkpoint_path must be an absolute path without symlinks or "
            "'..' (as `soak-sidecar approve` writes it)"
        )
    wanted = expected_approval(identity)
    if not _same(value, wanted):
        store = ""
        if not _same(value.get("deadline_store"), wanted["deadline_store"]):
            store = (
                f" (it names the deadline store {value.get('deadline_store')!r}, this run uses "
                f"{wanted['deadline_store']!r}: give approve the same --deadline-dir or --output as run)"
            )
        raise RefusedError(
            "the approval file does not match this run in "
            + ", ".join(_mismatches(value, wanted))
            + store
            + ". Make a new one with `soak-sidecar approve` and this run's run id, flags and command, "
            "review it, and pass it with --approval FILE"
        )


def _check_resume_request(identity: RunIdentity, requested: str | None, exists: bool | None) -> None:
    if requested is None:
        return
    if identity.resume_checkpoint_path is None:
        raise RefusedError(
            f"cannot resume from {requested}: this run declares no checkpoint. Give every attempt "
            f"(and `soak-sidecar approve`) --checkpoint {requested}, so the checkpoint is part of "
            "the run's identity, then resume with --resume-checkpoint"
        )
    if requested != identity.resume_checkpoint_path:
        raise RefusedError(
            f"cannot resume from {requested}: the run's checkpoint (--checkpoint) is "
            f"{identity.resume_checkpoint_path}, and only that file may be resumed from"
        )
    if exists is not True:
        raise RefusedError(
            f"cannot resume from {requested}: no such file. The trainer writes it at a soft stop; "
            "resume after an attempt that wrote it, or run without --resume-checkpoint"
        )


def attempt_command(
    identity: RunIdentity, resume_checkpoint: str | None, *, resume_flag: str | None
) -> tuple[str, ...]:
    """The trainer argv for this attempt: the identity's command, plus
    ``<resume_flag> <path>`` when resuming and a resume flag is set (call after
    ``check_approval`` accepted the request).

    The identity keeps the base command, so resumed and fresh attempts share one identity.
    """
    if resume_checkpoint is None or not resume_flag:
        return identity.command
    if resume_checkpoint != identity.resume_checkpoint_path:
        raise RefusedError(
            f"cannot resume from {resume_checkpoint}: the run's checkpoint (--checkpoint) is "
            f"{identity.resume_checkpoint_path}"
        )
    return (*identity.command, resume_flag, resume_checkpoint)
