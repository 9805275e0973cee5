"""Upload time of one artifact through S3ArtifactSink versus plain boto3 ``upload_file``.

Starts SeaweedFS on 127.0.0.1 (the test fixture's context manager), writes a random file, then
alternates the two uploaders for a few repetitions, each to a fresh key, and prints every time,
the medians and the ratio sink/baseline (target: at most 1.1).

    python bench/upload.py [--mib 64] [--reps 5] [--smoke]

``--smoke``: one repetition of 17 MiB (just above the sink's default 16 MiB multipart threshold,
so the multipart path still runs), a check that the benchmark still runs.

What each side computes: the sink hashes every byte twice with SHA-256 (whole file, and per
part as it is sent) and the server verifies the part checksums; upload_file lets botocore
compute its default CRC32 per part. SeaweedFS speaks plain http here, where botocore also
signs each request's payload (another SHA-256 pass) for upload_file; the sink's uploads carry a
signed x-amz-checksum-sha256 instead, so it skips that pass. Over https (AWS) botocore skips
payload signing for uploads on both sides. The server shares this machine's CPUs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psutil
from boto3.s3.transfer import TransferConfig

from sidecar.adapters.s3_sink import S3ArtifactSink
from tests.fixtures.s3 import run_seaweedfs


def _cpu(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def _cpu_self() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64, help="artifact size, MiB (default 64)")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of each (default 5)")
    parser.add_argument("--part-mib", type=int, help="sink part size, MiB (default: settings)")
    parser.add_argument("--concurrency", type=int, help="sink parallel parts (default: settings)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: --mib 17 --reps 1")
    args = parser.parse_args()
    if args.smoke:  # smaller defaults; options given explicitly still win
        parser.set_defaults(mib=17, reps=1)
        args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-upload-") as tmp:
        base = Path(tmp)
        artifact = base / "artifact.bin"
        artifact.write_bytes(os.urandom(args.mib * 1024 * 1024))
        with run_seaweedfs(base / "weed") as server:
            tuned: dict[str, int] = {}
            if args.part_mib:
                tuned["multipart_chunk_bytes"] = args.part_mib * 1024 * 1024
            if args.concurrency:
                tuned["multipart_concurrency"] = args.concurrency
            settings = server.settings(read_timeout_s=120.0, **tuned)
            sink = S3ArtifactSink(settings, client_factory=server.factory())
            plain = server.client()
            # boto3's defaults (8 MiB threshold/parts, 10 threads): the everyday baseline.
            transfer = TransferConfig()
            print(
                f"file {args.mib} MiB; sink: threshold {settings.multipart_threshold_bytes >> 20} MiB, "
                f"parts {settings.multipart_chunk_bytes >> 20} MiB x{settings.multipart_concurrency}; "
                f"upload_file: parts {transfer.multipart_chunksize >> 20} MiB "
                f"x{transfer.max_request_concurrency}"
            )
            # Warm-up of both paths (connection pools, server volume allocation); not counted.
            sink.upload([artifact], "warmup/sink/")
            plain.upload_file(str(artifact), server.bucket, "warmup/plain/artifact.bin", Config=transfer)

            server_proc = psutil.Process(server.pid)
            # Per run: (wall s, our process's CPU s, the server's CPU s).
            runs: dict[str, list[tuple[float, float, float]]] = {"sink": [], "plain": []}
            for rep in range(args.reps):
                order = ("sink", "plain") if rep % 2 == 0 else ("plain", "sink")
                for which in order:
                    cpu0, srv0, started = _cpu_self(), _cpu(server_proc), time.perf_counter()
                    if which == "sink":
                        sink.upload([artifact], f"rep{rep}/sink/")
                    else:
                        plain.upload_file(
                            str(artifact), server.bucket, f"rep{rep}/plain/artifact.bin", Config=transfer
                        )
                    runs[which].append(
                        (time.perf_counter() - started, _cpu_self() - cpu0, _cpu(server_proc) - srv0)
                    )
                (w1, c1, s1), (w2, c2, s2) = runs["sink"][-1], runs["plain"][-1]
                print(
                    f"rep {rep}: sink {w1:.3f} s (cpu client {c1:.2f} s, server {s1:.2f} s)   "
                    f"upload_file {w2:.3f} s (cpu client {c2:.2f} s, server {s2:.2f} s)"
                )

    mib = args.mib
    for label, pick in (("median", statistics.median), ("best", min)):
        mine, baseline = pick(w for w, _, _ in runs["sink"]), pick(w for w, _, _ in runs["plain"])
        ratio = mine / baseline
        verdict = "OK" if ratio <= 1.1 else "OVER"
        print(
            f"{label} wall: sink {mine:.3f} s ({mib / mine:.0f} MiB/s)   upload_file {baseline:.3f} s "
            f"({mib / baseline:.0f} MiB/s)   ratio {ratio:.2f}x (target <= 1.10x) -> {verdict}"
        )
    # CPU time (client + server) is steadier than wall time on a shared, loaded machine.
    mine = statistics.median(c + s for _, c, s in runs["sink"])
    baseline = statistics.median(c + s for _, c, s in runs["plain"])
    print(
        f"median cpu (client+server): sink {mine:.2f} s   upload_file {baseline:.2f} s   "
        f"ratio {mine / baseline:.2f}x"
    )
    print(f"load average after the run: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
