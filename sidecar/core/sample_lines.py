"""What a sample line of ``samples.jsonl.gz`` holds, whatever the trainer's tree looks like.

Pure. The sampler reads every process of the tree, and the totals of a sample (process count, RSS,
fds and their classes, threads, zombies) are exact over all of them: the leak rules, the trends and
the steady-sample growth are judged on those totals alone. What a line *lists* is bounded:

- at most ``max_processes`` processes one by one (the launcher and the trainer, then the largest by
  RSS), the others summed in ``unlisted`` (count, RSS, fds, threads, count by state);
- a listed process names its command by ``command_id``; the command's text is recorded once, in
  the ``commands`` of the first line that listed it, while the attempt's ``command_bytes`` budget
  lasts (then ``commands_unrecorded`` counts the new ones left out);
- at most ``max_processes`` GPU processes (the trainer's first, then by memory) and as many GPU
  events, with counts of the rest (the artifact's GPU health counts every event).

So a line's size has a bound that does not depend on the tree (``line_bound_bytes``), and neither
does the memory this keeps: the ids of the commands recorded, within the same byte budget.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection, Sequence

from sidecar.core.samples import (
    GpuProcess,
    GpuSample,
    ProcessInfo,
    ProcessTreeSample,
    Sample,
    UnlistedProcesses,
)

# What a line costs, at most, in bytes of JSON (tests/unit/test_sample_lines.py builds the worst
# case of each part, every number 20 characters long, and holds it to these; docs/artifact.md
# states the arithmetic).
LINE_BASE_BYTES = 8192  # t_wall, elapsed_s, the tree's totals, unlisted, progress, the GPU sample's fields
PROCESS_BYTES = 640  # one listed process (8 fd classes), without its command
GPU_PROCESS_BYTES = 256  # one listed GPU process
GPU_EVENT_BYTES = 256  # one listed GPU event
GPU_DEVICE_BYTES = 4608  # one GPU: every metric set, every clock reason, an error on every metric
# The GPU sample's free text (why data is missing, why events are not watched) is cut to this.
GPU_TEXT_MAX_CHARS = 256
# A recorded id's memory (a str of 16 hex digits in a set) is charged to the budget with its text.
ID_CHARGE_BYTES = 64


def command_id(command: str) -> str:
    return hashlib.blake2b(command.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def line_bound_bytes(max_processes: int, devices: int) -> int:
    """The most bytes one line can take before its ``commands`` (which an attempt's command budget
    bounds in all), with ``devices`` GPUs."""
    return (
        LINE_BASE_BYTES
        + max_processes * (PROCESS_BYTES + GPU_PROCESS_BYTES + GPU_EVENT_BYTES)
        + devices * GPU_DEVICE_BYTES
    )


class SampleLines:
    """Makes the lines of one attempt: ``line(sample, keep)`` is what is written and kept."""

    def __init__(self, max_processes: int, command_bytes: int) -> None:
        self._max = max(1, max_processes)
        self._budget = max(0, command_bytes)
        self._recorded: set[str] = set()

    @property
    def command_bytes_left(self) -> int:
        return self._budget

    def line(self, sample: Sample, keep: Collection[int] = ()) -> Sample:
        """``sample`` as a line: its totals as they are, its lists bounded (``keep``: pids listed
        first, the launcher and the trainer)."""
        return sample.model_copy(
            update={"process": self._tree(sample.process, keep), "gpu": self._gpu(sample.gpu)}
        )

    @staticmethod
    def dumps(line: Sample) -> str:
        # Absent means None: a sample of 8 GPUs is then half the size, and so is parsing it. The
        # command's text is in ``commands`` (once), never in the process.
        return line.model_dump_json(
            exclude_none=True, exclude={"process": {"processes": {"__all__": {"command"}}}}
        )

    def _tree(self, tree: ProcessTreeSample, keep: Collection[int]) -> ProcessTreeSample:
        listed, rest = _pick(tree.processes, self._max, keep)
        commands: dict[str, str] = {}
        unrecorded = 0
        processes = []
        for info in listed:
            ident = command_id(info.command)
            if ident not in self._recorded and ident not in commands:
                cost = len(json.dumps(info.command, ensure_ascii=False).encode()) + ID_CHARGE_BYTES
                if cost <= self._budget:
                    self._budget -= cost
                    self._recorded.add(ident)
                    commands[ident] = info.command
                else:
                    unrecorded += 1
            processes.append(info.model_copy(update={"command_id": ident}))
        return tree.model_copy(
            update={
                "processes": processes,
                "unlisted": _summed(rest) if rest else None,
                "commands": commands or None,
                "commands_unrecorded": unrecorded or None,
            }
        )

    def _gpu(self, gpu: GpuSample) -> GpuSample:
        update: dict[str, object] = {}
        for name in ("reason", "events_unavailable", "driver_version", "fault"):
            text = getattr(gpu, name)
            if text is not None and len(text) > GPU_TEXT_MAX_CHARS:
                update[name] = text[: GPU_TEXT_MAX_CHARS - 3] + "..."
        if len(gpu.processes) > self._max:
            ranked = sorted(gpu.processes, key=_gpu_rank)
            update["processes"] = ranked[: self._max]
            update["processes_unlisted"] = len(ranked) - self._max
        if len(gpu.events) > self._max:
            update["events"] = gpu.events[: self._max]
            update["events_unlisted"] = len(gpu.events) - self._max
        return gpu.model_copy(update=update) if update else gpu


def _pick(
    processes: Sequence[ProcessInfo], limit: int, keep: Collection[int]
) -> tuple[list[ProcessInfo], list[ProcessInfo]]:
    """(listed in pid order, the rest)."""
    if len(processes) <= limit:
        return list(processes), []
    ranked = sorted(processes, key=lambda p: (p.pid not in keep, -p.rss_kib, p.pid))
    return sorted(ranked[:limit], key=lambda p: p.pid), ranked[limit:]


def _summed(processes: Sequence[ProcessInfo]) -> UnlistedProcesses:
    states: dict[str, int] = {}
    for info in processes:
        states[info.state] = states.get(info.state, 0) + 1
    return UnlistedProcesses(
        count=len(processes),
        rss_kib=sum(p.rss_kib for p in processes),
        fd_count=sum(p.fd_count for p in processes),
        threads=sum(p.threads for p in processes),
        states=dict(sorted(states.items())),
    )


def _gpu_rank(process: GpuProcess) -> tuple[bool, float, int]:
    return (not process.in_tree, -(process.used_memory_mib or 0.0), process.pid)
