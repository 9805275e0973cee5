"""Sample lines are bounded whatever the tree: the processes listed, the commands recorded once
within a budget, the GPU lists; the totals (and so every leak rule) still cover the whole tree."""

from __future__ import annotations

import json

from sidecar.core.artifact import SampleRecorder, leak_failures
from sidecar.core.report_samples import parse_sample
from sidecar.core.sample_lines import (
    GPU_DEVICE_BYTES,
    GPU_EVENT_BYTES,
    GPU_PROCESS_BYTES,
    GPU_TEXT_MAX_CHARS,
    LINE_BASE_BYTES,
    PROCESS_BYTES,
    SampleLines,
    command_id,
    line_bound_bytes,
)
from sidecar.core.samples import (
    COMMAND_MAX_CHARS,
    FD_CLASSES,
    SAMPLE_COMMAND_BYTES,
    SAMPLE_PROCESSES,
    GpuDevice,
    GpuEvent,
    GpuProcess,
    GpuSample,
    ProcessInfo,
    ProcessTreeSample,
    ProgressSample,
    Sample,
    UnlistedProcesses,
)

LAUNCHER, TRAINER = 100, 101
BIG = -(10**19)  # 20 characters: longer than any count, size or tick the kernel gives
FLOAT = -1.2345678901234567e-300  # the longest float JSON


def process(pid: int, *, rss_kib: int = 1000, fds: int = 10, command: str | None = None) -> ProcessInfo:
    return ProcessInfo(
        pid=pid,
        ppid=LAUNCHER if pid != LAUNCHER else 1,
        start_time=1_700_000_000.25,
        start_ticks=123_456 + pid,
        rss_kib=rss_kib,
        fd_count=fds,
        fd_classes={"pipe": 2, "other": fds - 2},
        threads=3,
        state="zombie" if pid % 7 == 0 else "sleeping",
        command=command if command is not None else f"worker-{pid} " + "x" * (COMMAND_MAX_CHARS - 20),
    )


def tree_sample(processes: list[ProcessInfo], t: float = 0.0) -> Sample:
    classes: dict[str, int] = {}
    for info in processes:
        for name, count in info.fd_classes.items():
            classes[name] = classes.get(name, 0) + count
    return Sample(
        t_wall=1_700_000_000.0 + t,
        elapsed_s=t,
        process=ProcessTreeSample(
            process_count=len(processes),
            zombie_count=sum(p.state == "zombie" for p in processes),
            rss_kib_total=sum(p.rss_kib for p in processes),
            fd_count_total=sum(p.fd_count for p in processes),
            fd_classes_total=dict(sorted(classes.items())),
            threads_total=sum(p.threads for p in processes),
            processes=processes,
        ),
        gpu=GpuSample(),
        progress=ProgressSample(file_count=1, bytes_total=100 + int(t), max_mtime=1.0),
    )


def wide_tree(count: int, *, rss_kib: int = 1000, fds: int = 10) -> list[ProcessInfo]:
    """The launcher and the trainer smallest of all, so only ``keep`` lists them."""
    small = [process(LAUNCHER, rss_kib=1, fds=3), process(TRAINER, rss_kib=2, fds=3)]
    return small + [process(1000 + n, rss_kib=rss_kib + n, fds=fds) for n in range(count - 2)]


def record(samples: list[Sample], **lines: int) -> tuple[SampleRecorder, list[str]]:
    written: list[str] = []
    limits = {"max_processes": SAMPLE_PROCESSES, "command_bytes": SAMPLE_COMMAND_BYTES, **lines}
    recorder = SampleRecorder(written.append, 16, lines=SampleLines(**limits))
    for sample in samples:
        recorder.add(sample, keep=(LAUNCHER, TRAINER))
    return recorder, written


