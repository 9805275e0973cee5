"""Prometheus metrics scraped from a real local run: names, types, units and values against the
samples the run recorded; the verdict as an info metric while the endpoint lingers."""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from sidecar.core.samples import FD_CLASSES
from tests.fixtures.processes import Spawner
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

EXPECTED_TYPES = {
    "soak_processes": "gauge",
    "soak_zombie_processes": "gauge",
    "soak_threads": "gauge",
    "soak_resident_memory_bytes": "gauge",
    "soak_open_fds": "gauge",
    "soak_budget_remaining_seconds": "gauge",
    "soak_progress_age_seconds": "gauge",
    "soak_samples": "counter",
    "soak_sample_duration_seconds": "histogram",
    "soak_verdict": "info",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]] | None:
    """Every sample of every family (by sample name), or None while nothing listens."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return None
    found: dict[str, list[tuple[dict[str, str], float]]] = {"__types__": []}
    for family in text_string_to_metric_families(text):
        found["__types__"].append(({"name": family.name, "type": family.type}, 0.0))
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return found


def test_a_local_run_serves_its_samples_and_then_its_verdict(tmp_path: Path, spawn: Spawner) -> None:
    port = free_port()
    env = {
        **os.environ,
        "SOAK_METRICS__LINGER_S": "30",  # until the test has seen the verdict (it kills the run then)
        "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
    }
    argv = [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--metrics-port", str(port),
        "--output", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run"),
        "--progress-dir", str(tmp_path / "progress"), "--deadline-dir", str(tmp_path / "deadlines"),
        "--gpu-backend", "none", "--status", "off", "--post-shutdown-grace", "0.2",
        "--", sys.executable, "-m", "sidecar.examples.trainer", "--steps", "25", "--step-s", "0.2",
    ]  # fmt: skip
    proc = spawn(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    scraped: list[dict[str, Any]] = []

    def running() -> bool:
        found = scrape(port)
        if found and sum(v for _, v in found.get("soak_samples_total", [])) >= 3:
            scraped.append(found)
        return len(scraped) >= 2

    wait_until("two scrapes of a running soak", running, 60, interval_s=0.2)
    verdict: dict[str, Any] = {}

    def decided() -> bool:
        found = scrape(port)
        if found and found.get("soak_verdict_info"):
            verdict.update(found)
        return bool(verdict)

    wait_until("the verdict served", decided, 60, interval_s=0.2)
    proc.kill()  # it lingers to serve the verdict (SOAK_METRICS__LINGER_S)
    _out, err = proc.communicate(timeout=30)
    during = scraped[-1]
    types = {labels["name"]: labels["type"] for labels, _ in during["__types__"]}
    assert {name: types.get(name) for name in EXPECTED_TYPES if name != "soak_verdict"} == {
        k: v for k, v in EXPECTED_TYPES.items() if k != "soak_verdict"
    }
    assert {labels["class"] for labels, _ in during["soak_open_fds"]} == set(FD_CLASSES)
    assert 0 < during["soak_budget_remaining_seconds"][0][1] <= 7200  # the local default budget
    assert sum(v for labels, v in during["soak_sample_duration_seconds_count"]) >= 3
    # The values are those of a recorded sample (the scrape fell between two samples).
    (samples_path,) = (tmp_path / "out" / "runs").glob("*/*/samples.jsonl.gz")
    with gzip.open(samples_path, "rt", encoding="utf-8") as lines:
        samples = [json.loads(line) for line in lines]
    rss = during["soak_resident_memory_bytes"][0][1]
    processes = during["soak_processes"][0][1]
    assert any(
        s["process"]["rss_kib_total"] * 1024 == rss and s["process"]["process_count"] == processes
        for s in samples
    ), (rss, processes)
    assert during["soak_samples_total"][0][1] <= len(samples)
    ((labels, _),) = verdict["soak_verdict_info"]
    assert (labels["status"], labels["exit_code"], labels["classification"]) == ("passed", "0", ""), (
        err.decode()
    )
