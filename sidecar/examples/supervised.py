"""A minimal supervised trainer that soak-sidecar accepts under the core run_summary profile.

    soak-sidecar run --local --summary-profile core -- python3 -m sidecar.examples.supervised

It writes progress where $SOAK_PROGRESS_DIR says, stops cleanly on the soft stop (SIGUSR1), and
ends with a run_summary.json that meets the core profile: status, schema versions and the shutdown
contract (docs/trainers.md, "Write your own trainer").
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any


def summary(*, completed: bool, step: int) -> dict[str, Any]:
    return {
        "status": "completed" if completed else "failed",
        "metric_schema_version": 1,
        "runtime_manifest": {
            "schema_version": 2,
            "shutdown": {
                # normal_completion, or why it ended early (here: the soft stop, from outside)
                "classification": "normal_completion" if completed else "external_cancellation",
                "owner": "supervised-example",
                "phase": "final" if completed else "training",
                "exception": None,
                "cleanup": {"errors": []},
            },
        },
        "steps": step,
    }


def main(steps: int = 10, step_s: float = 0.2) -> int:
    progress = Path(os.environ.get("SOAK_PROGRESS_DIR", "."))
    stop = {"requested": False}
    signal.signal(signal.SIGUSR1, lambda *_: stop.update(requested=True))
    step = 0
    while step < steps and not stop["requested"]:
        time.sleep(step_s)  # one training step
        step += 1
        (progress / "progress.json").write_text(json.dumps({"step": step}))
    done = summary(completed=step == steps, step=step)
    partial = progress / "run_summary.json.tmp"
    partial.write_text(json.dumps(done))
    partial.replace(progress / "run_summary.json")  # whole or absent, never half written
    return 0


if __name__ == "__main__":
    sys.exit(main())