def test_a_line_of_a_thousand_processes_of_long_argv_is_bounded_and_its_totals_exact() -> None:
    processes = wide_tree(1000)
    full = tree_sample(processes)
    _, written = record([full, tree_sample(processes, 5.0)])
    first, second = (json.loads(line) for line in written)
    bound = line_bound_bytes(SAMPLE_PROCESSES, devices=0)
    # The first line records the commands it lists (once); the next ones only name them.
    assert len(written[0].encode()) <= bound + SAMPLE_PROCESSES * (COMMAND_MAX_CHARS * 6 + 100)
    assert len(written[1].encode()) <= bound
    tree = first["process"]
    assert len(tree["processes"]) == SAMPLE_PROCESSES
    assert {LAUNCHER, TRAINER} <= {p["pid"] for p in tree["processes"]}
    largest = sorted(processes, key=lambda p: -p.rss_kib)[: SAMPLE_PROCESSES - 2]
    assert {p.pid for p in largest} <= {p["pid"] for p in tree["processes"]}
    assert all("command" not in p for p in tree["processes"])
    # Totals are the whole tree's; listed plus unlisted add up to them.
    for key in ("process_count", "zombie_count", "rss_kib_total", "fd_count_total", "threads_total"):
        assert tree[key] == getattr(full.process, key)
    unlisted = tree["unlisted"]
    assert unlisted["count"] == 1000 - SAMPLE_PROCESSES
    assert unlisted["rss_kib"] + sum(p["rss_kib"] for p in tree["processes"]) == full.process.rss_kib_total
    assert unlisted["fd_count"] + sum(p["fd_count"] for p in tree["processes"]) == full.process.fd_count_total
    assert unlisted["threads"] + sum(p["threads"] for p in tree["processes"]) == full.process.threads_total
    assert sum(unlisted["states"].values()) == unlisted["count"]
    assert set(tree["commands"]) == {p["command_id"] for p in tree["processes"]}
    assert "commands" not in second["process"]
    # The line reads back as a Sample, and the report draws it.
    assert Sample.model_validate_json(written[1]).process.process_count == 1000
    drawn = parse_sample(written[1].encode())
    assert (drawn.processes, drawn.rss_kib) == (1000, full.process.rss_kib_total)


def test_a_small_tree_is_listed_whole() -> None:
    processes = wide_tree(5)
    _, written = record([tree_sample(processes)])
    tree = json.loads(written[0])["process"]
    assert [p["pid"] for p in tree["processes"]] == sorted(p.pid for p in processes)
    assert "unlisted" not in tree
    assert tree["commands"] == {command_id(p.command): p.command for p in processes}


def test_commands_are_recorded_once_per_attempt_and_within_its_budget() -> None:
    # Every sample a fresh tree of distinct commands (a trainer that keeps spawning).
    samples = [
        tree_sample(
            [process(LAUNCHER), process(TRAINER)]
            + [process(10_000 * (t + 1) + n, command=f"job-{t}-{n} " + "y" * 400) for n in range(50)],
            float(t),
        )
        for t in range(40)
    ]
    budget = 20_000
    _, written = record(samples, max_processes=8, command_bytes=budget)
    recorded: dict[str, str] = {}
    unrecorded = 0
    for line in written:
        tree = json.loads(line)["process"]
        for ident, text in tree.get("commands", {}).items():
            assert ident not in recorded  # once
            recorded[ident] = text
        unrecorded += tree.get("commands_unrecorded", 0)
    spent = sum(len(json.dumps(text, ensure_ascii=False).encode()) + 64 for text in recorded.values())
    assert spent <= budget
    assert unrecorded > 0  # the budget ran out: later commands are named by id only
    assert (
        recorded[command_id(samples[0].process.processes[0].command)]
        == samples[0].process.processes[0].command
    )


