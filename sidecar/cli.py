"""The ``soak-sidecar`` command line: one parser, one module per command (``sidecar/commands/``)."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Sequence

from sidecar import __version__
from sidecar.commands import approve, exit_codes, install_launcher, report, run, schema, validate, verdict
from sidecar.commands.parsing import UsageParser
from sidecar.core.errors import SoakError
from sidecar.core.exitcodes import ExitCode

COMMANDS = (run, validate, schema, exit_codes, install_launcher, approve, verdict, report)


def build_parser() -> UsageParser:
    parser = UsageParser(
        prog="soak-sidecar",
        description="Supervise long-running GPU training soaks: a persistent deadline that is never "
        "extended, subreaper cleanup, process/GPU sampling, run_summary validation, a self-contained "
        "artifact (local and S3) and a verdict exit code.",
        epilog="Start with: soak-sidecar run --local   (runs the bundled example trainer)",
    )
    parser.add_argument("--version", action="version", version=f"soak-sidecar {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=UsageParser)
    for command in COMMANDS:
        command.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # inside the try: a reader gone before the last write fails here
    except BrokenPipeError:
        # The reader of stdout left (`soak-sidecar schema artifact | head -1`): end silently with
        # the status a shell gives coreutils killed by SIGPIPE (128 + 13). stdout goes to /dev/null
        # first, or the interpreter's own flush at exit prints a traceback after all.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    return code


def _dispatch(argv: Sequence[str] | None) -> int:
    args = build_parser().parse_args(argv)
    try:
        code: int = args.handler(args)
    except SoakError as exc:
        print(f"soak-sidecar: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("soak-sidecar: interrupted", file=sys.stderr)
        return int(ExitCode.CANCELLED)
    return code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
