"""``soak-sidecar install-launcher``: the launcher as one file, for the chart's init container."""

from __future__ import annotations

import argparse
from pathlib import Path

from sidecar.commands.parsing import Subparsers, UsageParser


def register(sub: Subparsers[UsageParser], summary: str) -> None:
    parser = sub.add_parser(
        "install-launcher",
        help=summary,
        description="Write the launcher (one zipapp file, standard library only, Python 3.9+) into DEST "
        "as soak-launcher.py, the trainer kit beside it (DEST/kit/soak_sidecar_kit: the launcher puts "
        "it on the trainer's PYTHONPATH) and py-spy (a stall's Python stacks), for the trainer "
        "container to run: "
        "python3 DEST/soak-launcher.py --run-dir /soak/run -- CMD ARGS...",
    )
    parser.add_argument("--dest", type=Path, required=True, help="directory, e.g. /soak/bin")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.adapters.rundir.zipapp import build_launcher, install_stack_reader

    target = build_launcher(args.dest)
    print(f"soak-sidecar: launcher installed at {target}")
    print(f"soak-sidecar: trainer kit installed at {target.parent / 'kit'} (import soak_sidecar_kit)")
    reader = install_stack_reader(args.dest)
    if reader is None:
        print("soak-sidecar: py-spy not found: a stall's artifact will say its stacks are missing")
    else:
        print(f"soak-sidecar: py-spy installed at {reader} (a stall's stacks)")
    return 0
