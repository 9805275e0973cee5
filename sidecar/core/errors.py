"""One exception hierarchy, split by what the caller does next.

Adapters translate their library errors into these (``raise ... from exc``) so that no
boto3, kubernetes, pynvml or OS error leaks past an adapter boundary.
"""

from __future__ import annotations

from sidecar.core.exitcodes import ExitCode


class SoakError(Exception):
    """Base of every error soak-sidecar raises on purpose."""

    exit_code: ExitCode = ExitCode.INTERNAL


class ConfigError(SoakError):
    """Bad settings or command line: fix the input and run again."""

    exit_code = ExitCode.USAGE


class RefusedError(SoakError):
    """The run must not start: identity/config mismatch, missing approval, a second supervisor."""

    exit_code = ExitCode.REFUSED


class AlreadySupervisedError(RefusedError):
    """Another supervisor holds the run's lock."""


class RecordExistsError(SoakError):
    """A record was created concurrently (exclusive create lost the race)."""


class DeadlineRecordError(RefusedError):
    """A deadline record is corrupt, inconsistent or tampered with: fail closed."""


class InsufficientBudgetError(SoakError):
    """Less than the checkpoint margin is left (or the deadline has passed): nothing to start."""

    exit_code = ExitCode.INSUFFICIENT_BUDGET


class DeadlineExpiredError(InsufficientBudgetError):
    """The run's original deadline has already passed: a verdict, never a fresh budget."""


class TransientError(SoakError):
    """Infrastructure that may work on a retry of the pod (store or API unreachable)."""

    exit_code = ExitCode.TRANSIENT_INFRA


class StoreUnavailableError(TransientError):
    """A deadline store or artifact sink could not be reached after retries."""


class UploadError(SoakError):
    """The artifact could not be uploaded; the local copy remains."""

    exit_code = ExitCode.EVIDENCE_LOST


class ObjectConflictError(UploadError):
    """The artifact's key already holds different bytes; nothing was overwritten."""


class PublishError(TransientError):
    """The verdict could not be published to the Kubernetes API."""


class ForbiddenError(PublishError):
    """The API refused the request (403): RBAC or admission; retrying the pod does not help."""

    exit_code = ExitCode.REFUSED


class NotFoundError(PublishError):
    """The API object does not exist (HTTP 404): deleted, or never there. Not retried."""


class GpuUnavailableError(ConfigError):
    """GPU data was required (gpu.require) but NVML is absent or failing on this node."""


class LauncherError(SoakError):
    """The launcher never appeared or broke the run-dir protocol."""

    exit_code = ExitCode.TRAINER_NOT_STARTED


class TrainerNotStartedError(LauncherError):
    """The launcher is there, but the trainer command it was given cannot be started."""


class InvalidRunSummaryError(SoakError):
    """run_summary.json is oversized, not UTF-8, or not parsable JSON."""

    exit_code = ExitCode.CONTRACT_VIOLATION
