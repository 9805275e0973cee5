"""``soak-launcher.py [--run-dir DIR] ... -- CMD ARGS...``: the command line."""

from __future__ import annotations

import argparse
import os
import sys
import time

from .output import STDERR, STDERR_FLUSH_S, log
from .proc import set_child_subreaper
from .protocol.exit import ExitRecord
from .protocol.files import atomic_write_json
from .protocol.names import DEFAULT_GO_TIMEOUT_S, EXIT_FILE, EXIT_GO_TIMEOUT, EXIT_SUBREAPER, EXIT_USAGE
from .runner import Launcher, Options


def _parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="soak-launcher.py",
        description="Run a trainer under soak-sidecar supervision (see docs/run-dir-protocol.md).",
    )
    parser.add_argument("--run-dir", required=True, help="Run dir shared with the sidecar.")
    parser.add_argument(
        "--go-timeout",
        type=float,
        default=DEFAULT_GO_TIMEOUT_S,
        help=f"Seconds to wait for go.json (default {DEFAULT_GO_TIMEOUT_S:g}); "
        f"exit {EXIT_GO_TIMEOUT} on timeout.",
    )
    parser.add_argument(
        "--owner-pid",
        type=int,
        default=None,
        help="Local mode: kill the trainer as soon as the launcher's parent is no longer this PID.",
    )
    parser.add_argument(
        "--termination-log",
        default=None,
        help="Write the exit reason there too (a pod's terminationMessagePath, /dev/termination-log).",
    )
    # Test-only: proves the orphan test can fail. Never use it in a real run.
    parser.add_argument("--no-subreaper", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    args = parser.parse_args(argv)
    if args.command and args.command[0] == "--":
        args.command = args.command[1:]
    if not args.command:
        parser.error("missing trainer command after --")
    if not args.go_timeout > 0:
        parser.error("--go-timeout must be > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        # Our messages get a bounded time to reach stderr; a stalled stderr never holds up exit.
        STDERR.flush(STDERR_FLUSH_S)


def _main(argv: list[str]) -> int:
    try:
        args = _parse_args(argv)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) and exc.code != 2 else EXIT_USAGE
    run_dir = os.path.abspath(args.run_dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
    except OSError as exc:
        log(f"cannot create the run dir: {exc}")
        return EXIT_USAGE
    if not args.no_subreaper:
        try:
            set_child_subreaper()
        except OSError as exc:
            log(str(exc))
            record = ExitRecord(None, EXIT_SUBREAPER, "subreaper_unavailable", ended_unix=time.time())
            atomic_write_json(os.path.join(run_dir, EXIT_FILE), record.to_json())
            return EXIT_SUBREAPER
    options = Options(
        run_dir,
        list(args.command),
        go_timeout_s=args.go_timeout,
        owner_pid=args.owner_pid,
        subreaper=not args.no_subreaper,
        termination_log=args.termination_log,
    )
    return Launcher(options).run()
