"""``soak-sidecar run``: one soak attempt, locally (the launcher spawned here) or in a pod."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time

from sidecar.commands.parsing import (
    RUN_FLAGS,
    Subparsers,
    UsageParser,
    add_run_flags,
    flag_names,
    flag_settings,
    trainer_command,
)
from sidecar.core.errors import AlreadySupervisedError, SoakError
from sidecar.core.exitcodes import ExitCode
from sidecar.core.ports import MetricsSink
from sidecar.core.redaction import redact_command
from sidecar.settings import load_settings, pod_release_paths, with_defaults

# The embedded default: the bundled example trainer, with a fast cadence so it finishes in seconds
# (below the environment and the flags).
# A local run's own defaults (below the environment and the flags): `docker stop`, CI runners' and
# Slurm's timeouts SIGKILL 10-30 s after their SIGTERM, and the artifact must be written before it.
LOCAL_SETTINGS = {"launcher.stop_grace_s": 5.0}
DEMO_SETTINGS = {
    "monitor.sample_interval_s": 0.5,
    "monitor.post_shutdown_grace_s": 0.5,
    "monitor.startup_timeout_s": 30.0,
    "monitor.stale_progress_s": 15.0,
}
DEMO_FLAGS = {
    "monitor.sample_interval_s": "--sample-interval",
    "monitor.post_shutdown_grace_s": "--post-shutdown-grace",
    "monitor.startup_timeout_s": "--startup-timeout",
    "monitor.stale_progress_s": "--stale-progress",
}
DEMO_TIMINGS = ", ".join(f"{DEMO_FLAGS[name]} {value:g}" for name, value in DEMO_SETTINGS.items())

EPILOG = f"""\
examples:
  soak-sidecar run --local                       # the bundled example trainer, a passing soak
  soak-sidecar run --local -- python3 train.py --epochs 3
  soak-sidecar run --local --budget 3600 --stale-progress 300 -- ./train.sh
  SOAK_S3__BUCKET=soaks soak-sidecar run --local -- ./train.sh   # also upload the artifact
  soak-sidecar run --pod                         # in the chart's sidecar container

Without a command, the bundled example trainer runs on a fast cadence so the demo ends in seconds:
{DEMO_TIMINGS} (seconds),
unless flags or the environment set them.

Every setting can also come from the environment: SOAK_<GROUP>__<FIELD>, e.g.
SOAK_MONITOR__SAMPLE_INTERVAL_S=2 (see README, "Configuration"). The exit code is the verdict's
(`soak-sidecar exit-codes`).
"""


def demo_command() -> list[str]:
    return [sys.executable, "-m", "sidecar.examples.trainer"]


def register(sub: Subparsers[UsageParser], summary: str) -> None:
    parser = sub.add_parser(
        "run",
        help=summary,
        description="Supervise one soak attempt: deadline, launcher, sampling, liveness, run_summary, "
        "verdict, artifact, upload, publication. Exit code = the verdict's.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="spawn the launcher here (default)")
    where.add_argument("--pod", action="store_true", help="pod mode: find the launcher in the shared run dir")
    add_run_flags(parser, RUN_FLAGS, code_file_help="file hashed into the identity (repeatable)")
    parser.add_argument(
        "--resume",
        action="store_true",
        default=None,
        help="require the existing deadline record (never a fresh budget)",
    )
    parser.add_argument(
        "--auto-resume",
        action="store_true",
        default=None,
        help="resume from --checkpoint whenever that file exists (a retried attempt, no hand step)",
    )
    parser.add_argument(
        "--require-approval", action="store_true", default=None, help="refuse without approval"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS... (default: bundled example)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if not args.pod:
        return _supervise(args)
    try:
        return _supervise(args)
    except AlreadySupervisedError:
        raise  # the run dir's own sidecar is alive: its launcher is not ours to stop
    except BaseException as exc:
        # Whatever ends the sidecar before the go-ahead (bad settings, unusable dirs, the store down,
        # a bug) must end the trainer container too, or the pod lingers until activeDeadlineSeconds.
        _release_pod_launcher(exc)
        raise


def _release_pod_launcher(exc: BaseException) -> None:
    from sidecar.adapters.kube.termination import write_termination_message
    from sidecar.adapters.procfs import same_process_alive
    from sidecar.adapters.provenance import boot_id
    from sidecar.adapters.rundir.pod import release_waiting_launcher

    if isinstance(exc, SoakError):
        code = int(exc.exit_code)
    elif isinstance(exc, KeyboardInterrupt):
        code = int(ExitCode.CANCELLED)
    else:
        code = int(ExitCode.INTERNAL)
    run_dir, termination_log = pod_release_paths()
    done = release_waiting_launcher(
        run_dir,
        f"soak-sidecar exited early: {exc}",
        code,
        is_running=same_process_alive,
        boot_id=boot_id(),
    )
    print(f"soak-sidecar: {done}", file=sys.stderr)
    # Why the sidecar ended early, in the pod status (soak-sidecar verdict shows it). Only into a
    # file the kubelet provided: never creates one on a host.
    if termination_log.is_file():
        with contextlib.suppress(SoakError):
            write_termination_message(termination_log, f"soak-sidecar: error: {exc}")


def _supervise(args: argparse.Namespace) -> int:
    from sidecar.app.setup import prepare_run
    from sidecar.app.signals import cancellation_on_signals, ignore_stop_signals
    from sidecar.app.supervisor import Supervisor

    command = trainer_command(args)
    settings = load_settings(flag_settings(args), flag_names=flag_names(args))
    if not args.pod:
        settings = with_defaults(settings, LOCAL_SETTINGS)
    if not args.pod and not command:
        command = demo_command()
        settings = with_defaults(settings, DEMO_SETTINGS)
    prepared = prepare_run(settings, command, pod=bool(args.pod))
    settings, request = prepared.settings, prepared.request
    shown = (
        " ".join(redact_command(command, settings.redaction.rules()))
        if command
        else "(the launcher's command)"
    )
    print(f"soak-sidecar: run {request.run_id} ({request.mode}): {shown}", file=sys.stderr)
    try:
        with cancellation_on_signals():
            result = Supervisor(settings, prepared.wiring.ports, request).run()
            # The verdict is decided and the artifact written: a late signal is ignored from here on.
            ignore_stop_signals()
        ignore_stop_signals()  # leaving the block restored the defaults
    finally:
        _close_metrics(prepared.wiring.ports.metrics, settings.metrics.linger_s)
    verdict = result.verdict
    line = f"soak-sidecar: {verdict.status.upper()}"
    if verdict.classification:
        line += f" [{verdict.classification}] {verdict.reason}"
    print(line, file=sys.stderr)
    where = result.artifact_path or "not written (the reason is above)"
    print(f"soak-sidecar: artifact {where} (exit code {result.exit_code})", file=sys.stderr)
    if request.mode == "local" and (result.exit_code == ExitCode.CANCELLED or result.exit_code >= 128):
        # The run may go on, on its one deadline: what the next attempt must be given.
        print(
            f"soak-sidecar: to go on with this run, give the next attempt --run-id {request.run_id}",
            file=sys.stderr,
        )
    return result.exit_code


def _close_metrics(metrics: MetricsSink | None, linger_s: float) -> None:
    """Keep /metrics up ``linger_s`` after the verdict (a scrape then sees soak_verdict_info)."""
    if metrics is None:
        return
    if linger_s:
        time.sleep(linger_s)
    metrics.close()
