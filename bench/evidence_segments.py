"""What evidence sent while the trainer runs costs, and how soon a stop's cause reaches the bucket.

A real ``soak-sidecar run --local`` of the example trainer against SeaweedFS on 127.0.0.1, with a
short flush interval and fast sampling so an hour's worth of flushes fits in seconds; then SIGTERM.
Measured: the objects and bytes sent as segments while the trainer ran, per flush and per sample;
the same attempt's final upload of its samples (the baseline: all an attempt sent before segments);
and the time from the SIGTERM to the "stopping" record in the bucket (HEAD polled every 2 ms).
Projected: bytes, requests and objects per hour at the defaults (evidence.flush_s 300 s,
monitor.sample_interval_s), from the figures measured per sample and per flush.

    python bench/evidence_segments.py [--seconds 30] [--flush 2] [--interval 0.2] [--smoke]

``--smoke``: six seconds, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sidecar.settings import Settings
from tests.fixtures.s3 import REGION, run_seaweedfs

FINAL = ("samples.jsonl.gz", "console.log", "artifact.json")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the trainer runs (default 30)")
    parser.add_argument("--flush", type=float, default=2.0, help="evidence.flush_s for the run (default 2)")
    parser.add_argument("--interval", type=float, default=0.2, help="sample interval (default 0.2)")
    parser.add_argument("--smoke", action="store_true", help="six seconds: a check that it runs")
    args = parser.parse_args()
    seconds = 6.0 if args.smoke else args.seconds
    artifact, sizes, stopping_ms = soak(seconds, args.flush, args.interval)
    report(artifact, sizes, stopping_ms, seconds=seconds, flush=args.flush, interval=args.interval)
    return 0


def soak(
    seconds: float, flush: float, interval: float
) -> tuple[dict[str, Any], dict[str, int], float | None]:
    """(the final artifact, object name -> size under the attempt's prefix, SIGTERM -> stopping ms)."""
    with (
        tempfile.TemporaryDirectory(prefix="bench-evidence-") as tmp,
        run_seaweedfs(Path(tmp) / "weed") as server,
    ):
        base, run_id = Path(tmp), str(uuid.uuid4())
        (base / "progress").mkdir()
        env = {
            **os.environ,
            "SOAK_S3__BUCKET": server.bucket,
            "SOAK_S3__ENDPOINT_URL": server.endpoint,
            "SOAK_S3__REGION": REGION,
            "SOAK_S3__ADDRESSING_STYLE": "path",
            "SOAK_EVIDENCE__FLUSH_S": str(flush),
            "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key,
        }
        argv = [
            sys.executable, "-m", "sidecar.cli", "run", "--local", "--run-id", run_id,
            "--output", str(base / "out"), "--run-dir", str(base / "run"),
            "--progress-dir", str(base / "progress"), "--deadline-dir", str(base / "deadlines"),
            "--sample-interval", str(interval), "--gpu-backend", "none", "--status", "off",
            "--stop-grace", "0",
            "--", sys.executable, "-m", "sidecar.examples.trainer", "--steps", "1000000", "--step-s", "0.1",
        ]  # fmt: skip
        client = server.client()
        folder = f"soak/local/local/{run_id}/1-local/"
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(seconds)
            proc.send_signal(signal.SIGTERM)
            stopping_ms = _until_present(client, server.bucket, f"{folder}provisional-0002.json")
            proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        listed = client.list_objects_v2(Bucket=server.bucket, Prefix=folder).get("Contents", [])
        sizes = {item["Key"].removeprefix(folder): item["Size"] for item in listed}
        (artifact_path,) = (base / "out" / "runs" / run_id).glob("attempt-1/artifact.json")
        return json.loads(artifact_path.read_text()), sizes, stopping_ms


def _until_present(client: Any, bucket: str, key: str) -> float | None:
    """Milliseconds until ``key`` exists (HEAD every 2 ms, at most 10 s); None when it never did."""
    start = time.monotonic()
    while time.monotonic() - start < 10:
        try:
            client.head_object(Bucket=bucket, Key=key)
        except client.exceptions.ClientError:
            time.sleep(0.002)
            continue
        return (time.monotonic() - start) * 1000
    return None


def report(
    artifact: dict[str, Any],
    sizes: dict[str, int],
    stopping_ms: float | None,
    *,
    seconds: float,
    flush: float,
    interval: float,
) -> None:
    defaults = Settings()
    segments = artifact["upload"]["segments"]
    samples = artifact["samples"]["count"]
    sample_bytes = sum(s["size"] for s in segments if s["file"] == "samples.jsonl.gz")
    console_bytes = sum(s["size"] for s in segments if s["file"] != "samples.jsonl.gz")
    sample_segments = sum(1 for s in segments if s["file"] == "samples.jsonl.gz")
    records = sum(1 for name in sizes if name.startswith("provisional-"))
    per_sample = sample_bytes / max(1, samples)
    final = sizes.get("samples.jsonl.gz", 0)
    print(f"run: {seconds:g} s, flush every {flush:g} s, a sample every {interval:g} s: {samples} samples")
    print(
        f"sent while the trainer ran: {len(segments) + records} objects ({records} provisional records, "
        f"{sample_segments} samples segments, {len(segments) - sample_segments} console segments)"
    )
    print(f"samples segments: {sample_bytes} bytes, {per_sample:.1f} bytes per sample")
    print(
        f"baseline, the final upload of the same samples: {final} bytes; "
        f"segments/final = {sample_bytes / max(1, final):.2f}"
    )
    told = "not seen" if stopping_ms is None else f"{stopping_ms:.0f} ms"
    print(f"SIGTERM to the stopping record in S3: {told}")
    hourly_samples = 3600 / defaults.monitor.sample_interval_s
    hourly_flushes = 3600 / defaults.evidence.flush_s
    per_flush = len(segments) / max(1, sample_segments)
    print(
        f"at the defaults (flush {defaults.evidence.flush_s:g} s, a sample every "
        f"{defaults.monitor.sample_interval_s:g} s), per hour of soak:"
    )
    print(
        f"  samples: {per_sample * hourly_samples / 1024:.1f} KiB; console: the trainer's output as "
        f"printed (this trainer: {console_bytes / seconds * 3600 / 1024:.1f} KiB)"
    )
    print(
        f"  requests: {per_flush * hourly_flushes:.0f} PUTs ({per_flush:.1f} objects per flush x "
        f"{hourly_flushes:.0f} flushes), {per_flush * hourly_flushes * 72:.0f} objects in 72 h"
    )


if __name__ == "__main__":
    sys.exit(main())
