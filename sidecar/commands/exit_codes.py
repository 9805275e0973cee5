"""``soak-sidecar exit-codes``: the exit-code table the chart's podFailurePolicy also uses."""

from __future__ import annotations

import argparse
import json

from sidecar.commands.parsing import Subparsers, UsageParser
from sidecar.core.exitcodes import EXIT_CODE_DESCRIPTIONS, ExitCode


def register(sub: Subparsers[UsageParser], summary: str) -> None:
    parser = sub.add_parser(
        "exit-codes",
        help=summary,
        description="Print every exit code of `run`, whether it is retryable (128+), what it means "
        "and which verdict classifications map to it (the chart's podFailurePolicy uses the same table).",
    )
    parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.core.classification import classifications_for
    from sidecar.core.verdict import exit_code_table_markdown

    if not args.json:
        print(exit_code_table_markdown())
        return 0
    rows = [
        {
            "code": int(code),
            "name": code.name,
            "retryable": code.retryable,
            "meaning": EXIT_CODE_DESCRIPTIONS[code],
            "classifications": classifications_for(code),
        }
        for code in ExitCode
    ]
    print(json.dumps(rows, indent=2))
    return 0