def test_leak_rules_judge_the_whole_tree_when_the_growth_is_in_unlisted_processes() -> None:
    # 990 small processes that each grow by 1 MiB and 1 fd, none ever listed: the 10 listed stay flat.
    def tree(step: int) -> list[ProcessInfo]:
        listed = [process(LAUNCHER, rss_kib=10**7), process(TRAINER, rss_kib=10**7)]
        listed += [process(200 + n, rss_kib=10**7) for n in range(8)]
        growing = [process(5000 + n, rss_kib=1000 + 1024 * step, fds=10 + step) for n in range(990)]
        return listed + growing

    recorder, written = record([tree_sample(tree(step), float(step)) for step in range(4)], max_processes=10)
    assert all(len(json.loads(line)["process"]["processes"]) == 10 for line in written)
    summary = recorder.summary
    assert summary.rss_growth_kib == 990 * 1024 * 3
    assert summary.fd_growth == 990 * 3
    assert summary.max_process_count == 1000
    failures = leak_failures(summary, max_rss_growth_mib=100, max_fd_growth=100, max_gpu_growth_mib=None)
    assert failures == [
        "process tree RSS grew by 2970.0 MiB > 100.0 MiB",
        "process tree fd count grew by 2970 > 100",
    ]
    trends = recorder.resource_summary().trends
    assert len(trends) == 2 and all(trend.low_per_hour > 0 for trend in trends)  # from the totals too


def test_gpu_processes_and_events_are_bounded_and_health_counts_every_event() -> None:
    events = [
        GpuEvent(t_wall=1.0, device_index=0, device_uuid="GPU-0", kind="xid", data=13) for _ in range(100)
    ]
    gpu_processes = [
        GpuProcess(pid=n, device_uuid="GPU-0", used_memory_mib=float(n), kind="compute", in_tree=n % 2 == 0)
        for n in range(100)
    ]
    sample = tree_sample(wide_tree(4)).model_copy(
        update={
            "gpu": GpuSample(
                available=True,
                attribution="pid",
                devices=[GpuDevice(index=0, uuid="GPU-0", name="mock")],
                processes=gpu_processes,
                events=events,
                reason="r" * 10_000,
            )
        }
    )
    recorder, written = record([sample], max_processes=8)
    gpu = json.loads(written[0])["gpu"]
    assert len(gpu["processes"]) == 8 and gpu["processes_unlisted"] == 92
    assert all(p["in_tree"] for p in gpu["processes"])  # the trainer's first, the largest of them
    assert {p["pid"] for p in gpu["processes"]} == {98, 96, 94, 92, 90, 88, 86, 84}
    assert len(gpu["events"]) == 8 and gpu["events_unlisted"] == 92
    assert len(gpu["reason"]) == GPU_TEXT_MAX_CHARS
    assert recorder.health.summary().event_count == 100


# ---------------------------------------------------------------------- the worst case of each part


def worst_process() -> ProcessInfo:
    return ProcessInfo(
        pid=BIG,
        ppid=BIG,
        start_time=FLOAT,
        start_ticks=BIG,
        rss_kib=BIG,
        fd_count=BIG,
        fd_classes={name: BIG for name in FD_CLASSES},
        threads=BIG,
        state="tracing-stop",
        command="\x01" * COMMAND_MAX_CHARS,
        command_id="f" * 16,
    )


def worst_device() -> GpuDevice:
    return GpuDevice(
        index=BIG,
        uuid="G" * 96,  # NVML's UUID and name buffers are 96 bytes
        name="N" * 96,
        memory_total_mib=FLOAT,
        memory_used_mib=FLOAT,
        memory_reserved_mib=FLOAT,
        utilization_gpu_pct=FLOAT,
        utilization_memory_pct=FLOAT,
        temperature_c=FLOAT,
        power_w=FLOAT,
        sm_clock_mhz=FLOAT,
        mem_clock_mhz=FLOAT,
        ecc_uncorrected=BIG,
        ecc_corrected=BIG,
        retired_pages=BIG,
        errors={f"metric_{n:017d}": "E" * 80 for n in range(24)},  # every metric failed, long messages
        fault="F" * 80,
        clock_event_reasons=["applications_clocks"] * 12,
        remapped_rows_correctable=BIG,
        remapped_rows_uncorrectable=BIG,
        row_remap_pending=True,
        row_remap_failure=True,
        retired_pages_pending=True,
        pcie_replay_count=BIG,
        recovery_action="drain_and_reset",
        nvlink_active_links=BIG,
        nvlink_crc_errors=BIG,
        nvlink_replay_errors=BIG,
        nvlink_recovery_errors=BIG,
    )


