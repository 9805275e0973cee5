"""Prometheus metrics scraped from a real local run: names, types, units and values against the
samples the run recorded; the verdict as an info metric while the endpoint lingers. The endpoint
under hostile clients (the trainer shares the pod's network): bounded threads, idle and oversized
connections closed, the scrape still served; and what it serves is prometheus_client's own output."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import make_wsgi_app
from prometheus_client.parser import text_string_to_metric_families

from sidecar.adapters.metrics import PrometheusMetrics
from sidecar.adapters.metrics.server import CONNECTION_TIMEOUT_S, MAX_REQUEST_BYTES
from sidecar.core.samples import FD_CLASSES
from tests.cluster.system import free_ports
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


def local_run(tmp_path: Path, port: int, *trainer_args: str) -> list[str]:
    """A local soak of the example trainer, serving metrics on ``port``."""
    return [
        sys.executable, "-m", "sidecar.cli", "run", "--local", "--metrics-port", str(port),
        "--output", str(tmp_path / "out"), "--run-dir", str(tmp_path / "run"),
        "--progress-dir", str(tmp_path / "progress"), "--deadline-dir", str(tmp_path / "deadlines"),
        "--gpu-backend", "none", "--status", "off", "--post-shutdown-grace", "0.2",
        "--", sys.executable, "-m", "sidecar.examples.trainer", *trainer_args,
    ]  # fmt: skip


def test_a_local_run_serves_its_samples_and_then_its_verdict(tmp_path: Path, spawn: Spawner) -> None:
    (port,) = free_ports(1)
    env = {
        **os.environ,
        "SOAK_METRICS__LINGER_S": "30",  # until the test has seen the verdict (it kills the run then)
        "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
    }
    argv = local_run(tmp_path, port, "--steps", "25", "--step-s", "0.2")
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
    # The run's budget as its ledger says once this attempt is in it: every second counted once.
    ((_, goodput),) = verdict["soak_goodput_ratio"]
    used = {labels["cause"]: seconds for labels, seconds in verdict["soak_budget_used_seconds"]}
    assert 0 < goodput < 1 and used["productive"] > 0, used
    assert goodput == pytest.approx(used["productive"] / sum(used.values()), rel=1e-6)
    assert "soak_goodput_ratio" not in during  # no earlier attempt: nothing to tell before the verdict


IDLE_CLIENTS = 200
# Threads the sidecar may start meanwhile for its own work (a thread per connection: IDLE_CLIENTS).
THREAD_SLACK = 8


@contextlib.contextmanager
def connections(port: int, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections to the endpoint, each closed on the way out."""
    with contextlib.ExitStack() as stack:
        yield [stack.enter_context(socket.create_connection(("127.0.0.1", port))) for _ in range(count)]


def closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    """Whether the server closes ``sock`` before ``deadline`` (monotonic): a blocking read of at most
    the time left, which the server's close ends with EOF (or a reset, when it left bytes unread)."""
    sock.settimeout(max(0.01, deadline - time.monotonic()))
    try:
        while sock.recv(4096):  # a reply to a complete request comes before the close
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def test_hostile_connections_hold_no_thread_and_do_not_stop_the_scrape(
    tmp_path: Path, spawn: Spawner
) -> None:
    (port,) = free_ports(1)
    env = {**os.environ, "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2"}
    argv = local_run(tmp_path, port, "--steps", "3000", "--step-s", "0.1")  # runs until killed
    proc = spawn(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def threads() -> int:
        return len(os.listdir(f"/proc/{proc.pid}/task"))

    def sampled() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the sidecar exited with {proc.returncode}")
        found = scrape(port)
        return bool(found and found.get("soak_samples_total"))

    wait_until("a scrape of the running soak", sampled, 60, interval_s=0.2)
    before = threads()
    with connections(port, IDLE_CLIENTS) as idle:
        idle[-1].sendall(b"GET /metrics HTTP/1.1\r\n")  # a head never finished (slowloris)
        opened = time.monotonic()
        found = scrape(port)
        assert found and found.get("soak_samples_total"), "no scrape while idle connections are open"
        # A thread per connection would be IDLE_CLIENTS more; the endpoint serves from one.
        assert threads() <= before + THREAD_SLACK, (before, threads())
        with connections(port, 1) as (oversized,):
            oversized.sendall(b"GET /metrics?" + b"a" * MAX_REQUEST_BYTES)
            assert closed_by_peer(oversized, time.monotonic() + CONNECTION_TIMEOUT_S / 2)
        # Every idle connection is closed once its time is up (the first ones, past the cap, at once).
        deadline = opened + CONNECTION_TIMEOUT_S + 10
        still_open = [sock for sock in idle if not closed_by_peer(sock, deadline)]
        assert not still_open, f"{len(still_open)} idle connections still open"


def plain(body: bytes, encoding: str | None) -> bytes:
    return gzip.decompress(body) if encoding == "gzip" else body  # gzip stamps the time


def wsgi_reply(app: Any, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    """The body ``app`` answers a GET /metrics with ``headers`` (unzipped), and its headers."""
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics"}
    environ |= {f"HTTP_{name.upper().replace('-', '_')}": value for name, value in headers.items()}
    started: list[tuple[str, list[tuple[str, str]]]] = []
    body = b"".join(app(environ, lambda status, reply: started.append((status, reply))))
    reply = dict(started[0][1])
    return plain(body, reply.get("Content-Encoding")), reply


def test_the_endpoint_serves_prometheus_clients_own_replies() -> None:
    metrics = PrometheusMetrics({"namespace": "ml", "pod": "soak-0", "container": "trainer"})
    metrics.start("127.0.0.1", 0)
    try:
        metrics.verdict("passed", None, 0)
        reference = make_wsgi_app(metrics.registry)
        direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        for headers in (
            {},
            {"Accept-Encoding": "gzip"},
            {"Accept": "application/openmetrics-text; version=1.0.0"},
        ):
            body, expected = wsgi_reply(reference, headers)
            request = urllib.request.Request(f"http://127.0.0.1:{metrics.port}/metrics", headers=headers)
            with direct.open(request, timeout=5) as response:
                encoding = response.headers["Content-Encoding"]
                assert plain(response.read(), encoding) == body
            assert response.headers["Content-Type"] == expected["Content-Type"]
            assert encoding == expected.get("Content-Encoding")
        # prometheus_client raises on a malformed version: that request fails, the server goes on.
        bad = urllib.request.Request(
            f"http://127.0.0.1:{metrics.port}/metrics", headers={"Accept": "text/plain; version=x"}
        )
        with pytest.raises(urllib.error.HTTPError, match="500"):
            direct.open(bad, timeout=5)
        assert scrape(int(metrics.port or 0))
    finally:
        metrics.close()
