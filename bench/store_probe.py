"""What knowing the store costs an attempt: the store probe (sidecar.adapters.s3_store.probe)
against a real SeaweedFS on 127.0.0.1, beside what the attempt already asks of the bucket before
its trainer starts, measured in the same run as the baseline: take the lock, create the run's
deadline record, read the server's clock, claim the attempt, release the lock.

Each round uses a fresh S3 client (a sidecar process probes once, with its first connection).
Prints the probe's requests and milliseconds (median and max over the rounds), the baseline's,
and the ratio.

    python bench/store_probe.py [--rounds 20] [--smoke]

``--smoke``: 2 rounds, a check that the benchmark still runs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.adapters.s3_client import S3Stats
from sidecar.adapters.s3_store import S3DeadlineStore
from sidecar.adapters.s3_store import probe as store_probe
from tests.fixtures.s3 import SeaweedServer, run_seaweedfs


def _probe_once(server: SeaweedServer) -> tuple[int, float]:
    settings = server.settings()
    client = server.factory()(settings)
    features = store_probe.probe_store(client, settings, f"bench/{uuid.uuid4().hex}.probe/")
    assert features.conditional_create and features.checksums_confirmed, features
    return features.requests, features.elapsed_ms


def _start_once(server: SeaweedServer) -> tuple[int, float]:
    """What an attempt asks of the bucket before its trainer starts (the probe aside)."""
    stats = S3Stats()

    def factory(settings: object) -> object:
        client = server.factory()(server.settings())
        stats.attach(client)
        return client

    run_id = str(uuid.uuid4())
    began = time.monotonic()
    store = S3DeadlineStore(server.settings(), client_factory=factory)  # type: ignore[arg-type]
    with store.lock(run_id):
        store.attempt_claims(run_id)
        store.create(run_id, b'{"bench": true}')
        store.store_clock(run_id)
        store.claim_attempt(run_id)
    return stats.attempts, (time.monotonic() - began) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="2 rounds: a check that it still runs")
    args = parser.parse_args()
    if args.smoke:
        args.rounds = 2
    with tempfile.TemporaryDirectory() as scratch, run_seaweedfs(Path(scratch)) as server:
        probes = [_probe_once(server) for _ in range(args.rounds)]
        starts = [_start_once(server) for _ in range(args.rounds)]
    rows = [("store probe", probes), ("attempt start without it", starts)]
    print(f"SeaweedFS on 127.0.0.1, {args.rounds} rounds each, a fresh client per round")
    print(f"{'':28} {'requests':>9} {'median ms':>10} {'max ms':>8}")
    for name, found in rows:
        requests = statistics.median(n for n, _ in found)
        times = [ms for _, ms in found]
        print(f"{name:28} {requests:>9.0f} {statistics.median(times):>10.1f} {max(times):>8.1f}")
    ratio = statistics.median(ms for _, ms in probes) / statistics.median(ms for _, ms in starts)
    print(f"the probe adds {ratio:.2f}x the time of the attempt's own start requests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
