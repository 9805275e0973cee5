"""``soak-sidecar schema``: the JSON Schema of the run summary, the artifact or the settings."""

from __future__ import annotations

import argparse
import json

from sidecar.commands.parsing import Subparsers, UsageParser


def register(sub: Subparsers[UsageParser], summary: str) -> None:
    parser = sub.add_parser("schema", help=summary, description="Print a JSON Schema.")
    parser.add_argument(
        "which",
        metavar="SCHEMA",
        choices=["run-summary", "artifact", "settings"],
        help="run-summary, artifact or settings",
    )
    parser.add_argument(
        "--profile",
        choices=["core", "replay"],
        default=None,
        help="run-summary only: the profile whose rules the schema states (the run's "
        "--summary-profile); default: the settings' default profile",
    )
    parser.set_defaults(handler=run, parser=parser)


def run(args: argparse.Namespace) -> int:
    if args.profile is not None and args.which != "run-summary":
        args.parser.error(f"--profile applies to run-summary only, not {args.which}")
    if args.which == "run-summary":
        from sidecar.core.run_summary import run_summary_json_schema
        from sidecar.settings.run import SummarySettings

        default = SummarySettings.model_fields["profile"].default
        schema = run_summary_json_schema(args.profile or default)
    elif args.which == "artifact":
        from sidecar.core.artifact import Artifact

        schema = Artifact.model_json_schema()
    else:
        from sidecar.settings import Settings

        schema = Settings.model_json_schema()
    print(json.dumps(schema, indent=2, sort_keys=True))
    return 0
