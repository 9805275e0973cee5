"""The ``soak-sidecar`` command line. Builds the settings once and wires adapters into the supervisor."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from sidecar import __version__
from sidecar.core.errors import (
    AlreadySupervisedError,
    ConfigError,
    SoakError,
)
from sidecar.core.exitcodes import EXIT_CODE_DESCRIPTIONS, ExitCode
from sidecar.core.ports import MetricsSink
from sidecar.core.redaction import redact_command
from sidecar.settings import Settings, load_settings

EPILOG_RUN = """\
examples:
  soak-sidecar run --local                       # the bundled example trainer, a passing soak
  soak-sidecar run --local -- python3 train.py --epochs 3
  soak-sidecar run --local --budget 3600 --stale-progress 300 -- ./train.sh
  SOAK_S3__BUCKET=soaks soak-sidecar run --local -- ./train.sh   # also upload the artifact
  soak-sidecar run --pod                         # in the chart's sidecar container

Every setting can also come from the environment: SOAK_<GROUP>__<FIELD>, e.g.
SOAK_MONITOR__SAMPLE_INTERVAL_S=2 (see README, "Configuration"). The exit code is the verdict's
(`soak-sidecar exit-codes`).
"""

BUNDLED_SCENARIOS = Path(__file__).resolve().parent / "nvml_mock"


def scenario_path(text: str) -> Path:
    """A scenario file as given, else a bundled scenario by name (works from any directory)."""
    given = Path(text)
    if given.exists():
        return given
    bundled = BUNDLED_SCENARIOS / (text if text.endswith(".json") else f"{text}.json")
    return bundled if bundled.is_file() else given


# Flags of `run` and the setting each one overrides.
RUN_FLAGS: dict[str, tuple[str, str, Callable[[str], Any], str]] = {
    "run_id": (
        "--run-id",
        "deadline.run_id",
        str,
        "run UUID shared by every attempt (default: new)",
    ),
    "budget": ("--budget", "deadline.budget_s", float, "total job budget, seconds"),
    "margin": (
        "--checkpoint-margin",
        "deadline.checkpoint_margin_s",
        float,
        "soft stop before the deadline, seconds",
    ),
    "deadline_dir": (
        "--deadline-dir",
        "deadline.store_dir",
        Path,
        "directory of the file deadline store",
    ),
    "approval": (
        "--approval",
        "deadline.approval_file",
        Path,
        "approval file that must match the identity",
    ),
    "dataset_manifest": (
        "--dataset-manifest",
        "deadline.dataset_manifest",
        Path,
        "file hashed into the identity",
    ),
    "checkpoint": (
        "--checkpoint",
        "deadline.checkpoint_path",
        Path,
        "the run's checkpoint file (joins identity)",
    ),
    "resume_checkpoint": (
        "--resume-checkpoint",
        "deadline.resume_checkpoint",
        Path,
        "resume from this approved checkpoint (the trainer gets --resume PATH)",
    ),
    "output": ("--output", "artifact.output_dir", Path, "local artifact directory"),
    "run_dir": ("--run-dir", "launcher.run_dir", Path, "run dir shared with the launcher"),
    "progress_dir": (
        "--progress-dir",
        "monitor.progress_dir",
        Path,
        "directory the trainer writes progress to",
    ),
    "sample_interval": (
        "--sample-interval",
        "monitor.sample_interval_s",
        float,
        "seconds between samples",
    ),
    "startup_timeout": (
        "--startup-timeout",
        "monitor.startup_timeout_s",
        float,
        "seconds until first progress",
    ),
    "stale_progress": (
        "--stale-progress",
        "monitor.stale_progress_s",
        float,
        "seconds without progress change",
    ),
    "min_duration": (
        "--min-duration",
        "monitor.min_duration_s",
        float,
        "a shorter soak fails, seconds",
    ),
    "grace": (
        "--post-shutdown-grace",
        "monitor.post_shutdown_grace_s",
        float,
        "wait before the residual check",
    ),
    "status": ("--status", "monitor.status_line", str, "live status: auto, tty, json, off"),
    "metrics_port": (
        "--metrics-port",
        "metrics.port",
        int,
        "serve Prometheus metrics on 127.0.0.1:PORT while the soak runs (docs/observability.md)",
    ),
    "gpu_backend": ("--gpu-backend", "gpu.backend", str, "auto, nvml, mock, none"),
    "gpu_scenario": (
        "--gpu-scenario",
        "gpu.mock_scenario",
        scenario_path,
        "mock NVML scenario: a JSON file, or a bundled one by name (two_gpus_growing, old_driver_host_pids)",
    ),
    "s3_bucket": ("--s3-bucket", "s3.bucket", str, "upload the artifact to this bucket"),
    "s3_endpoint": ("--s3-endpoint", "s3.endpoint_url", str, "S3-compatible endpoint URL"),
}

# The embedded default: the bundled example trainer, with a fast cadence so it finishes in seconds.
DEMO_OVERRIDES = {
    "monitor.sample_interval_s": 0.5,
    "monitor.post_shutdown_grace_s": 0.5,
    "monitor.startup_timeout_s": 30.0,
    "monitor.stale_progress_s": 15.0,
}


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for dotted, value in flat.items():
        group, name = dotted.split(".", 1)
        nested.setdefault(group, {})[name] = value
    return nested


def _settings_with(overrides: Mapping[str, Any]) -> Settings:
    """Environment first, then explicit overrides, validated together (one clear error line)."""
    base = load_settings()
    if not overrides:
        return base
    merged = base.model_dump()
    for group, values in _nest(overrides).items():
        merged[group].update(values)
    return load_settings(**merged)


def _explicit(overrides: Mapping[str, Any]) -> set[str]:
    """Settings the user gave (environment or flags), as ``group.field``."""
    base = load_settings()
    from_env = {
        f"{group}.{name}" for group in Settings.model_fields for name in getattr(base, group).model_fields_set
    }
    return from_env | set(overrides)


def _local_layout(settings: Settings, explicit: set[str], run_id: str) -> dict[str, Any]:
    """Local runs keep their run dir and progress dir apart per run id under the output dir, so
    two runs never share (or reset) each other's files; attempts of one run share them, as a
    resumed trainer needs its checkpoints. Paths the user set are left alone."""
    output = settings.artifact.output_dir
    layout = {
        "monitor.progress_dir": output / "runs" / run_id / "progress",
        "launcher.run_dir": output / "runs" / run_id / "run",
        "deadline.store_dir": output / "deadlines",
    }
    return {key: path for key, path in layout.items() if key not in explicit}


def _command(args: argparse.Namespace) -> list[str]:
    """The trainer command given after the flags, without the ``--`` that separates it."""
    command = list(args.command)
    return command[1:] if command[:1] == ["--"] else command


def demo_command() -> list[str]:
    return [sys.executable, "-m", "sidecar.examples.trainer"]


# ---------------------------------------------------------------------- run


def _add_run(sub: argparse._SubParsersAction[UsageParser]) -> None:
    run = sub.add_parser(
        "run",
        help="supervise one soak attempt (local or in a pod)",
        description="Supervise one soak attempt: deadline, launcher, sampling, liveness, run_summary, "
        "verdict, artifact, upload, publication. Exit code = the verdict's.",
        epilog=EPILOG_RUN,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    where = run.add_mutually_exclusive_group()
    where.add_argument("--local", action="store_true", help="spawn the launcher here (default)")
    where.add_argument("--pod", action="store_true", help="pod mode: find the launcher in the shared run dir")
    for dest, (flag, _setting, kind, text) in RUN_FLAGS.items():
        run.add_argument(flag, dest=dest, type=kind, default=None, help=text)
    run.add_argument(
        "--code-file",
        dest="code_files",
        action="append",
        type=Path,
        default=None,
        help="file hashed into the identity (repeatable)",
    )
    run.add_argument(
        "--resume",
        action="store_true",
        default=None,
        help="require the existing deadline record (never a fresh budget)",
    )
    run.add_argument("--require-approval", action="store_true", default=None, help="refuse without approval")
    run.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS... (default: bundled example)")


def _run_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides: dict[str, Any] = {}
    for dest, (_flag, setting, _kind, _text) in RUN_FLAGS.items():
        value = getattr(args, dest)
        if value is not None:
            overrides[setting] = value
    if args.code_files is not None:
        overrides["deadline.code_files"] = args.code_files
    if args.resume:
        overrides["deadline.resume"] = True
    if args.require_approval:
        overrides["deadline.require_approval"] = True
    return overrides


def cmd_run(args: argparse.Namespace) -> int:
    if not args.pod:
        return _run(args)
    try:
        return _run(args)
    except AlreadySupervisedError:
        raise  # the run dir's own sidecar is alive: its launcher is not ours to stop
    except BaseException as exc:
        # Whatever ends the sidecar before the go-ahead (bad settings, unusable dirs, the store down,
        # a bug) must end the trainer container too, or the pod lingers until activeDeadlineSeconds.
        _release_pod_launcher(exc)
        raise


def _release_pod_launcher(exc: BaseException) -> None:
    from sidecar.adapters.rundir.pod import release_waiting_launcher

    if isinstance(exc, SoakError):
        code = int(exc.exit_code)
    elif isinstance(exc, KeyboardInterrupt):
        code = int(ExitCode.CANCELLED)
    else:
        code = int(ExitCode.INTERNAL)
    # The run dir and termination log as configured, read raw: the settings may be what failed.
    raw = os.environ.get("SOAK_LAUNCHER__RUN_DIR")
    done = release_waiting_launcher(Path(raw) if raw else None, f"soak-sidecar exited early: {exc}", code)
    print(f"soak-sidecar: {done}", file=sys.stderr)
    _early_exit_message(Path(os.environ.get("SOAK_KUBE__TERMINATION_LOG") or "/dev/termination-log"), exc)


def _early_exit_message(path: Path, exc: BaseException) -> None:
    """Why the sidecar ended early, in the pod status (soak-sidecar verdict shows it). Only into a
    file the kubelet provided: never creates one on a host."""
    from sidecar.adapters.kube.termination import write_termination_message

    if path.is_file():
        with contextlib.suppress(SoakError):
            write_termination_message(path, f"soak-sidecar: error: {exc}")


def _run(args: argparse.Namespace) -> int:
    from sidecar.app.signals import cancellation_on_signals, ignore_stop_signals
    from sidecar.app.supervisor import Supervisor
    from sidecar.app.values import RunRequest
    from sidecar.app.wiring import build_ports
    from sidecar.core.identity import new_run_id, parse_run_id

    command = _command(args)
    pod = bool(args.pod)
    overrides = _run_overrides(args)
    if pod and command:
        raise ConfigError("pod mode takes no command: the launcher in the trainer container runs it")
    if not pod and not command:
        command = demo_command()
        overrides = {**{k: v for k, v in DEMO_OVERRIDES.items() if k not in overrides}, **overrides}
    settings = _settings_with(overrides)
    if settings.deadline.run_id is None:
        if pod:
            raise ConfigError("pod mode needs a run id (SOAK_DEADLINE__RUN_ID) shared by every attempt")
        run_id = new_run_id()
    else:
        run_id = parse_run_id(settings.deadline.run_id)
    if not pod:
        overrides = {**overrides, **_local_layout(settings, _explicit(overrides), run_id)}
        settings = _settings_with(overrides)

    wiring = build_ports(settings, pod=pod)
    request = RunRequest(
        mode="pod" if pod else "local",
        run_id=run_id,
        command=tuple(command),
        context=wiring.context,
        attempt_label=wiring.attempt_label,
        index=settings.kube.completion_index if pod else None,
        indexes=settings.kube.completions if pod else 1,
    )
    supervisor = Supervisor(settings, wiring.ports, request)
    rules = settings.redaction.rules()
    shown = " ".join(redact_command(command, rules)) if command else "(the launcher's command)"
    print(f"soak-sidecar: run {run_id} ({'pod' if pod else 'local'}): {shown}", file=sys.stderr)
    try:
        with cancellation_on_signals():
            result = supervisor.run()
            # The verdict is decided and the artifact written: a late signal is ignored from here on.
            ignore_stop_signals()
        ignore_stop_signals()  # leaving the block restored the defaults
    finally:
        _close_metrics(wiring.ports.metrics, settings.metrics.linger_s)
    verdict = result.verdict
    line = f"soak-sidecar: {verdict.status.upper()}"
    if verdict.classification:
        line += f" [{verdict.classification}] {verdict.reason}"
    print(line, file=sys.stderr)
    where = result.artifact_path or "not written (the reason is above)"
    print(f"soak-sidecar: artifact {where} (exit code {result.exit_code})", file=sys.stderr)
    return result.exit_code


def _close_metrics(metrics: MetricsSink | None, linger_s: float) -> None:
    """Keep /metrics up ``linger_s`` after the verdict (a scrape then sees soak_verdict_info)."""
    if metrics is None:
        return
    if linger_s:
        time.sleep(linger_s)
    metrics.close()


# ---------------------------------------------------------------------- other commands


def cmd_validate(args: argparse.Namespace) -> int:
    from sidecar.adapters.validators import resolve_manifest_validator
    from sidecar.core.run_summary import evaluate_run_summary

    settings = load_settings()
    spec = args.manifest_validator or settings.summary.manifest_validator
    try:
        raw = args.path.read_bytes() if str(args.path) != "-" else sys.stdin.buffer.read()
    except OSError as exc:
        raise ConfigError(f"cannot read {args.path}: {exc}") from exc
    validator = resolve_manifest_validator(spec)
    outcome = evaluate_run_summary(
        raw,
        mtime=None,
        run_started_wall=None,
        max_bytes=settings.summary.max_bytes,
        manifest_validator=validator,
    )
    if args.json:
        print(
            json.dumps(
                {
                    "valid": outcome.passed,
                    "classification": outcome.classification,
                    "failures": list(outcome.failures),
                },
                indent=2,
            )
        )
    elif outcome.passed:
        print(f"{args.path}: valid")
    else:
        for failure in outcome.failures:
            print(f"{args.path}: {failure}")
        print(f"{args.path}: INVALID ({outcome.classification})")
    return 0 if outcome.passed else int(ExitCode.CONTRACT_VIOLATION)


def cmd_schema(args: argparse.Namespace) -> int:
    if args.which == "run-summary":
        from sidecar.core.run_summary import run_summary_json_schema

        schema = run_summary_json_schema()
    elif args.which == "artifact":
        from sidecar.core.artifact import Artifact

        schema = Artifact.model_json_schema()
    else:
        schema = Settings.model_json_schema()
    print(json.dumps(schema, indent=2, sort_keys=True))
    return 0


def cmd_exit_codes(args: argparse.Namespace) -> int:
    from sidecar.core.verdict import classifications_for, exit_code_table_markdown

    if not args.json:
        print(exit_code_table_markdown())
        return 0
    rows = [
        {
            "code": int(code),
            "name": code.name,
            "retryable": code.retryable,
            "meaning": EXIT_CODE_DESCRIPTIONS[code],
            "classifications": classifications_for(code),
        }
        for code in ExitCode
    ]
    print(json.dumps(rows, indent=2))
    return 0


def cmd_install_launcher(args: argparse.Namespace) -> int:
    from sidecar.adapters.rundir.zipapp import build_launcher

    target = build_launcher(args.dest)
    print(f"soak-sidecar: launcher installed at {target}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from sidecar.adapters.report_source import LocalSource, open_source
    from sidecar.core.report import render_report

    source = open_source(args.path, load_settings().s3)
    page = render_report(source.artifact, source.samples())
    default = source.directory / "report.html" if isinstance(source, LocalSource) else Path("report.html")
    output: Path = args.output or default
    output.write_text(page, encoding="utf-8")
    note = f" ({source.skipped_lines} unreadable sample lines skipped)" if source.skipped_lines else ""
    print(f"soak-sidecar: report {output} ({len(page.encode()) / 1024:.0f} KiB){note}", file=sys.stderr)
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    from sidecar.adapters.identity_files import identity_from_settings
    from sidecar.core.approval import render_approval
    from sidecar.core.identity import parse_run_id

    command = _command(args)
    if not command:
        raise ConfigError("approve needs the trainer command after --")
    overrides = _run_overrides(args)
    settings = _settings_with(overrides)
    if settings.deadline.run_id is None:
        raise ConfigError("approve needs --run-id (the run UUID the approval binds)")
    run_id = parse_run_id(settings.deadline.run_id)
    settings = _settings_with({**overrides, **_local_layout(settings, _explicit(overrides), run_id)})
    store = args.store_location or str(settings.deadline.store_dir.resolve())
    identity = identity_from_settings(
        settings.deadline,
        run_id=run_id,
        command=command,
        deadline_store=store,
        redaction=settings.redaction.rules(),
    )
    sys.stdout.write(render_approval(identity).decode())
    return 0


class UsageParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exits with the table's USAGE code (64), not 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _add_approve(sub: argparse._SubParsersAction[UsageParser]) -> None:
    approve = sub.add_parser(
        "approve",
        help="print the approval record for a run, to review and pass as --approval",
        description="Compute the run identity exactly as `run` would and print the approval record.",
    )
    # The identity's inputs; the other run flags do not change an approval.
    approve_flags = ("run_id", "budget", "margin", "dataset_manifest", "checkpoint", "deadline_dir")
    for dest in approve_flags:
        flag, _setting, kind, text = RUN_FLAGS[dest]
        if dest == "run_id":
            text = "run UUID the approval binds (required)"
        approve.add_argument(flag, dest=dest, type=kind, default=None, help=text)
    approve.set_defaults(**{dest: None for dest in set(RUN_FLAGS) - set(approve_flags)})
    approve.set_defaults(resume=None, require_approval=None)
    approve.add_argument(
        "--code-file",
        dest="code_files",
        action="append",
        type=Path,
        default=None,
        help="file hashed into the identity (repeatable; as given to run)",
    )
    approve.add_argument("--store-location", help="deadline store location as `run` reports it")
    approve.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")


def build_parser() -> argparse.ArgumentParser:
    parser = UsageParser(
        prog="soak-sidecar",
        description="Supervise long-running GPU training soaks: a persistent deadline that is never "
        "extended, subreaper cleanup, process/GPU sampling, run_summary validation, a self-contained "
        "artifact (local and S3) and a verdict exit code.",
        epilog="Start with: soak-sidecar run --local   (runs the bundled example trainer)",
    )
    parser.add_argument("--version", action="version", version=f"soak-sidecar {__version__}")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND", parser_class=UsageParser)
    _add_run(sub)

    validate = sub.add_parser(
        "validate",
        help="validate a run_summary.json offline",
        description="Validate a run_summary.json against the contract; print "
        f"each failure; exit {int(ExitCode.CONTRACT_VIOLATION)} when invalid.",
    )
    validate.add_argument("path", type=Path, help="run_summary.json ('-' for stdin)")
    validate.add_argument("--manifest-validator", help="runtime-manifest validator 'module:function'")
    validate.add_argument("--json", action="store_true", help="machine-readable output")

    schema = sub.add_parser("schema", help="print a JSON Schema", description="Print a JSON Schema.")
    schema.add_argument(
        "which",
        metavar="SCHEMA",
        choices=["run-summary", "artifact", "settings"],
        help="run-summary, artifact or settings",
    )

    codes = sub.add_parser(
        "exit-codes",
        help="print the exit-code table",
        description="Print every exit code of `run`, whether it is retryable (128+), what it means "
        "and which verdict classifications map to it (the chart's podFailurePolicy uses the same table).",
    )
    codes.add_argument("--json", action="store_true")

    install = sub.add_parser(
        "install-launcher",
        help="copy the stdlib-only launcher (init container)",
        description="Copy the launcher (one Python file, standard library only, Python 3.9+) into DEST "
        "as soak-launcher.py, for the trainer container to run: "
        "python3 DEST/soak-launcher.py --run-dir /soak/run -- CMD ARGS...",
    )
    install.add_argument("--dest", type=Path, required=True, help="directory, e.g. /soak/bin")

    _add_approve(sub)

    from sidecar.commands import verdict as verdict_command

    verdict = sub.add_parser(
        "verdict",
        help="read a Job's verdicts from its pods' annotations",
        description="One row per attempt; exit 0 only when the latest attempt passed.",
    )
    verdict_command.add_arguments(verdict)

    _add_report(sub)
    return parser


def _add_report(sub: argparse._SubParsersAction[UsageParser]) -> None:
    report = sub.add_parser(
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
    report.add_argument("path", help="artifact.json, the attempt's directory, or an s3:// URI of either")
    report.add_argument(
        "-o",
        "--output",
        type=Path,
        help="where to write it (default: report.html beside a local artifact, ./report.html for S3)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handlers = {
        "run": cmd_run,
        "validate": cmd_validate,
        "schema": cmd_schema,
        "exit-codes": cmd_exit_codes,
        "install-launcher": cmd_install_launcher,
        "approve": cmd_approve,
        "report": cmd_report,
    }
    try:
        if args.cmd == "verdict":
            from sidecar.commands import verdict as verdict_command

            return verdict_command.run(args)
        return handlers[args.cmd](args)
    except SoakError as exc:
        print(f"soak-sidecar: error: {exc}", file=sys.stderr)
        return int(exc.exit_code)
    except KeyboardInterrupt:
        print("soak-sidecar: interrupted", file=sys.stderr)
        return int(ExitCode.CANCELLED)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
