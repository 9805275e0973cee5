"""What the commands share: the parser class, and the ``run`` flags that override settings."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args, get_origin

from sidecar.core.exitcodes import ExitCode


class UsageParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line and exits with the table's USAGE code (64), not 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(int(ExitCode.USAGE), f"{self.prog}: error: {message} (see {self.prog} --help)\n")


# argparse names no public type for add_subparsers()' result.
Subparsers = argparse._SubParsersAction


def scenario_path(text: str) -> Path:
    """A scenario file as given, else a bundled scenario by name (works from any directory)."""
    from sidecar.nvml_mock.bundled import DIRECTORY

    given = Path(text)
    if given.exists():
        return given
    bundled = DIRECTORY / (text if text.endswith(".json") else f"{text}.json")
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
        "resume from this approved checkpoint (the trainer gets it in $SOAK_RESUME_CHECKPOINT)",
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
    "stop_grace": (
        "--stop-grace",
        "launcher.stop_grace_s",
        float,
        "seconds the trainer gets to checkpoint after a stop from outside",
    ),
    "stale_progress": (
        "--stale-progress",
        "monitor.stale_progress_s",
        float,
        "seconds without progress change",
    ),
    "stale_eval": (
        "--stale-eval",
        "monitor.stale_eval_s",
        float,
        "seconds without progress change while the trainer's last record says phase eval",
    ),
    "stale_checkpoint": (
        "--stale-checkpoint",
        "monitor.stale_checkpoint_s",
        float,
        "seconds without progress change while the trainer's last record says phase checkpoint",
    ),
    "stale_data": (
        "--stale-data",
        "monitor.stale_data_s",
        float,
        "seconds without progress change while the trainer's last record says phase data",
    ),
    "stale_compile": (
        "--stale-compile",
        "monitor.stale_compile_s",
        float,
        "seconds without progress change while the trainer's last record says phase compile",
    ),
    "max_rss_growth": (
        "--max-rss-growth",
        "monitor.max_rss_growth_mib",
        float,
        "fail when the tree's RSS grows more, MiB",
    ),
    "max_cgroup_memory_growth": (
        "--max-cgroup-memory-growth",
        "monitor.max_cgroup_memory_growth_mib",
        float,
        "fail when the cgroup's anon+shmem memory grows more, MiB",
    ),
    "max_fd_growth": (
        "--max-fd-growth",
        "monitor.max_fd_growth",
        int,
        "fail when the tree's fd count grows more",
    ),
    "drop_percent": (
        "--max-throughput-drop",
        "monitor.max_throughput_drop_pct",
        float,
        "fail when the throughput drops more, percent an hour (or see --throughput-drop-basis)",
    ),
    "throughput_drop_basis": (
        "--throughput-drop-basis",
        "monitor.throughput_drop_basis",
        str,
        "what --max-throughput-drop is against: per_hour (the trend) or first_hour",
    ),
    "summary_profile": (
        "--summary-profile",
        "summary.profile",
        str,
        "run_summary rules: core or replay",
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
        "mock NVML scenario: a JSON file, or a bundled one by name",
    ),
    "s3_bucket": ("--s3-bucket", "s3.bucket", str, "upload the artifact to this bucket"),
    "s3_endpoint": ("--s3-endpoint", "s3.endpoint_url", str, "S3-compatible endpoint URL"),
}


def add_run_flags(
    parser: argparse.ArgumentParser,
    names: Collection[str],
    *,
    code_file_help: str,
    helps: Mapping[str, str] | None = None,
) -> None:
    """The ``run`` flags ``names`` (keys of RUN_FLAGS; ``helps`` rewords some) and ``--code-file``.
    A flag's help is its setting's description, which states the unit and the default."""
    # The settings model (pydantic) is imported by the commands that take these flags only: the
    # others, and the top-level --help, start without it.
    from sidecar.settings import Settings

    for dest in names:
        flag, setting, kind, text = RUN_FLAGS[dest]
        group, field = setting.split(".")
        described = Settings.model_fields[group].annotation.model_fields[field]  # type: ignore[union-attr]
        default_help = (described.description or text).replace("%", "%%")
        # A setting of a few named values lists them in the usage, and refuses others there.
        choices = get_args(described.annotation) if get_origin(described.annotation) is Literal else None
        parser.add_argument(
            flag,
            dest=dest,
            type=kind,
            default=None,
            choices=choices,
            help=(helps or {}).get(dest, default_help),
        )
    parser.add_argument(
        "--code-file", dest="code_files", action="append", type=Path, default=None, help=code_file_help
    )


def _given(args: argparse.Namespace) -> dict[str, tuple[str, Any]]:
    """``{"group.field": (flag, value)}`` for each flag given."""
    given: dict[str, tuple[str, Any]] = {}
    for dest, (flag, setting, _kind, _text) in RUN_FLAGS.items():
        value = getattr(args, dest, None)
        if value is not None:
            given[setting] = (flag, value)
    if args.code_files is not None:
        given["deadline.code_files"] = ("--code-file", args.code_files)
    if getattr(args, "resume", None):
        given["deadline.resume"] = ("--resume", True)
    if getattr(args, "auto_resume", None):
        given["deadline.auto_resume"] = ("--auto-resume", True)
    if getattr(args, "require_approval", None):
        given["deadline.require_approval"] = ("--require-approval", True)
    return given


def flag_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the flags given override, as ``{"group.field": value}``."""
    return {setting: value for setting, (_flag, value) in _given(args).items()}


def flag_names(args: argparse.Namespace) -> dict[str, str]:
    """The flag that set each of ``flag_settings``, as ``{"group.field": flag}``: what errors name."""
    return {setting: flag for setting, (flag, _value) in _given(args).items()}


def trainer_command(args: argparse.Namespace) -> list[str]:
    """The trainer command given after the flags, without the ``--`` that separates it."""
    command = list(args.command)
    return command[1:] if command[:1] == ["--"] else command
