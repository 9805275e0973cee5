"""What reading structured progress records costs a sample, against the directory scan every sample
already makes (measured in the same run): a progress dir of ``--files`` checkpoint files, and a
``progress.jsonl`` that grows by ``--lines`` records between two samples (the kit writes one a
second; a sample comes every 5 s by default).

Prints the median per sample of the scan alone, of the records' read alone, and their ratio.

    python bench/progress_records.py [--files 1000] [--lines 5] [--samples 400] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sidecar.adapters.progress import DirectoryProgressProbe, RecordTail
from sidecar.core.progress_records import PROGRESS_RECORDS_FILE


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--lines", type=int, default=5)
    parser.add_argument("--samples", type=int, default=400)
    parser.add_argument("--smoke", action="store_true", help="a few samples: a check that it still runs")
    args = parser.parse_args()
    if args.smoke:
        args.files, args.samples = 50, 10
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        for n in range(args.files):
            (root / f"ckpt-{n:05d}.pt").write_bytes(b"x" * 1024)
        log = root / PROGRESS_RECORDS_FILE
        probe, tail = DirectoryProgressProbe(root, exclude=[]), RecordTail(str(log))
        scans, reads, step = [], [], 0
        for _ in range(args.samples):
            with log.open("a", encoding="utf-8") as out:
                for _ in range(args.lines):
                    step += 1
                    record = {
                        "t": time.time(),
                        "step": step,
                        "phase": "train",
                        "loss": 2.5,
                        "total_steps": 10**6,
                    }
                    out.write(json.dumps(record) + "\n")
            began = time.perf_counter()
            tail.read()
            reads.append(time.perf_counter() - began)
            began = time.perf_counter()
            probe.sample()  # the scan and its own read of the records: less the read, the scan
            scans.append(time.perf_counter() - began - reads[-1])
        assert tail.newest is not None and tail.newest.step == step and tail.refused == 0
    scan_us, read_us = statistics.median(scans) * 1e6, statistics.median(reads) * 1e6
    print(f"{args.files} files, {args.lines} new records per sample, {args.samples} samples (medians)")
    print(f"directory scan      {scan_us:9.1f} us")
    print(f"records read        {read_us:9.1f} us")
    print(f"records / scan      {read_us / scan_us:9.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
