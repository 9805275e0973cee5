"""Before the trainer starts: usable directories, the run identity, its approval, the deadline record."""

from __future__ import annotations

from pathlib import PurePath

from sidecar.app.ports import IdentityFiles, Ports, WorkDirs
from sidecar.app.values import Launched, Mode, Preflight, Started
from sidecar.core.approval import attempt_command, check_approval
from sidecar.core.deadline import DeadlineClock, check_startable, obtain_record, parse_record
from sidecar.core.errors import ConfigError, SoakError
from sidecar.settings import DeadlineSettings, Settings


def prepare_dirs(settings: Settings, mode: Mode, workdirs: WorkDirs) -> None:
    """Unusable directories are a usage error now, not a lost artifact after the run.

    The sidecar writes the run dir and its output; the progress dir it only reads (in a pod it is
    the trainer's volume, mounted read-only into the sidecar), and creates it only locally.
    """
    own = [settings.launcher.run_dir, settings.artifact.output_dir]
    progress = settings.monitor.progress_dir
    if mode == "local":
        workdirs.require(writable=[progress, *own], readable=[])
    else:
        workdirs.require(writable=own, readable=[progress])


def with_recorded_budget(dset: DeadlineSettings, existing: bytes | None) -> DeadlineSettings:
    """A resumed run's budget and margin are its record's unless the user set them: ``--run-id``
    alone resumes. A value that was set and differs still changes the identity, and is refused."""
    unset = {"budget_s", "checkpoint_margin_s"} - dset.model_fields_set
    if existing is None or not unset:
        return dset
    try:
        record = parse_record(existing, max_budget_s=dset.max_budget_s)
    except SoakError:
        return dset  # obtain_record refuses the record and says why
    recorded = {"budget_s": record.budget_seconds, "checkpoint_margin_s": record.checkpoint_margin_seconds}
    return dset.model_copy(update={name: recorded[name] for name in unset})


def resume_request(dset: DeadlineSettings, files: IdentityFiles, *, starting: bool) -> str | None:
    """The checkpoint this attempt asks to resume from: the one named, or with auto_resume the run's
    own checkpoint record when it exists (a retried pod); None for a fresh start. Only the sidecar
    that starts the trainer decides: one restarted beside a running trainer finds the record the
    trainer has written since, which this attempt did not resume from."""
    if dset.resume_checkpoint is not None:
        return files.canonical_path(dset.resume_checkpoint)
    if not dset.auto_resume or dset.checkpoint_path is None or not starting:
        return None
    record = files.canonical_path(dset.checkpoint_path)
    return record if files.is_file(record) else None


def check_checkpoint_location(settings: Settings, files: IdentityFiles) -> None:
    """The trainer writes the run's checkpoint record: never in a folder the sidecar keeps for itself
    (the deadline store, the run dir), where it could overwrite a record of the sidecar's."""
    if settings.deadline.checkpoint_path is None:
        return
    record = PurePath(files.canonical_path(settings.deadline.checkpoint_path))
    own = [("the run dir", settings.launcher.run_dir)]
    if settings.deadline.store == "file":
        own.append(("the deadline store", settings.deadline.store_dir))
    for name, folder in own:
        if record.is_relative_to(files.canonical_path(folder)):
            raise ConfigError(
                f"the checkpoint record {record} is inside {name} ({folder}): the trainer writes it; "
                "give --checkpoint a path of the trainer's own"
            )


def preflight(settings: Settings, ports: Ports, started: Started, launched: Launched) -> Preflight:
    """The rules before a start: approval of this identity, a deadline never extended, and
    no start inside the checkpoint margin (a restarted sidecar finds its trainer running)."""
    existing = ports.store.load(started.request.run_id)
    dset = with_recorded_budget(settings.deadline, existing)
    files = ports.identity_files
    identity = files.identity(
        dset,
        run_id=started.request.run_id,
        command=launched.command,
        deadline_store=ports.store.location,
        image_digest=ports.image_digest(),
        redaction=settings.redaction.rules(),
    )
    check_checkpoint_location(settings, files)
    resume_checkpoint = resume_request(dset, files, starting=not started.already_going)
    check_approval(
        None if dset.approval_file is None else files.read_approval(dset.approval_file),
        identity,
        required=dset.require_approval or dset.approval_file is not None,
        resume_checkpoint=resume_checkpoint,
        resume_checkpoint_exists=None if resume_checkpoint is None else files.is_file(resume_checkpoint),
    )
    extra_args = attempt_command(identity, resume_checkpoint, resume_flag=dset.resume_flag)[
        len(identity.command) :
    ]
    clock = ports.clock
    # Read once: it stamps a new record and bounds this attempt.
    reference = None if ports.reference_clock is None else ports.reference_clock.now()
    obtained = obtain_record(
        ports.store,
        identity,
        now_wall=clock.wall(),
        resume_required=dset.resume or resume_checkpoint is not None,
        max_budget_s=dset.max_budget_s,
        boot=clock.boot(),
        reference=reference,
    )
    record = obtained.record
    deadline = DeadlineClock(
        record,
        now_wall=clock.wall(),
        now_monotonic=clock.monotonic(),
        boot=clock.boot(),
        reference=reference,
        store=ports.store.store_clock(started.request.run_id),
    )
    if not started.already_going:
        check_startable(deadline, clock.wall(), clock.monotonic())
    return Preflight(
        record=record,
        clock=deadline,
        resumed=not obtained.created,
        remaining_at_start_s=deadline.remaining(clock.wall(), clock.monotonic()),
        resume_checkpoint=resume_checkpoint,
        checkpoint_record=identity.resume_checkpoint_path,
        extra_args=tuple(extra_args),
    )
