"""``soak-sidecar verdict JOB``: the verdict of every attempt of a soak Job, read from its pods.

The attempts and their verdicts are decided in :mod:`sidecar.core.job_pods` from the facts the kube
adapter reads; this module parses the arguments, reads and renders. Exit 0 only when the latest
attempt passed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from sidecar.commands.parsing import Subparsers, UsageParser
from sidecar.core.errors import SoakError
from sidecar.core.job_pods import AttemptRow, end_condition, job_rows, outcomes, run_goodput, slow_rows
from sidecar.core.job_verdict import JobVerdict, job_verdict
from sidecar.core.pod_facts import EventFacts
from sidecar.core.publication import DEFAULT_PREFIX, normalize_prefix

if TYPE_CHECKING:
    from sidecar.adapters.kube.client import KubeClient

REASON_COLUMN = 60
NOT_PASSED = 1
WAIT_POLL_S = 2.0  # how often --wait reads the Job

EPILOG = (
    "exit codes: 0 the latest attempt passed (a multi-pod soak: every index's latest attempt "
    "passed and the Job is Complete, which needs jobs get); 1 it failed, has no verdict yet, or the "
    "Job has no pods; 15 the API refused (RBAC: needs pods list; events list shows the attempts "
    "whose pods are gone); 64 bad kubeconfig or arguments; "
    "151 the API was unreachable"
)


def register(sub: Subparsers[UsageParser], summary: str) -> None:
    parser = sub.add_parser(
        "verdict",
        help=summary,
        description="One row per attempt; exit 0 only when the latest attempt passed.",
    )
    parser.epilog = EPILOG
    parser.add_argument("job", metavar="JOB", help="name of the soak Job")
    parser.add_argument("-n", "--namespace", default=None, help="namespace (default: kubeconfig's)")
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="format (default table)"
    )
    parser.add_argument("--kubeconfig", type=Path, default=None, help="kubeconfig file")
    parser.add_argument(
        "--prefix", default=DEFAULT_PREFIX, help=f"annotation prefix (default {DEFAULT_PREFIX})"
    )
    parser.add_argument("--sidecar-container", default="soak-sidecar", help="sidecar container name")
    parser.add_argument(
        "--wait",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="first wait up to SECONDS for the Job to end, passed or failed (needs jobs get); default 0",
    )
    parser.set_defaults(handler=run)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"expected seconds >= 0, got {text!r}")
    return value


def run(args: argparse.Namespace) -> int:
    # The Kubernetes client loads here, not with the CLI: `run --local` never needs it.
    from sidecar.adapters.kube.client import KubeClient
    from sidecar.adapters.kube.connection import connect, default_namespace
    from sidecar.adapters.kube.reads import job_pods

    try:
        prefix = normalize_prefix(args.prefix)
        api = connect(kubeconfig=args.kubeconfig, prefer_in_cluster=False)
        namespace = args.namespace or default_namespace(args.kubeconfig)
        with KubeClient(api, retries=2, backoff_s=0.5) as client:
            if args.wait:
                _wait_for_job(client, namespace, args.job, args.wait)
            pods = job_pods(client, namespace, args.job)
            rows = job_rows(
                pods,
                _verdict_events(client, namespace),
                job=args.job,
                prefix=prefix,
                sidecar_container=args.sidecar_container,
            )
            # Only a multi-pod soak's pass needs the Job's own condition.
            indexed = any(r.index is not None for r in rows)
            condition = _job_condition(client, namespace, args.job) if indexed else None
    except SoakError as exc:
        print(f"soak-sidecar verdict: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    job = job_verdict(outcomes(rows), job_condition=condition)
    _print(args.output, args.job, namespace, rows, job)
    return 0 if job.passed else NOT_PASSED


def _print(output: str, name: str, namespace: str, rows: Sequence[AttemptRow], job: JobVerdict) -> None:
    goodput = run_goodput(rows)
    slow = slow_rows(rows)
    if output == "json":
        doc = {
            "job": name,
            "namespace": namespace,
            "passed": job.passed,
            "reason": job.reason,
            "goodput": None if goodput is None else goodput[0],
            "ledger": None if goodput is None else goodput[1].ledger,
            "slow_indexes": [{**asdict(each), "ratio": round(each.ratio, 4)} for each in slow],
            "attempts": [asdict(r) for r in rows],
        }
        print(json.dumps(doc, indent=2))
    elif rows:
        print(render_table(rows))
        print(f"job: {'PASSED' if job.passed else 'NOT PASSED'}: {job.reason}")
        if goodput is not None:
            ratio, told = goodput
            where = f"; ledger {told.ledger}" if told.ledger else ""
            since = "of the time since the deadline's start"
            print(f"goodput: {ratio:.1%} {since}, as attempt {told.attempt} left it{where}")
        for each in slow:
            print(f"slow: {each.describe()}")
    if not rows:
        print(f"soak-sidecar verdict: no pods of Job {namespace}/{name}", file=sys.stderr)


def _wait_for_job(client: KubeClient, namespace: str, job: str, timeout_s: float) -> None:
    from sidecar.adapters.kube.reads import read_job

    deadline = time.monotonic() + timeout_s
    while end_condition(read_job(client, namespace, job)) is None:
        if time.monotonic() >= deadline:
            print(
                f"soak-sidecar verdict: Job {namespace}/{job} still running after {timeout_s:g} s",
                file=sys.stderr,
            )
            return
        time.sleep(min(WAIT_POLL_S, max(0.0, deadline - time.monotonic())))


def _job_condition(client: KubeClient, namespace: str, job: str) -> str | None:
    """The Job's end condition; None (with a note) when it cannot be read (RBAC: jobs get)."""
    from sidecar.adapters.kube.reads import read_job

    try:
        return end_condition(read_job(client, namespace, job))
    except SoakError as exc:
        print(f"soak-sidecar verdict: cannot read Job {namespace}/{job}: {exc}", file=sys.stderr)
        return None


