"""The immutable identity a deadline record and an approval are bound to.

Pure: no file I/O. Callers hash files with an adapter helper and pass the digests in.
Every attempt of one run must compute the same identity; any difference refuses the attempt
(a deadline is never re-created or extended under a changed command, budget or code).
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import uuid
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    ValidationError,
    field_validator,
    model_validator,
)

from sidecar.core.errors import ConfigError
from sidecar.core.redaction import RedactionRules, redact_command

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# Kubernetes imageID forms: "sha256:<hex>", "repo@sha256:<hex>", "docker-pullable://repo@sha256:<hex>".
_IMAGE_DIGEST = re.compile(r"(?:[^\s@]+@)?sha256:[0-9a-f]{64}")

_FiniteSeconds = Annotated[float, Strict(), Field(gt=0, allow_inf_nan=False)]
_Str = Annotated[str, Strict()]


def new_run_id() -> str:
    """A fresh run UUID in canonical form (random, version 4)."""
    return str(uuid.uuid4())


def parse_run_id(text: object) -> str:
    """The canonical lowercase form of a run UUID; ConfigError for anything else."""
    if not isinstance(text, str):
        raise ConfigError(f"run id must be a UUID string, got {type(text).__name__}")
    try:
        value = uuid.UUID(text.strip())
    except ValueError as exc:
        raise ConfigError(f"run id must be a UUID, got {text!r}") from exc
    return str(value)


# Indexes of one multi-pod soak (an Indexed Job's completion indexes); far above any real one.
MAX_INDEX = 99_999
_SLOT = re.compile(r"(?P<run>[^.]+)(?:\.index-(?P<index>0|[1-9][0-9]*))?")


def run_slot(run_id: str, index: int | None) -> str:
    """The lock and attempt ledger of one pod of a run: the run itself, or one index of a multi-pod
    soak. Every index shares the run's deadline record; each has its own lock and attempt numbers."""
    run = parse_run_id(run_id)
    if index is None:
        return run
    if not 0 <= index <= MAX_INDEX:
        raise ConfigError(f"index must be 0-{MAX_INDEX}, got {index}")
    return f"{run}.index-{index}"


def parse_slot(text: str) -> str:
    """A run slot in canonical form (a run id, optionally ``.index-N``); ConfigError otherwise. The
    name never leaves a store's directory or prefix."""
    found = _SLOT.fullmatch(text)
    if found is None:
        raise ConfigError(f"not a run or run index: {text!r}")
    index = found.group("index")
    return run_slot(found.group("run"), None if index is None else int(index))


def sha256_hex(data: bytes) -> str:
    """Lowercase hex sha256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def canonical_json(value: Any) -> bytes:
    """One byte form per value: sorted keys, no whitespace, ASCII, no NaN/Infinity."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
    ).encode()


def is_canonical_absolute(path: str) -> bool:
    """Absolute and already normalised (no ``.``, ``..``, ``//`` or trailing slash).

    Symlinks cannot be resolved here (no I/O); the caller resolves paths before they get here,
    so an identity path is ``str(Path(p).resolve())``: one spelling per file, whatever path the
    user gave, so the same run always has the same identity.
    """
    return (
        path.startswith("/")
        and not path.startswith("//")
        and posixpath.normpath(path) == path
        and "\x00" not in path
    )


