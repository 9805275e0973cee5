"""The report of a 72-hour soak sampled every 5 s (51,840 samples), and what a metrics scrape costs.

Prints the time to read the samples and render the page, the page's size, and, as a baseline
measured in the same run, the time to only read and parse the same samples file; then the wall time
of a GET /metrics on the sidecar's endpoint after 8 GPUs' worth of samples, against a registry with a
single gauge served the same way. Targets: under 3 s and 5 MB; a scrape under 5 ms.

    python bench/report.py [--hours 72] [--interval 5] [--scrapes 200] [--smoke]

``--smoke``: half an hour of samples and 20 scrapes, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import socket
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, make_wsgi_app

from sidecar.adapters.metrics import PrometheusMetrics
from sidecar.adapters.metrics.server import BoundedHttpServer
from sidecar.adapters.report_source import open_local
from sidecar.core.report import render_report
from sidecar.core.samples import GpuDevice, GpuProcess, GpuSample, ProcessTreeSample, ProgressSample, Sample

GPUS = 8


def sample(i: int, t0: float, interval: float, rng: random.Random) -> Sample:
    t = i * interval
    return Sample(
        t_wall=t0 + t,
        elapsed_s=t,
        process=ProcessTreeSample(
            process_count=12,
            rss_kib_total=int(8e6 + 3 * t + rng.gauss(0, 2e4)),
            fd_count_total=300,
            fd_classes_total={"pipe": 40, "socket": 60, "nvidia": 150, "other": 50},
            threads_total=200,
        ),
        gpu=GpuSample(
            available=True,
            attribution="pid",
            devices=[
                GpuDevice(
                    index=g,
                    uuid=f"GPU-{g:08x}-0000-4000-8000-000000000000",
                    name="H100",
                    memory_used_mib=60000 + g,
                )
                for g in range(GPUS)
            ],
            processes=[
                GpuProcess(
                    pid=1000 + g,
                    device_uuid=f"GPU-{g:08x}-0000-4000-8000-000000000000",
                    used_memory_mib=59000.0,
                    kind="compute",
                    in_tree=True,
                )
                for g in range(GPUS)
            ],
        ),
        progress=ProgressSample(file_count=3, bytes_total=int(t * 100), max_mtime=t0 + t),
    )


def write_soak(directory: Path, count: int, interval: float) -> None:
    rng = random.Random(1)
    t0 = 1_800_000_000.0
    with gzip.open(directory / "samples.jsonl.gz", "wt", encoding="utf-8", compresslevel=6) as out:
        for i in range(count):
            out.write(sample(i, t0, interval, rng).model_dump_json(exclude_none=True) + "\n")  # as recorded
    artifact = {
        "status": "failed",
        "failure_classification": "deadline_exhausted",
        "failure_reason": "the total-job deadline expired",
        "exit_code": 14,
        "context": {"run_id": "bench", "attempt": 1},
        "duration_s": count * interval,
        "deadline": {"deadline_unix": t0 + count * interval},
        "samples": {"samples_file": "samples.jsonl.gz"},
        "post_shutdown": {"launcher_exit": {"stop_times_unix": {"soft_stop": t0 + count * interval - 120}}},
        "resource_summary": {},
    }
    (directory / "artifact.json").write_text(json.dumps(artifact), encoding="utf-8")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_ms(port: int, count: int) -> list[float]:
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    times = []
    for _ in range(count):
        start = time.perf_counter()
        with direct.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            response.read()
        times.append((time.perf_counter() - start) * 1000.0)
    return times


def bench_scrapes(count: int) -> None:
    rng = random.Random(2)
    metrics = PrometheusMetrics({"namespace": "ml", "pod": "soak-0-abcde", "container": "trainer"})
    port = free_port()
    metrics.start("127.0.0.1", port)
    for i in range(100):
        metrics.observe(sample(i, 0.0, 5.0, rng), budget_left_s=3600.0, progress_age_s=2.0, duration_s=0.004)
    metrics.verdict("passed", None, 0)
    ours = scrape_ms(port, count)
    metrics.close()
    registry = CollectorRegistry()
    Gauge("bench_one", "one gauge", registry=registry).set(1)
    server = BoundedHttpServer("127.0.0.1", 0, make_wsgi_app(registry))
    baseline = scrape_ms(server.port, count)
    server.close()
    runs = (("one-gauge registry (baseline)", baseline), (f"the sidecar's metrics, {GPUS} GPUs", ours))
    for name, times in runs:
        print(f"scrape, {name}: median {statistics.median(times):6.2f} ms   max {max(times):6.2f} ms")
    print(
        f"ratio: {statistics.median(ours) / statistics.median(baseline):5.2f}x (target: a scrape under 5 ms)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hours", type=float, default=72.0)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--scrapes", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: --hours 0.5 --scrapes 20")
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(hours=0.5, scrapes=20)
        args = parser.parse_args()
    count = int(args.hours * 3600 / args.interval)
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_soak(directory, count, args.interval)
        packed = (directory / "samples.jsonl.gz").stat().st_size
        start = time.perf_counter()
        source = open_local(directory)
        parsed = sum(1 for _ in source.samples())
        read_s = time.perf_counter() - start
        start = time.perf_counter()
        source = open_local(directory)
        page = render_report(source.artifact, source.samples())
        render_s = time.perf_counter() - start
    size_mb = len(page.encode()) / 1e6
    print(
        f"{count} samples ({args.hours:g} h at {args.interval:g} s; samples.jsonl.gz {packed / 1e6:.1f} MB)"
    )
    print(f"read and parse only (baseline): {read_s:6.2f} s for {parsed} samples")
    print(f"read, parse and render the report: {render_s:6.2f} s, page {size_mb:.2f} MB (targets: 3 s, 5 MB)")
    print(f"ratio render / read: {render_s / read_s:5.2f}x")
    bench_scrapes(args.scrapes)


if __name__ == "__main__":
    main()