def _verdict_events(client: KubeClient, namespace: str) -> list[EventFacts]:
    """The verdict Events of the namespace; none (with a note) when they cannot be listed."""
    from sidecar.adapters.kube.reads import verdict_events

    try:
        return verdict_events(client, namespace)
    except SoakError as exc:
        print(f"soak-sidecar verdict: pods already gone are not shown: {exc}", file=sys.stderr)
        return []


COLUMNS = ("ATTEMPT", "POD", "PHASE", "VERDICT", "CLASSIFICATION", "EXIT", "REASON", "ARTIFACT")


def render_table(rows: Sequence[AttemptRow]) -> str:
    """The attempts, one row each; an INDEX column for a multi-pod soak, a STEPS/S column when a
    trainer wrote progress records (the attempt's mean rate, or the recent one while it runs)."""
    indexed = any(r.index is not None for r in rows)
    header: tuple[str, ...] = COLUMNS
    body: list[tuple[str, ...]] = [
        (
            str(r.attempt),
            r.pod,
            r.phase,
            r.verdict or "-",
            r.classification or "-",
            "-" if r.exit_code is None else str(r.exit_code),
            _clip(r.reason or "-", REASON_COLUMN),
            r.artifact or "-",
        )
        for r in rows
    ]
    if any(r.steps_per_s is not None for r in rows):
        header = ("STEPS/S", *header)
        body = [(_rate(r.steps_per_s), *line) for r, line in zip(rows, body, strict=True)]
    if indexed:
        header = ("INDEX", *header)
        body = [("-" if r.index is None else str(r.index), *line) for r, line in zip(rows, body, strict=True)]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in (header, *body)
    )


def _rate(per_s: float | None) -> str:
    return "-" if per_s is None else f"{per_s:.3g}"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "\u2026"