class RunIdentity(BaseModel):
    """Everything that must stay identical across the attempts of one run."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: _Str
    # Redacted (sidecar.core.redaction): the identity is stored in records and artifacts.
    command: tuple[_Str, ...]
    command_sha256: _Str | None = Field(
        None,
        description="sha256 of the unredacted command's canonical JSON, where redaction changed it: "
        "a changed secret is still a changed run. Left out of the canonical form when None, so "
        "identities of commands without secrets keep their digests.",
    )
    budget_s: _FiniteSeconds
    checkpoint_margin_s: _FiniteSeconds
    deadline_store: _Str = Field(
        description="Location of the deadline store: a different store would mean a fresh budget."
    )
    dataset_manifest_sha256: _Str | None = None
    code_sha256: dict[_Str, _Str] = Field(default_factory=dict)
    image_digest: _Str | None = None
    resume_checkpoint_path: _Str | None = Field(
        None,
        description="The one checkpoint this run may resume from (fixed for every attempt); "
        "canonical absolute path.",
    )

    @field_validator("run_id")
    @classmethod
    def _uuid(cls, value: str) -> str:
        try:
            canonical = str(uuid.UUID(value))
        except ValueError as exc:
            raise ValueError("run_id must be a UUID") from exc
        if canonical != value:
            raise ValueError("run_id must be a canonical lowercase UUID")
        return value

    @field_validator("command")
    @classmethod
    def _command(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if not value or not value[0]:
            raise ValueError("missing command")
        return value

    @field_validator("command_sha256")
    @classmethod
    def _command_digest(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256_HEX.fullmatch(value):
            raise ValueError("command_sha256 must be 64 lowercase hex digits")
        return value

    @field_validator("deadline_store")
    @classmethod
    def _store(cls, value: str) -> str:
        if not value:
            raise ValueError("deadline_store must not be empty")
        return value

    @field_validator("dataset_manifest_sha256")
    @classmethod
    def _manifest(cls, value: str | None) -> str | None:
        if value is not None and not _SHA256_HEX.fullmatch(value):
            raise ValueError("dataset_manifest_sha256 must be 64 lowercase hex digits")
        return value

    @field_validator("code_sha256")
    @classmethod
    def _code(cls, value: dict[str, str]) -> dict[str, str]:
        for name, digest in value.items():
            if not name:
                raise ValueError("code_sha256 names must not be empty")
            if not _SHA256_HEX.fullmatch(digest):
                raise ValueError(f"code_sha256[{name!r}] must be 64 lowercase hex digits")
        return value

    @field_validator("image_digest")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE_DIGEST.fullmatch(value):
            raise ValueError("image_digest must end in sha256:<64 hex digits>")
        return value

    @field_validator("resume_checkpoint_path")
    @classmethod
    def _resume(cls, value: str | None) -> str | None:
        if value is not None and not is_canonical_absolute(value):
            raise ValueError("resume_checkpoint_path must be a canonical absolute path")
        return value

    @model_validator(mode="after")
    def _margin(self) -> RunIdentity:
        if not self.checkpoint_margin_s < self.budget_s:
            raise ValueError("checkpoint_margin_s must be smaller than budget_s")
        return self

    def canonical(self) -> dict[str, Any]:
        """The JSON object stored in records (lists for tuples, floats for seconds)."""
        value = self.model_dump(mode="json")
        if value["command_sha256"] is None:
            del value["command_sha256"]
        return value

    def canonical_json(self) -> bytes:
        return canonical_json(self.canonical())

    def digest(self) -> str:
        """sha256 of the canonical JSON form."""
        return sha256_hex(self.canonical_json())

    def differences(self, other: RunIdentity) -> list[str]:
        """Names of the fields whose canonical values differ, in field order."""
        mine, theirs = self.canonical(), other.canonical()
        return [name for name in type(self).model_fields if mine.get(name) != theirs.get(name)]


def redacted_command(command: Sequence[str], rules: RedactionRules) -> dict[str, Any]:
    """The identity's ``command`` and ``command_sha256`` fields for ``command``."""
    redacted = redact_command(command, rules)
    if redacted == tuple(command):
        return {"command": redacted, "command_sha256": None}
    return {"command": redacted, "command_sha256": sha256_hex(canonical_json(list(command)))}


def make_identity(**fields: Any) -> RunIdentity:
    """Build a RunIdentity from caller input; one ConfigError line naming every bad field."""
    if "run_id" in fields:
        fields["run_id"] = parse_run_id(fields["run_id"])
    try:
        return RunIdentity(**fields)
    except ValidationError as exc:
        raise ConfigError(f"invalid run identity: {describe_validation_error(exc)}") from exc


def describe_validation_error(exc: ValidationError) -> str:
    """pydantic's errors as one short line: ``field: message; ...``."""
    return "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'value'}: {err['msg']}" for err in exc.errors()
    )
