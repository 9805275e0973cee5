"""``soak-sidecar validate``: a run_summary.json checked offline against the contract."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sidecar.commands.parsing import Subparsers, UsageParser
from sidecar.core.errors import ConfigError
from sidecar.core.exitcodes import ExitCode


def register(sub: Subparsers[UsageParser], summary: str) -> None:
    parser = sub.add_parser(
        "validate",
        help=summary,
        description="Validate a run_summary.json against the contract; print "
        f"each failure. Exit 0 when valid, {int(ExitCode.CONTRACT_VIOLATION)} when invalid, "
        f"{int(ExitCode.USAGE)} when the file cannot be read.",
    )
    parser.add_argument("path", type=Path, help="run_summary.json ('-' for stdin)")
    parser.add_argument("--manifest-validator", help="runtime-manifest validator 'module:function'")
    parser.add_argument(
        "--profile",
        choices=("core", "replay"),
        help="rules a completed summary must meet: core (any trainer) or replay (core plus the "
        "replay-ingress and inference rules). Default: SOAK_SUMMARY__PROFILE, else replay.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.adapters.validators import DEFAULT_VALIDATOR_GROUP, resolve_manifest_validator
    from sidecar.core.run_summary import ValidatorUnavailable, evaluate_run_summary
    from sidecar.settings import load_settings

    settings = load_settings()
    spec = args.manifest_validator or settings.summary.manifest_validator
    try:
        raw = args.path.read_bytes() if str(args.path) != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {args.path}: {exc}") from exc
    validator = resolve_manifest_validator(spec)
    if isinstance(validator, ValidatorUnavailable):
        # A run reports this as the summary's failure; here the user asked for this
        # validator, and no summary could pass: the command line is wrong, not the file.
        if args.manifest_validator:
            given = "--manifest-validator"
        else:
            given = (
                "SOAK_SUMMARY__MANIFEST_VALIDATOR" if spec else f"entry point group {DEFAULT_VALIDATOR_GROUP}"
            )
        raise ConfigError(f"{given}: {validator.message}")
    outcome = evaluate_run_summary(
        raw,
        mtime=None,
        run_started_wall=None,
        max_bytes=settings.summary.max_bytes,
        manifest_validator=validator,
        profile=args.profile or settings.summary.profile,
    )
    if args.json:
        shown = {
            "valid": outcome.passed,
            "classification": outcome.classification,
            "failures": list(outcome.failures),
        }
        print(json.dumps(shown, indent=2))
    elif outcome.passed:
        print(f"{args.path}: valid")
    else:
        for failure in outcome.failures:
            print(f"{args.path}: {failure}")
        print(f"{args.path}: INVALID ({outcome.classification})")
    return 0 if outcome.passed else int(ExitCode.CONTRACT_VIOLATION)