def test_each_part_of_a_line_fits_its_stated_bound_in_the_worst_case() -> None:
    states = ["running", "sleeping", "disk-sleep", "stopped", "tracing-stop", "zombie", "dead"]
    states += ["wake-kill", "waking", "parked", "idle", "?"]
    base = Sample(
        t_wall=FLOAT,
        elapsed_s=FLOAT,
        process=ProcessTreeSample(
            process_count=BIG,
            zombie_count=BIG,
            rss_kib_total=BIG,
            fd_count_total=BIG,
            fd_classes_total={name: BIG for name in FD_CLASSES},
            threads_total=BIG,
            unlisted=UnlistedProcesses(
                count=BIG, rss_kib=BIG, fd_count=BIG, threads=BIG, states={s: BIG for s in states}
            ),
            commands_unrecorded=BIG,
        ),
        gpu=GpuSample(
            available=True,
            reason="\x01" * 10_000,
            attribution="unavailable",
            used_memory_mib_total=FLOAT,
            fault="\x01" * 10_000,
            nvml_time_ms=FLOAT,
            processes_age_s=FLOAT,
            driver_version="\x01" * 10_000,
            events_unavailable="\x01" * 10_000,
            processes_unlisted=BIG,
            events_unlisted=BIG,
        ),
        progress=ProgressSample(file_count=BIG, bytes_total=BIG, max_mtime=FLOAT),
    )
    lines = SampleLines(SAMPLE_PROCESSES, 0)
    assert len(lines.dumps(lines.line(base)).encode()) <= LINE_BASE_BYTES
    one = lines.line(
        base.model_copy(update={"process": base.process.model_copy(update={"processes": [worst_process()]})})
    )
    assert len(lines.dumps(one).encode()) - len(lines.dumps(lines.line(base)).encode()) <= PROCESS_BYTES
    gpu_process = GpuProcess(
        pid=BIG, device_uuid="G" * 96, used_memory_mib=FLOAT, kind="graphics", in_tree=False
    )
    assert len(gpu_process.model_dump_json().encode()) + 1 <= GPU_PROCESS_BYTES
    event = GpuEvent(t_wall=FLOAT, device_index=BIG, device_uuid="G" * 96, kind="ecc_double_bit", data=BIG)
    assert len(event.model_dump_json().encode()) + 1 <= GPU_EVENT_BYTES
    assert len(worst_device().model_dump_json(exclude_none=True).encode()) + 1 <= GPU_DEVICE_BYTES


def test_the_line_bound_holds_for_a_worst_case_sample_of_any_width() -> None:
    for count in (SAMPLE_PROCESSES, 10 * SAMPLE_PROCESSES, 5000):
        processes = [worst_process().model_copy(update={"pid": n, "command": ""}) for n in range(count)]
        sample = tree_sample(processes).model_copy(
            update={
                "gpu": GpuSample(
                    available=True,
                    devices=[worst_device() for _ in range(8)],
                    processes=[
                        GpuProcess(
                            pid=BIG,
                            device_uuid="G" * 96,
                            used_memory_mib=FLOAT,
                            kind="graphics",
                            in_tree=False,
                        )
                    ]
                    * count,
                    events=[
                        GpuEvent(t_wall=FLOAT, device_index=BIG, device_uuid="G" * 96, kind="xid", data=BIG)
                    ]
                    * count,
                )
            }
        )
        lines = SampleLines(SAMPLE_PROCESSES, 0)
        line = lines.dumps(lines.line(sample, keep=()))
        assert len(line.encode()) <= line_bound_bytes(SAMPLE_PROCESSES, devices=8), count
