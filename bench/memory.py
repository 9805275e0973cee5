"""Sidecar memory over a long soak: RSS across 100,000 samples, against the seed's sample list.

Feeds synthetic but realistic ``Sample``s (8 processes with fd classes, 2 GPUs with per-process
rows, progress) through ``SampleRecorder`` with the supervisor's real writer (gzip JSONL to a
temp file) and reads this process's RSS (psutil) after 1k, 10k, 50k and 100k samples. Then, in the
same run, the seed's approach (``samples.append(dict)`` for every sample, as ``run_soak`` does)
for ``--baseline`` samples, measured, with its per-sample cost. Prints measured figures only.

    python bench/memory.py [--samples 100000] [--baseline 20000] [--series-points 512] [--smoke]

``--smoke``: 2,000 samples (RSS read after 1k and 2k) and a 200-sample baseline, a check that the
benchmark still runs.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from sidecar.core.artifact import SampleRecorder
from sidecar.core.samples import (
    GpuDevice,
    GpuProcess,
    GpuSample,
    ProcessInfo,
    ProcessTreeSample,
    ProgressSample,
    Sample,
)

MIB = 1024 * 1024
PROCESSES = 8
GPUS = 2
CHECKPOINTS = (1_000, 10_000, 50_000, 100_000)


def rss_bytes() -> int:
    gc.collect()
    return int(psutil.Process().memory_info().rss)


def make_sample(i: int, rng: random.Random) -> Sample:
    """One sample as the real adapters build it: fresh objects, values that move a little."""
    processes = []
    for k in range(PROCESSES):
        classes = {
            "eventfd": 4 + rng.randrange(3),
            "eventpoll": 2,
            "nvidia": 12 if k < GPUS else 0,
            "other": 20 + rng.randrange(5),
            "pipe": 6,
            "shared_memory": 8 if k else 0,
            "socket": 3 + rng.randrange(2),
        }
        classes = {name: count for name, count in classes.items() if count}
        processes.append(
            ProcessInfo(
                pid=4000 + k,
                ppid=4000 if k else 1,
                start_time=1_700_000_000.0 + k,
                start_ticks=123_456 + k,
                rss_kib=(2_000_000 if k < GPUS else 300_000) + rng.randrange(4096),
                fd_count=sum(classes.values()),
                fd_classes=classes,
                threads=40 if k < GPUS else 4,
                state="sleeping",
                command=f"python -m trainer.worker --rank {k} --config /configs/soak.yaml",
            )
        )
    fd_totals: dict[str, int] = {}
    for info in processes:
        for name, count in info.fd_classes.items():
            fd_totals[name] = fd_totals.get(name, 0) + count
    devices = [
        GpuDevice(
            index=g,
            uuid=f"GPU-0000000{g}-aaaa-bbbb-cccc-dddddddddddd",
            name="NVIDIA H100 80GB HBM3",
            memory_total_mib=81559.0,
            memory_used_mib=60_000.0 + rng.randrange(512),
            memory_reserved_mib=512.0,
            utilization_gpu_pct=float(rng.randrange(80, 100)),
            utilization_memory_pct=float(rng.randrange(30, 60)),
            temperature_c=float(rng.randrange(55, 75)),
            power_w=float(rng.randrange(400, 700)),
            sm_clock_mhz=1980.0,
            mem_clock_mhz=2619.0,
            ecc_uncorrected=0,
            retired_pages=0,
        )
        for g in range(GPUS)
    ]
    gpu_processes = [
        GpuProcess(
            pid=4000 + g,
            device_uuid=devices[g].uuid,
            used_memory_mib=59_000.0,
            kind="compute",
            in_tree=True,
        )
        for g in range(GPUS)
    ]
    return Sample(
        t_wall=1_700_000_000.0 + i * 5.0,
        elapsed_s=i * 5.0,
        process=ProcessTreeSample(
            process_count=len(processes),
            zombie_count=0,
            rss_kib_total=sum(p.rss_kib for p in processes),
            fd_count_total=sum(p.fd_count for p in processes),
            fd_classes_total=dict(sorted(fd_totals.items())),
            threads_total=sum(p.threads for p in processes),
            processes=processes,
        ),
        gpu=GpuSample(
            available=True,
            devices=devices,
            processes=gpu_processes,
            attribution="pid",
            used_memory_mib_total=118_000.0,
            nvml_time_ms=1.5,
            processes_age_s=2.0,
            driver_version="570.86.15",
        ),
        progress=ProgressSample(file_count=12, bytes_total=1_000_000 + i * 200, max_mtime=1e9 + i),
    )


def recorder_run(total: int, series_points: int, directory: Path) -> dict[int, int]:
    rng = random.Random(1)
    rss: dict[int, int] = {}
    path = directory / "samples.jsonl.gz"
    start = time.monotonic()
    with gzip.open(path, "wt", encoding="utf-8") as stream:

        def write_line(line: str) -> None:
            stream.write(line + "\n")

        recorder = SampleRecorder(write_line, series_points)
        for i in range(1, total + 1):
            recorder.add(make_sample(i, rng))
            if i in CHECKPOINTS or i == total:
                rss[i] = rss_bytes()
                print(
                    f"recorder: {i:>7} samples  RSS {rss[i] / MIB:8.1f} MiB  "
                    f"series {len(recorder.series(None, None).downsampled)} points  "
                    f"({time.monotonic() - start:.0f} s)",
                    flush=True,
                )
    print(f"recorder: samples file {path.stat().st_size / MIB:.1f} MiB (gzip JSONL, {total} lines)")
    return rss


def seed_list_run(total: int) -> tuple[int, int]:
    """The seed's run_soak: ``samples.append({...})`` for every sample, kept until the end."""
    rng = random.Random(2)
    before = rss_bytes()
    samples: list[dict[str, Any]] = []
    for i in range(1, total + 1):
        samples.append(make_sample(i, rng).model_dump())
    after = rss_bytes()
    assert len(samples) == total
    return before, after


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--baseline", type=int, default=20_000)
    parser.add_argument("--series-points", type=int, default=512)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: --samples 2000 --baseline 200")
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(samples=2000, baseline=200)
        args = parser.parse_args()

    print(f"start: RSS {rss_bytes() / MIB:.1f} MiB")
    with tempfile.TemporaryDirectory(prefix="soak-bench-memory-") as tmp:
        rss = recorder_run(args.samples, args.series_points, Path(tmp))
    first = rss[min(rss)]
    last = rss[max(rss)]
    print(
        f"recorder: RSS after {max(rss)} / after {min(rss)} samples = {last / first:.3f} "
        f"({(last - first) / MIB:+.1f} MiB)"
    )

    before, after = seed_list_run(args.baseline)
    per_sample = (after - before) / args.baseline
    print(
        f"seed list: {args.baseline} samples kept  RSS {before / MIB:.1f} -> {after / MIB:.1f} MiB "
        f"({(after - before) / MIB:+.1f} MiB, {per_sample / 1024:.1f} KiB per sample, measured)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
