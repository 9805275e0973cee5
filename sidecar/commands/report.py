"""``soak-sidecar report``: one self-contained HTML page of an attempt, local or on S3."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from sidecar.commands.parsing import Subparsers, UsageParser
from sidecar.settings import load_settings


def register(sub: Subparsers[UsageParser]) -> None:
    parser = sub.add_parser(
        "report",
        help="write one self-contained HTML report of an attempt, or of a whole run",
        description="One HTML file (inline SVG plots, no network, no JavaScript) from an artifact and "
        "its samples.jsonl.gz: the verdict, plots of every sample with the soft stop, TERM and KILL "
        "marked, leak trends, leftover processes and the run summary figures.",
        epilog="examples:\n  soak-sidecar report soak-output/runs/RUN_ID/attempt-1\n"
        "  soak-sidecar report soak-output/runs/RUN_ID\n"
        "  soak-sidecar report s3://soaks/soak-sidecar/NS/JOB/RUN_ID/attempt-1/artifact.json -o report.html\n"
        "S3 reads use the SOAK_S3__* settings (endpoint, region, credentials) as the sidecar does.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "path",
        help="artifact.json, the attempt's directory, or an s3:// URI of either; or a run's directory "
        "(soak-output/runs/RUN_ID): one page for all its attempts, where the budget went, each attempt's own "
        "page beside it",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="where to write it (default: report.html beside a local artifact or in a run's directory, "
        "./report.html for S3)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.adapters.report_source import LocalSource, is_run_dir, open_source, write_page
    from sidecar.core.report import render_report

    if not args.path.startswith("s3://") and is_run_dir(Path(args.path)):
        return _run_page(Path(args.path), args.output)
    source = open_source(args.path, load_settings().s3)
    page = render_report(source.artifact, source.samples(), source.console_tail())
    default = source.directory / "report.html" if isinstance(source, LocalSource) else Path("report.html")
    output: Path = args.output or default
    write_page(output, page)
    note = f" ({source.skipped_lines} unreadable sample lines skipped)" if source.skipped_lines else ""
    print(f"soak-sidecar: report {output} ({len(page.encode()) / 1024:.0f} KiB){note}", file=sys.stderr)
    return 0


def _run_page(directory: Path, output: Path | None) -> int:
    """The run's page beside its attempts, and each attempt's own page in its directory."""
    from sidecar.adapters.report_source import open_local, run_attempt_dirs, write_page
    from sidecar.core.report import render_report
    from sidecar.core.run_page import RunAttempt, render_run_report

    attempts = []
    for attempt_dir in run_attempt_dirs(directory):
        source = open_local(attempt_dir)
        write_page(
            attempt_dir / "report.html",
            render_report(source.artifact, source.samples(), source.console_tail()),
        )
        attempts.append(RunAttempt(attempt_dir.name, source.artifact, f"{attempt_dir.name}/report.html"))
    attempts.sort(
        key=lambda a: (a.artifact.index if a.artifact.index is not None else -1, a.artifact.attempt or 0)
    )
    page = render_run_report(directory.name, attempts)
    target = output or directory / "report.html"
    write_page(target, page)
    print(
        f"soak-sidecar: report {target} ({len(attempts)} attempts, {len(page.encode()) / 1024:.0f} KiB)",
        file=sys.stderr,
    )
    return 0
