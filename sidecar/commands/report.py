"""``soak-sidecar report``: one self-contained HTML page of an attempt, local or on S3."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.commands.parsing import Subparsers, UsageParser
from sidecar.core.errors import ConfigError, SoakError

if TYPE_CHECKING:
    from sidecar.adapters.report_source import Source
    from sidecar.adapters.report_source.runs import RunSources


def register(sub: Subparsers[UsageParser], summary: str) -> None:
    parser = sub.add_parser(
        "report",
        help=summary,
        description="One HTML file (inline SVG plots, no network, no JavaScript) from an artifact and "
        "its samples.jsonl.gz: the verdict, plots of every sample with the soft stop, TERM and KILL "
        "marked, leak trends, leftover processes and the run summary figures.",
        epilog="examples:\n  soak-sidecar report soak-output/runs/RUN_ID/attempt-1\n"
        "  soak-sidecar report soak-output/runs/RUN_ID\n"
        "  soak-sidecar report s3://soaks/soak-sidecar/NS/JOB/RUN_ID/attempt-1/artifact.json -o report.html\n"
        "  soak-sidecar report s3://soaks/soak-sidecar/NS/JOB/RUN_ID/   (the whole run, into ./RUN_ID/)\n"
        "S3 reads use the SOAK_S3__* settings (endpoint, region, credentials) as the sidecar does.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "path",
        help="artifact.json, the attempt's directory, or an s3:// URI of either; or a run's directory "
        "(soak-output/runs/RUN_ID) or its s3:// prefix (where its ledger.json is): one page for all its "
        "attempts, where the budget went, each attempt's own page beside it",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="where to write it (default: report.html beside a local artifact or in a run's directory, "
        "./report.html for an S3 attempt, ./RUN_ID/ for an S3 run: a directory, or its page's .html path)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from sidecar.adapters.report_source import LocalSource, is_run_dir, open_source, write_page
    from sidecar.adapters.report_source.runs import open_local_run, open_s3_run, s3_run_prefix
    from sidecar.core.report import render_report
    from sidecar.settings import load_settings

    if args.path.startswith("s3://"):
        settings = load_settings().s3
        if s3_run_prefix(args.path, settings):
            run = open_s3_run(args.path, settings)
            out: Path = args.output or Path(run.run_id)
            target = out if out.suffix == ".html" else out / "report.html"
            # Folder names come from the bucket: all under attempts/, none can be the run's page.
            return _run_page(run, target.parent / "attempts", target, make_dirs=True)
    elif is_run_dir(Path(args.path)):
        directory = Path(args.path)
        target = args.output or directory / "report.html"
        return _run_page(open_local_run(directory), directory, target, make_dirs=False)
    source = open_source(args.path, load_settings().s3)
    page = render_report(source.artifact, source.samples(), source.console_tail(), source.mismatched.copy)
    default = source.directory / "report.html" if isinstance(source, LocalSource) else Path("report.html")
    output: Path = args.output or default
    write_page(output, page)
    note = f" ({source.skipped_lines} unreadable sample lines skipped)" if source.skipped_lines else ""
    print(f"soak-sidecar: report {output} ({len(page.encode()) / 1024:.0f} KiB){note}", file=sys.stderr)
    _tell_integrity(source)
    return 0


def _tell_integrity(source: Source) -> None:
    """One line per object whose bytes differ from its artifact's record, and unverified uploads."""
    for line in source.mismatched:
        print(f"soak-sidecar: {line}", file=sys.stderr)
    if source.artifact.checksums_unverified:
        print("soak-sidecar: the store did not confirm the uploads' SHA-256 (unverified)", file=sys.stderr)


def _run_page(run: RunSources, pages: Path, target: Path, *, make_dirs: bool) -> int:
    """The run's page at ``target``, each attempt's own page in ``pages``/<its name>/ (a local run's
    attempt directories, or folders made for an S3 run's)."""
    from sidecar.adapters.report_source import write_page
    from sidecar.core.ledger.record import parse_ledger
    from sidecar.core.report import render_report
    from sidecar.core.run_page import RunAttempt, render_run_report

    attempts = []
    for name, source in run.attempts:
        folder = pages / name
        try:
            if make_dirs:
                folder.mkdir(parents=True, exist_ok=True)
            page = render_report(
                source.artifact, source.samples(), source.console_tail(), source.mismatched.copy
            )
            write_page(folder / "report.html", page)
            _tell_integrity(source)
        except (SoakError, OSError) as exc:  # one damaged attempt leaves the others their page
            run.skipped.append(f"{name} ({exc})")
            continue
        link = os.path.relpath(folder / "report.html", target.parent)
        attempts.append(
            RunAttempt(name, source.artifact, f"./{Path(link).as_posix()}", bool(source.mismatched))
        )
    attempts.sort(
        key=lambda a: (a.artifact.index if a.artifact.index is not None else -1, a.artifact.attempt or 0)
    )
    ledger = None
    if run.ledger is not None:
        try:
            ledger = parse_ledger(run.ledger, run.ledger_where)
        except ConfigError as exc:
            print(f"soak-sidecar: the ledger is not shown: {exc}", file=sys.stderr)
        if ledger is not None and ledger.run_id != run.run_id:
            print(f"soak-sidecar: the ledger is not shown: it is run {ledger.run_id}'s", file=sys.stderr)
            ledger = None
    page = render_run_report(run.run_id, attempts, ledger)
    write_page(target, page)
    for skipped in run.skipped:
        print(f"soak-sidecar: skipped {skipped}", file=sys.stderr)
    counted = f"{len(attempts)} attempt{'s' if len(attempts) != 1 else ''}"
    print(f"soak-sidecar: report {target} ({counted}, {len(page.encode()) / 1024:.0f} KiB)", file=sys.stderr)
    return 0
