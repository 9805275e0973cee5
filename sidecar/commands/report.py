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
        help="write one self-contained HTML report of an attempt",
        description="One HTML file (inline SVG plots, no network, no JavaScript) from an artifact and "
        "its samples.jsonl.gz: the verdict, plots of every sample with the soft stop, TERM and KILL "
        "marked, leak trends, leftover processes and the run summary figures.",
        epilog="examples:\n  soak-sidecar report soak-output/runs/RUN_ID/attempt-1\n"
        "  soak-sidecar report s3://soaks/soak-sidecar/NS/JOB/RUN_ID/attempt-1/artifact.json -o report.html\n"
        "S3 reads use the SOAK_S3__* settings (endpoint, region, credentials) as the sidecar does.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("path", help="artifact.json, the attempt's directory, or an s3:// URI of either")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="where to write it (default: report.html beside a local artifact, ./report.html for S3)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.adapters.report_source import LocalSource, open_source, write_page
    from sidecar.core.report import render_report

    source = open_source(args.path, load_settings().s3)
    page = render_report(source.artifact, source.samples(), source.console_tail())
    default = source.directory / "report.html" if isinstance(source, LocalSource) else Path("report.html")
    output: Path = args.output or default
    write_page(output, page)
    note = f" ({source.skipped_lines} unreadable sample lines skipped)" if source.skipped_lines else ""
    print(f"soak-sidecar: report {output} ({len(page.encode()) / 1024:.0f} KiB){note}", file=sys.stderr)
    return 0
