"""The GPU device check: ``soak-sidecar run --local`` over a real torch trainer (two processes on one
GPU, bench/_gpu_trainer.py), on a real NVIDIA driver (``--backend nvml``) or the mock library
(``--backend mock``, what CI runs so the check cannot rot), and one table of what the driver answered.

Two soaks: one that ends on its own (the verdict, every NVML figure the sidecar reads, per-process
memory) and one stopped from outside mid-run (SIGTERM to the sidecar: the soft stop, then both workers'
checkpoints). The table, from the sidecar's own samples and artifacts:

- every metric the sidecar reads, per device: a value, NOT_SUPPORTED, or the error NVML gave;
- whether NVML events are watched, and why not;
- per-process GPU memory: attributed by the sidecar, as torch says (``memory_reserved``), and as
  ``nvidia-smi --query-compute-apps`` says (when it is installed);
- NVML time per sample per device (the samples' ``nvml_time_ms``);
- soft stop -> each worker's checkpoint on disk (ms);
- both verdicts.

    python bench/gpu_device_check.py --backend nvml [--python PY] [--steps 60]
    python bench/gpu_device_check.py --smoke --python PY        # the mock, a short soak

Exit 0 when the first soak passed and the second stopped with both checkpoints written.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRAINER = REPO / "bench" / "_gpu_trainer.py"
ALLOC_MIB = 256
# exit code, artifact, samples, the trainer's progress dir, what nvidia-smi listed meanwhile
Soak = tuple[int, dict[str, Any], list[dict[str, Any]], Path, list[dict[str, Any]]]
# Every figure of a device the sidecar reads (sidecar/core/samples.py GpuDevice), with the name NVML
# support is recorded under when it is missing (``unavailable``/``errors``).
METRICS = (
    "memory_used_mib",
    "memory_reserved_mib",
    "utilization_gpu_pct",
    "utilization_memory_pct",
    "temperature_c",
    "power_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "clock_event_reasons",
    "ecc_uncorrected",
    "ecc_corrected",
    "retired_pages",
    "retired_pages_pending",
    "remapped_rows_correctable",
    "remapped_rows_uncorrectable",
    "row_remap_pending",
    "pcie_replay_count",
    "recovery_action",
    "nvlink_active_links",
    "nvlink_crc_errors",
)


def mock_scenario(directory: Path) -> Path:
    """One mocked H100 on which the two workers hold what the real ones would (their pids found by
    command line, as the sidecar's attribution needs)."""
    workers = [
        {"pid": f"~--worker {n}", "used_memory_mib": ALLOC_MIB + 300, "kind": "compute"} for n in range(2)
    ]
    scenario = {
        "driver_version": "550.54.15",
        "time_unit": "seconds",
        "devices": [
            {
                "uuid": "GPU-6f1e2d3c-0000-4000-8000-000000000000",
                "name": "NVIDIA H100 80GB HBM3 (mock)",
                "memory_total_mib": 81559,
                "memory_reserved_mib": 527,
                "memory_used_mib": 2 * (ALLOC_MIB + 300) + 4,
                "utilization_gpu_pct": 80,
                "temperature_c": 55,
                "power_w": 300.0,
                "processes": workers,
            }
        ],
    }
    path = directory / "scenario.json"
    path.write_text(json.dumps(scenario))
    return path


def soak(
    work: Path, name: str, trainer_python: str, env: dict[str, str], *, steps: int, stop_after: float | None
) -> Soak:
    """One soak; ``stop_after``: SIGTERM once the trainer has made progress for that long. Returns the
    exit code, the artifact, the samples, the progress dir and what nvidia-smi listed meanwhile."""
    progress = work / name / "progress"
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--budget", "900",
        "--output", str(work / name / "out"), "--run-dir", str(work / name / "run"),
        "--progress-dir", str(progress), "--deadline-dir", str(work / name / "deadlines"),
        "--status", "off", "--sample-interval", "0.5", "--post-shutdown-grace", "0.5", "--stop-grace", "30",
        "--", trainer_python, str(TRAINER), "--steps", str(steps), "--alloc-mib", str(ALLOC_MIB),
    ]  # fmt: skip
    proc = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    smi: list[dict[str, Any]] = []
    began = None
    while proc.poll() is None:
        time.sleep(0.5)
        if began is None and any(progress.glob("progress-*.jsonl")):
            began = time.monotonic()
        if began is not None and not smi:
            smi = nvidia_smi_apps()
        if stop_after is not None and began is not None and time.monotonic() - began >= stop_after:
            proc.send_signal(signal.SIGTERM)
            stop_after = None
    _, err = proc.communicate()
    found = list((work / name / "out" / "runs").glob("*/*/artifact.json"))
    if not found:
        raise SystemExit(f"{name}: no artifact (exit {proc.returncode}):\n{err[-3000:]}")
    artifact = json.loads(found[0].read_text())
    if not (found[0].parent / "samples.jsonl.gz").is_file():
        raise SystemExit(
            f"{name}: {artifact['status']}, no samples: {artifact['failure_reason']}\n{err[-3000:]}"
        )
    with gzip.open(found[0].parent / "samples.jsonl.gz", "rt") as lines:
        samples = [json.loads(line) for line in lines]
    return proc.returncode, artifact, samples, progress, smi


def nvidia_smi_apps() -> list[dict[str, Any]]:
    """What ``nvidia-smi --query-compute-apps`` lists (pid, MiB); none without nvidia-smi."""
    if shutil.which("nvidia-smi") is None:
        return []
    done = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    apps = []
    for line in done.stdout.splitlines():
        pid, _, used = line.partition(",")
        if pid.strip().isdigit():
            apps.append({"pid": int(pid), "used_mib": used.strip()})
    return apps


