"""The ``soak-sidecar`` command line: one parser, one module per command (``sidecar/commands/``)."""

from __future__ import annotations

import importlib
import os
import signal
import sys
from collections.abc import Sequence

from sidecar import __version__
from sidecar.commands.parsing import Subparsers, UsageParser
from sidecar.core.errors import SoakError
from sidecar.core.exitcodes import ExitCode

# Each command's module and its line in the top-level --help. Only the module of the command
# given is imported (run's pulls in pydantic and the engine): --help, exit-codes and the rest start
# light, and every command still gets its whole parser when it is the one given.
COMMANDS = {
    "run": "supervise one soak attempt (local or in a pod)",
    "validate": "validate a run_summary.json offline",
    "schema": "print a JSON Schema",
    "exit-codes": "print the exit-code table",
    "install-launcher": "write the stdlib-only launcher (init container)",
    "approve": "print the approval record for a run, to review and pass as --approval",
    "verdict": "read a Job's verdicts from its pods' annotations",
    "report": "write one self-contained HTML report of an attempt, or of a whole run",
}


def command_module(name: str) -> str:
    return "sidecar.commands." + name.replace("-", "_")


def build_parser(argv: Sequence[str] | None = None) -> UsageParser:
    """The parser: the whole parser of the command ``argv`` gives, the others as their help line."""
    given = _command_given(sys.argv[1:] if argv is None else argv)
    parser = UsageParser(
        prog="soak-sidecar",
        description="Supervise long-running GPU training soaks: a persistent deadline that is never "
        "extended, subreaper cleanup, process/GPU sampling, run_summary validation, a self-contained "
        "artifact (local and S3) and a verdict exit code.",
        epilog="Start with: soak-sidecar run --local   (runs the bundled example trainer)",
    )
    parser.add_argument("--version", action="version", version=f"soak-sidecar {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=UsageParser)
    for name, text in COMMANDS.items():
        if name == given:
            importlib.import_module(command_module(name)).register(sub, text)
        else:
            sub.add_parser(name, help=text)
    return parser


def _command_given(argv: Sequence[str]) -> str | None:
    """The first word that is no option: the top-level parser has options without values only."""
    return next((word for word in argv if not word.startswith("-")), None)


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
    parser = build_parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        # Named by the command's own parser: its usage and its --help are the ones to read.
        commands = next(a for a in parser._actions if isinstance(a, Subparsers))
        commands.choices[args.cmd].error(f"unrecognized arguments: {' '.join(unknown)}")
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
