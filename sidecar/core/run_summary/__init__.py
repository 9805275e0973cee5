"""The trainer's ``run_summary.json`` contract: validation and classification (pure).

The checks run in a fixed order, each with fixed message texts (the artifact's reason joins them
in that order): ``schema_failure`` (metric/runtime-manifest schema versions),
``shutdown_contract_failure`` and ``describe_shutdown`` (the host-only shutdown diagnostics),
``inference_flight_failure`` (a completed run's inference flight must be drained) in ``checks``;
``replay_ingress_failure`` (the replay-ingress invariants) in ``ingress``; then the generic
runtime-manifest validator (``validator``). ``parse`` reads the bytes, ``evaluate`` classifies,
``models`` and ``schema`` describe the same contract as typed models and their JSON Schema.

Rules worth knowing:

- The generic validator is a plug-in (``ManifestValidator``, loaded by
  ``sidecar.adapters.validators``): ``module:function`` from the settings, or the single entry
  point of the ``soak_sidecar.manifest_validators`` group. With neither configured the generic
  step is skipped: that is not a failure, since the checks above are the soak's own contract. A
  configured validator that cannot be imported is a validation failure
  (``runtime_manifest validation requires ...: <exc>``); one that raises something other than
  TypeError/ValueError is a failure too, never a crash.
- Unreadable JSON, a non-object and an oversized file are ``invalid_run_summary``, each with its
  own message (not reported as a missing file); a file older than the run is
  ``stale_run_summary``.
- Booleans never count as drained inference-flight counters (``False`` is not ``0``); integers
  are compared exactly instead of through ``float``.
- Values quoted in messages are shortened to 500 characters of their repr (``contract.clip``).
"""

from sidecar.core.run_summary.checks import (
    describe_shutdown,
    schema_failure,
    shutdown_contract_failure,
    shutdown_diagnostics,
)
from sidecar.core.run_summary.contract import (
    REPLAY_INGRESS_INTEGER_FIELDS,
    SHUTDOWN_CLASSIFICATIONS,
    SUMMARY_CLASSIFICATIONS,
    clip,
)
from sidecar.core.run_summary.evaluate import (
    Profile,
    SummaryOutcome,
    evaluate_parsed,
    evaluate_run_summary,
    unreadable,
)
from sidecar.core.run_summary.models import AbnormalRunSummary, CompletedRunSummary
from sidecar.core.run_summary.schema import RunSummary, run_summary_json_schema
from sidecar.core.run_summary.validator import ManifestValidator, ValidatorUnavailable

__all__ = [
    "REPLAY_INGRESS_INTEGER_FIELDS",
    "SHUTDOWN_CLASSIFICATIONS",
    "SUMMARY_CLASSIFICATIONS",
    "AbnormalRunSummary",
    "CompletedRunSummary",
    "ManifestValidator",
    "Profile",
    "RunSummary",
    "SummaryOutcome",
    "ValidatorUnavailable",
    "clip",
    "describe_shutdown",
    "evaluate_parsed",
    "evaluate_run_summary",
    "run_summary_json_schema",
    "schema_failure",
    "shutdown_contract_failure",
    "shutdown_diagnostics",
    "unreadable",
]
