"""stacks.json: the Python stacks of the trainer's processes, taken by the launcher when the sidecar
stops a stalled trainer (a stop request with ``stacks_timeout_s``). The launcher is every trainer
process's ancestor and runs under the trainer's UID, so it may read them where the sidecar may not.

Evidence only: the trainer can write this file too, so the sidecar shows it and decides nothing by it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from .fields import ProtocolError, get, items, number
from .names import PROTOCOL

# At most this many processes' stacks, each cut to MAX_STACK_CHARS: a stall's evidence stays a few
# MiB however wide the tree, and the capture's cost stays bounded.
MAX_STACK_PROCESSES = 64
MAX_STACK_CHARS = 32 * 1024
MAX_MISSING_CHARS = 512
# The most a stop may wait for stacks (the sidecar's setting is capped at it too).
MAX_STACKS_TIMEOUT_S = 60.0
STACKS_LIMIT_BYTES = 4 * 1024 * 1024
# What a command keeps when the record must shrink to fit STACKS_LIMIT_BYTES.
MAX_KEPT_ARGS = 16
MAX_KEPT_ARG_CHARS = 256
# Linux's largest pid_max (2^22), and then some: a pid (or a count of them) past it is no process's.
MAX_PID = 2**31 - 1


# py-spy's dump opens with "Process PID: ARGV" (the arguments joined by spaces, secrets and all),
# then "Python vX.Y.Z (executable)". An argument may hold a newline and "Python v" itself.
_DUMP_HEADER = "Process "
_DUMP_VERSION_LINE = "\nPython v"


def without_command_line(pid: int, stack: str, command: Sequence[str]) -> str:
    """The stack without the command line py-spy prints above it: the record has the command apart,
    where the sidecar redacts it argument by argument. The header is cut exactly where the process's
    own arguments end (never at the first thing that looks like the version line, which an argument
    can fake); a header that is not those arguments is withheld whole, with the dump."""
    if not stack.startswith(_DUMP_HEADER) or stack.startswith(f"{_DUMP_HEADER}{pid}\n"):
        return stack  # no header, or cut already (by the launcher)
    header = f"{_DUMP_HEADER}{pid}: {' '.join(command)}"
    if not (stack.startswith(header) and stack.startswith(_DUMP_VERSION_LINE, len(header))):
        return f"Process {pid}\n[the dump is withheld: its command line could not be told apart]\n"
    return f"Process {pid}\n{stack[len(header) + 1 :]}"


@dataclass(frozen=True)
class ProcessStack:
    """One process's stack, or why there is none ("not a Python process", "ptrace refused: ...",
    "timed out after 5s", ...)."""

    pid: int
    command: tuple[str, ...]
    stack: str | None
    missing: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "command": list(self.command), "stack": self.stack, "missing": self.missing}

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> ProcessStack:
        get(raw, "command", list)
        stack = get(raw, "stack", str, optional=True)
        missing = get(raw, "missing", str, optional=True)
        if (stack is None) == (missing is None):
            raise ProtocolError("stacks.json: each process has either a stack or why it is missing")
        pid = get(raw, "pid", int)
        if not 0 < pid <= MAX_PID:
            raise ProtocolError(f"stacks.json: pid {pid!r:.40} is not a process id")
        return cls(
            pid=pid,
            command=items(raw, "command", str),
            stack=None if stack is None else stack[:MAX_STACK_CHARS],
            missing=None if missing is None else missing[:MAX_MISSING_CHARS],
        )


def _cut(stack: str, chars: int) -> str:
    return stack if len(stack) <= chars else stack[:chars] + "\n[... cut to fit stacks.json]\n"


@dataclass(frozen=True)
class StacksRecord:
    """What the launcher captured, when, and with what; ``omitted``: processes past the cap."""

    launch_id: str
    tool: str | None  # the program that read the stacks; None when none was found
    requested_unix: float | None  # when the sidecar asked (its control request)
    started_unix: float  # when the launcher began the capture
    captured_unix: float  # when it had every stack it would get
    timeout_s: float
    processes: tuple[ProcessStack, ...]
    omitted: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "protocol": PROTOCOL,
            "launch_id": self.launch_id,
            "tool": self.tool,
            "requested_unix": self.requested_unix,
            "started_unix": self.started_unix,
            "captured_unix": self.captured_unix,
            "timeout_s": self.timeout_s,
            "processes": [process.to_json() for process in self.processes],
            "omitted": self.omitted,
        }

    def within(self, limit: int = STACKS_LIMIT_BYTES) -> StacksRecord:
        """This record cut until its JSON fits ``limit`` bytes (escaped text can grow sixfold): each
        command to its first MAX_KEPT_ARGS arguments, and every stack halved until it fits, keeping
        its head (py-spy prints the innermost frames, where the process hung, first)."""
        record = self
        share = MAX_STACK_CHARS
        while len(json.dumps(record.to_json())) > limit and share > 0:
            share //= 2
            record = replace(
                record,
                processes=tuple(
                    replace(
                        process,
                        command=tuple(arg[:MAX_KEPT_ARG_CHARS] for arg in process.command[:MAX_KEPT_ARGS]),
                        stack=None if process.stack is None else _cut(process.stack, share),
                    )
                    for process in self.processes
                ),
            )
        return record

    @classmethod
    def parse(cls, raw: Mapping[str, Any]) -> StacksRecord:
        processes = get(raw, "processes", list)
        if len(processes) > MAX_STACK_PROCESSES:
            raise ProtocolError(f"stacks.json: more than {MAX_STACK_PROCESSES} processes")
        times = [number(raw, key) for key in ("started_unix", "captured_unix", "timeout_s")]
        requested = number(raw, "requested_unix", optional=True)
        if not all(value is not None and math.isfinite(value) for value in [*times, requested or 0.0]):
            raise ProtocolError("stacks.json: times must be finite numbers")
        omitted = get(raw, "omitted", int, optional=True) or 0
        if not 0 <= omitted <= MAX_PID:
            raise ProtocolError("stacks.json: omitted must not be negative nor past any pid_max")
        tool = get(raw, "tool", str, optional=True)
        return cls(
            launch_id=get(raw, "launch_id", str),
            tool=None if tool is None else tool[:MAX_MISSING_CHARS],
            requested_unix=requested,
            started_unix=float(times[0] or 0.0),
            captured_unix=float(times[1] or 0.0),
            timeout_s=float(times[2] or 0.0),
            processes=tuple(ProcessStack.parse(item) for item in processes),
            omitted=omitted,
        )
