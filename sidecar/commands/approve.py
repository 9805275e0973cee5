"""``soak-sidecar approve``: the approval record of a run's identity, computed as ``run`` would."""

from __future__ import annotations

import argparse
import sys

from sidecar.commands.parsing import (
    RUN_FLAGS,
    Subparsers,
    UsageParser,
    add_run_flags,
    flag_names,
    flag_settings,
    trainer_command,
)
from sidecar.core.errors import ConfigError
from sidecar.settings import load_settings

# The identity's inputs; the other run flags do not change an approval.
# --output places the local deadline store (<output>/deadlines) as it does for run.
IDENTITY_FLAGS = ("run_id", "budget", "margin", "dataset_manifest", "checkpoint", "deadline_dir", "output")


def register(sub: Subparsers[UsageParser], summary: str) -> None:
    parser = sub.add_parser(
        "approve",
        help=summary,
        description="Compute the run identity exactly as `run` would and print the approval record.",
    )
    add_run_flags(
        parser,
        IDENTITY_FLAGS,
        code_file_help="file hashed into the identity (repeatable; as given to run)",
        helps={
            "run_id": "run UUID the approval binds (required)",
            "output": "the run's --output, if it has one: the deadline store is <output>/deadlines",
        },
    )
    parser.set_defaults(**{dest: None for dest in set(RUN_FLAGS) - set(IDENTITY_FLAGS)})
    parser.add_argument("--store-location", help="deadline store location as `run` reports it")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.adapters.identity_files import identity_from_settings
    from sidecar.app.setup import local_layout
    from sidecar.app.wiring import deadline_store_location
    from sidecar.core.approval import render_approval
    from sidecar.core.identity import parse_run_id

    command = trainer_command(args)
    if not command:
        raise ConfigError("approve needs the trainer command after --")
    settings = load_settings(flag_settings(args), flag_names=flag_names(args))
    if settings.deadline.run_id is None:
        raise ConfigError("approve needs --run-id (the run UUID the approval binds)")
    run_id = parse_run_id(settings.deadline.run_id)
    settings = local_layout(settings, run_id)
    store = args.store_location or deadline_store_location(settings)
    identity = identity_from_settings(
        settings.deadline,
        run_id=run_id,
        command=command,
        deadline_store=store,
        redaction=settings.redaction.rules(),
    )
    sys.stdout.write(render_approval(identity).decode())
    return 0