def metric_rows(samples: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(device, metric, what NVML answered) over every sample."""
    rows = []
    devices: dict[int, list[dict[str, Any]]] = {}
    for sample in samples:
        for device in sample["gpu"].get("devices", []):
            devices.setdefault(device["index"], []).append(device)
    for index, seen in sorted(devices.items()):
        for metric in METRICS:
            values = [d.get(metric) for d in seen if d.get(metric) is not None]
            missing = {m for d in seen for m in d.get("unavailable", [])}
            errors = {
                e for d in seen for m, e in d.get("errors", {}).items() if metric.startswith(m.split("_")[0])
            }
            if values:
                answer = f"value ({values[-1]})"
            elif any(metric.startswith(m.split("_mib")[0].split("_pct")[0]) for m in missing):
                answer = "NOT_SUPPORTED"
            elif errors:
                answer = "error: " + "; ".join(sorted(errors))[:80]
            else:
                answer = "no value (not read, or not yet due)"
            rows.append((f"GPU {index}", metric, answer))
    return rows


def memory_rows(
    samples: list[dict[str, Any]], progress: Path, smi: list[dict[str, Any]]
) -> list[tuple[str, ...]]:
    attributed: dict[int, float] = {}
    for sample in samples:
        for process in sample["gpu"].get("processes", []):
            if process.get("in_tree") and process.get("used_memory_mib") is not None:
                attributed[process["pid"]] = max(
                    attributed.get(process["pid"], 0.0), process["used_memory_mib"]
                )
    by_smi = {app["pid"]: app["used_mib"] for app in smi}
    rows: list[tuple[str, ...]] = []
    for path in sorted(progress.glob("worker-*.json")):
        told = json.loads(path.read_text())
        pid = told["pid"]
        torch_mib = told["memory_reserved_mib"]
        rows.append((
            f"worker {path.stem.split('-')[1]} (pid {pid}, {told['device']})",
            f"{attributed[pid]:.0f}" if pid in attributed else "not attributed",
            "n/a (cpu)" if torch_mib is None else f"{torch_mib:.0f}",
            str(by_smi.get(pid, "n/a" if not smi else "not listed")),
        ))  # fmt: skip
    return rows


def checkpoint_ms(artifact: dict[str, Any], progress: Path) -> list[str]:
    stops = ((artifact.get("post_shutdown") or {}).get("launcher_exit") or {}).get("stop_times_unix") or {}
    soft = stops.get("soft_stop")
    written = [json.loads(p.read_text())["written_unix"] for p in sorted(progress.glob("ckpt-*.json"))]
    if soft is None:
        return ["no soft stop recorded"]
    return [f"worker {n}: {(t - soft) * 1000:.0f} ms" for n, t in enumerate(written)] or [
        "no checkpoint written"
    ]


def table(title: str, header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    lines = [f"\n{title}", "  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("nvml", "mock"), default="nvml")
    parser.add_argument("--python", default=sys.executable, help="the trainer's Python (with torch)")
    parser.add_argument("--steps", type=int, default=60, help="steps of the soak that ends on its own")
    parser.add_argument("--smoke", action="store_true", help="the mock backend, short soaks")
    args = parser.parse_args()
    backend, steps = ("mock", 12) if args.smoke else (args.backend, args.steps)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        work = Path(tmp)
        env = {**os.environ, "SOAK_GPU__BACKEND": backend, "SOAK_GPU__PROCESS_INTERVAL_S": "1"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        if backend == "mock":
            env["SOAK_GPU__MOCK_SCENARIO"] = str(mock_scenario(work))
        ended = soak(work, "ends", args.python, env, steps=steps, stop_after=None)
        stopped = soak(work, "stopped", args.python, env, steps=steps * 10, stop_after=3.0)
        return report(backend, ended, stopped)


def report(backend: str, ended: Soak, stopped: Soak) -> int:
    code, artifact, samples, progress, smi = ended
    stop_code, stop_artifact, _, stop_progress, _ = stopped
    gpu = [s["gpu"] for s in samples]
    devices = max((len(g.get("devices", [])) for g in gpu), default=0)
    nvml_ms = [
        g.get("nvml_time_ms", 0.0) / max(1, len(g.get("devices", []))) for g in gpu if g.get("devices")
    ]
    driver = next((g.get("driver_version") for g in gpu if g.get("driver_version")), "none")
    print(f"backend {backend}; driver {driver}; kernel {platform.release()}; {devices} device(s)")
    print(f"samples of the soak that ended on its own: {len(samples)}")
    print(table("NVML, as the sidecar read it", ("device", "metric", "answer"), metric_rows(samples)))
    events = next((g.get("events_unavailable") for g in gpu if g.get("events_unavailable")), None)
    print(f"\nNVML events: {'watched' if events is None else events}")
    header = ("process", "sidecar", "torch reserved", "nvidia-smi")
    print(table("per-process GPU memory (MiB)", header, memory_rows(samples, progress, smi)))
    if nvml_ms:
        median, worst = statistics.median(nvml_ms), max(nvml_ms)
        print(f"\nNVML time per sample per device: median {median:.2f} ms, max {worst:.2f} ms")
    print("\nsoft stop -> checkpoint on disk: " + "; ".join(checkpoint_ms(stop_artifact, stop_progress)))
    print(
        f"\nverdicts: ends on its own: {artifact['status']} (exit {code}); "
        f"stopped: {stop_artifact['status']} {stop_artifact['failure_classification']} (exit {stop_code})"
    )
    checkpoints = len(list(stop_progress.glob("ckpt-*.json")))
    return 0 if code == 0 and stop_code == 17 and checkpoints == 2 else 1


if __name__ == "__main__":
    sys.exit(main())
