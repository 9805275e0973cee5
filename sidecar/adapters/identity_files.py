"""The file reads the run identity needs: the manifest's and code files' hashes, canonical paths."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sidecar.core.errors import ConfigError, RefusedError
from sidecar.core.identity import RunIdentity, make_identity, redacted_command, sha256_hex
from sidecar.core.redaction import RedactionRules
from sidecar.settings import DeadlineSettings


def sha256_file(path: Path) -> str:
    """sha256 of a file's bytes; ConfigError when it cannot be read."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path} for the run identity: {exc}") from exc
    return sha256_hex(data)


def canonical_path(path: Path) -> str:
    """The canonical form, ``str(Path(p).resolve())``: absolute, symlinks resolved, so one file has
    one spelling in an identity. A path that cannot be resolved (a symlink loop, a folder that
    cannot be searched) refuses the run: the trainer may have made it so (its checkpoint record)."""
    try:
        return str(path.resolve())
    except (OSError, RuntimeError) as exc:
        raise RefusedError(f"cannot resolve {path}: {exc}") from exc


def identity_from_settings(
    settings: DeadlineSettings,
    *,
    run_id: str,
    command: Sequence[str],
    deadline_store: str,
    image_digest: str | None = None,
    redaction: RedactionRules,
) -> RunIdentity:
    """Compute the run identity: hash the manifest and code files, resolve the checkpoint path.

    Code files are keyed by the path as configured, so the approval names them as the user does.
    """
    code: dict[str, str] = {}
    for path in settings.code_files:
        if str(path) in code:
            raise ConfigError(f"code file {path} is listed twice")
        code[str(path)] = sha256_file(path)
    return make_identity(
        run_id=run_id,
        **redacted_command(command, redaction),
        budget_s=settings.budget_s,
        checkpoint_margin_s=settings.checkpoint_margin_s,
        deadline_store=deadline_store,
        dataset_manifest_sha256=(
            None if settings.dataset_manifest is None else sha256_file(settings.dataset_manifest)
        ),
        code_sha256=code,
        image_digest=image_digest,
        resume_checkpoint_path=(
            None if settings.checkpoint_path is None else canonical_path(settings.checkpoint_path)
        ),
    )


def read_approval(path: Path) -> bytes:
    """The approval record as the user wrote it; an unreadable one refuses the run."""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise RefusedError(f"cannot read approval file {path}: {exc}") from exc


def is_file(path: str) -> bool:
    """Whether a regular file is there; a path that cannot be checked (a folder the sidecar may not
    search) refuses the run rather than resume or start afresh unseen."""
    try:
        return Path(path).is_file()
    except OSError as exc:
        raise RefusedError(
            f"cannot check {path}: {exc.strerror} (the sidecar reads the checkpoint record: keep its "
            "folder searchable and the record readable by the sidecar's group)"
        ) from exc


class IdentityFileReader:
    """Implements the IdentityFiles port with the functions above."""

    def identity(
        self,
        deadline: DeadlineSettings,
        *,
        run_id: str,
        command: Sequence[str],
        deadline_store: str,
        image_digest: str | None,
        redaction: RedactionRules,
    ) -> RunIdentity:
        return identity_from_settings(
            deadline,
            run_id=run_id,
            command=command,
            deadline_store=deadline_store,
            image_digest=image_digest,
            redaction=redaction,
        )

    def canonical_path(self, path: Path) -> str:
        return canonical_path(path)

    def is_file(self, path: str) -> bool:
        return is_file(path)

    def read_approval(self, path: Path) -> bytes:
        return read_approval(path)
