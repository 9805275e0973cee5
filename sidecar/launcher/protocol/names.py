"""The protocol's names and limits: run-dir files, reasons, actions, environment, exit codes."""

from __future__ import annotations

PROTOCOL = 1
# The oldest Python a trainer image may bring to run the launcher (CI runs the built file under it).
MIN_PYTHON = (3, 9)
# The name the launcher is installed and run under (one zipapp file); the sidecar finds it by it.
LAUNCHER_FILE_NAME = "soak-launcher.py"
# Beside the launcher's file: the trainer kit's package (soak_sidecar_kit) in this folder, which the
# launcher adds to the trainer's PYTHONPATH, so a trainer imports it with nothing installed.
KIT_DIR_NAME = "kit"
KIT_PACKAGE = "soak_sidecar_kit"

LAUNCHER_FILE = "launcher.json"
GO_FILE = "go.json"
ABORT_FILE = "abort.json"
HEARTBEAT_FILE = "sidecar.heartbeat"
CONTROL_FILE = "control.json"
SOFT_STOP_FILE = "soft-stop.json"
TRAINER_FILE = "trainer.json"
EXIT_FILE = "exit.json"
# The launcher's fd tables of the trainer's tree, for a sidecar that cannot read them itself.
FD_REPORT_FILE = "fds.json"
# The trainer's Python stacks, taken when the sidecar stops a stalled trainer.
STACKS_FILE = "stacks.json"
# The program that reads them: install-launcher puts it beside the launcher, which looks there first.
STACK_READER = "py-spy"
DEADLINE_COPY_FILE = "deadline.json"
CONSOLE_LOG = "console.log"
CONSOLE_LOG_ROTATED = "console.log.1"
# Every file the protocol defines, in the order a fresh run creates them (reset() removes these).
RUN_DIR_FILES = (
    LAUNCHER_FILE,
    GO_FILE,
    ABORT_FILE,
    HEARTBEAT_FILE,
    CONTROL_FILE,
    DEADLINE_COPY_FILE,
    TRAINER_FILE,
    SOFT_STOP_FILE,
    CONSOLE_LOG,
    CONSOLE_LOG_ROTATED,
    EXIT_FILE,
    FD_REPORT_FILE,
    STACKS_FILE,
)

ACTIONS = ("soft_stop", "terminate", "kill")
REASONS = (
    "exited",
    "deadline",
    "heartbeat_lost",
    "owner_lost",
    "control",
    "signalled",
    "aborted",
    "go_timeout",
    "insufficient_budget",
    "spawn_failed",
    "protocol_error",
    "subreaper_unavailable",
    "launcher_error",
)
# Reasons the launcher gives only when it never started the trainer.
BEFORE_START_REASONS = frozenset(
    {"signalled", "aborted", "go_timeout", "insufficient_budget", "protocol_error", "subreaper_unavailable"}
)
# The launcher's reason for the soft stop it sends at the deadline's checkpoint margin.
DEADLINE_SOFT_STOP = "checkpoint_margin"
FORWARDED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
# Stop signals from outside (the kubelet deleting the pod, kill, Ctrl-C): with go.json's
# stop_grace_s > 0 they become the soft stop first and reach the trainer only after that grace.
STOP_SIGNALS = ("SIGTERM", "SIGINT")

# Environment the trainer sees (the launcher sets the path variables from its own --run-dir so a
# different mount point in the trainer container cannot point them elsewhere).
ENV_RUN_DIR = "SOAK_RUN_DIR"
ENV_RUN_ID = "SOAK_RUN_ID"
ENV_DEADLINE_FILE = "SOAK_DEADLINE_FILE"
ENV_SOFT_STOP_FILE = "SOAK_SOFT_STOP_FILE"
# The trainer's GPU selection, reported in launcher.json: a sidecar under another UID cannot read
# the trainer's /proc/<pid>/environ, and the trainer inherits the launcher's environment.
GPU_ENV_VARS = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
MAX_GPU_ENV_VARS = 8
MAX_GPU_ENV_CHARS = 4096

# Bounds of fd reporting: never more often than this, and at most this many processes per report.
MIN_FD_REPORT_S = 0.01
FD_REPORT_MAX_PROCESSES = 20_000
FD_REPORT_LIMIT_BYTES = 8 * 1024 * 1024
# fds.json bounds the sidecar accepts: far above any real tree; beyond them it is a forgery.
MAX_FD_COUNT = 10_000_000
MAX_FD_CLASSES = 32
# The largest record either side reads; a longer file is not a record.
RECORD_LIMIT_BYTES = 1024 * 1024
# exit.json lists at most this many killed processes per list, and of each at most this many
# characters of arguments, and at most this many signalled pids: whatever the tree, the record
# stays within RECORD_LIMIT_BYTES (an argument of control bytes takes six once JSON-escaped).
MAX_LISTED_PROCESSES = 32
LISTED_COMMAND_CHARS = 1024
MAX_LISTED_PIDS = 4096
# How much of a process's /proc cmdline either side reads: enough for any command line worth
# storing (stored ones are cut far shorter), and a bound on what a hostile argv costs to redact.
CMDLINE_READ_BYTES = 16 * 1024
TERMINATION_MESSAGE_BYTES = 4096  # the kubelet's cap on a termination message

# Launcher exit codes besides the trainer's own (0-255, 128+N when the trainer died of signal N).
EXIT_USAGE = 64  # bad command line
EXIT_PROTOCOL = 65  # go.json present but malformed (EX_DATAERR)
EXIT_LAUNCHER_ERROR = 70  # a bug in the launcher (EX_SOFTWARE); the trainer was killed
EXIT_SUBREAPER = 71  # PR_SET_CHILD_SUBREAPER unavailable (EX_OSERR)
EXIT_RECORD_UNWRITTEN = 74  # exit.json could not be written (EX_IOERR): the trainer's code is not told
EXIT_GO_TIMEOUT = 75  # no go.json/abort.json within --go-timeout (EX_TEMPFAIL)
EXIT_INSUFFICIENT_BUDGET = 18  # less than the checkpoint margin left at go (sidecar's code too)
EXIT_ABORT_DEFAULT = 15  # abort.json without a usable exit_code (the sidecar's REFUSED)
EXIT_SUPERVISOR_LOST = 125  # heartbeat stale or --owner-pid lost
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127

DEFAULT_GO_TIMEOUT_S = 300.0
DEFAULT_KILL_GRACE_S = 5.0
# After the trainer exits on its own, how long its descendants get to exit by themselves before
# they are survivors (a rank that is still exiting when rank 0 ends is no leak); bounded, as the
# cleanup watches no heartbeat: a go.json cannot hold it for long.
DEFAULT_EXIT_GRACE_S = 5.0
MAX_EXIT_GRACE_S = 60.0
DEFAULT_CONSOLE_LOG_BYTES = 64 * 1024 * 1024
