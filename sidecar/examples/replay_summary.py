"""The replay profile's run_summary.json (``soak-sidecar schema run-summary``), for a trainer that
writes it without the kit (the torchrun and MPI test trainers do, and the sidecar's tests break one
field or another of it), and the manifest sections the example trainer hands the kit. Standard
library only: it runs under the trainers' own Python."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SLOT_ROWS = 64


def write_atomic(path: Path, payload: dict[str, Any]) -> None:
    """Replace ``path`` with the JSON of ``payload`` in one rename: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def replay_sections(steps: int) -> dict[str, Any]:
    """The runtime_manifest sections the replay profile asks for, of ``steps`` published batches."""
    return {
        "replay_ingress": {
            "ingress_depth": 8,
            "ingress_slot_rows": SLOT_ROWS,
            "published_sequence": steps,
            "release_sequence": steps,
            "occupancy": 0,
            "high_water_occupancy": min(8, max(1, steps)),
            "backpressure_waits": 0,
            "backpressure_wait_s": 0.0,
            "early_returns": 0,
            "dropped_batches": 0,
            "closed_returns": 0,
            "stop_returns": 0,
        },
        "inference_flight": {
            "queue_depth": 0,
            "publication_lag": 0,
            "max_in_flight": 4,
            "max_publication_lag": 1,
        },
        "inference_memory_budget": {"ipc_event_count": steps},
    }


def run_summary(*, steps: int, completed: bool, classification: str, error: str | None) -> dict[str, Any]:
    """A whole run_summary.json of the replay profile (schema 1, manifest 2)."""
    return {
        "status": "completed" if completed else "failed",
        "metric_schema_version": 1,
        "total_env_steps": steps * SLOT_ROWS,
        "runtime_manifest": {
            "schema_version": 2,
            "shutdown": {
                "classification": classification,
                "owner": "example-trainer",
                "phase": "final" if completed else "training",
                "exception": None if error is None else {"type": "RuntimeError", "message": error},
                "cleanup": {"errors": []},
            },
            **replay_sections(steps),
        },
    }
