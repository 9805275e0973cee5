"""``soak-sidecar validate``: a run_summary.json checked offline against the contract."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sidecar.commands.parsing import Subparsers, UsageParser
from sidecar.core.errors import ConfigError
from sidecar.core.exitcodes import ExitCode
from sidecar.settings import load_settings


def register(sub: Subparsers[UsageParser]) -> None:
    parser = sub.add_parser(
        "validate",
        help="validate a run_summary.json offline",
        description="Validate a run_summary.json against the contract; print "
        f"each failure; exit {int(ExitCode.CONTRACT_VIOLATION)} when invalid.",
    )
    parser.add_argument("path", type=Path, help="run_summary.json ('-' for stdin)")
    parser.add_argument("--manifest-validator", help="runtime-manifest validator 'module:function'")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.adapters.validators import resolve_manifest_validator
    from sidecar.core.run_summary import evaluate_run_summary

    settings = load_settings()
    spec = args.manifest_validator or settings.summary.manifest_validator
    try:
        raw = args.path.read_bytes() if str(args.path) != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {args.path}: {exc}") from exc
    outcome = evaluate_run_summary(
        raw,
        mtime=None,
        run_started_wall=None,
        max_bytes=settings.summary.max_bytes,
        manifest_validator=resolve_manifest_validator(spec),
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
