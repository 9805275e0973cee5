"""Whole `soak-sidecar run --local` invocations with the real adapters wired by the CLI.

S3 against SeaweedFS (upload, evidence lost when the store is down, the soak's own verdict kept),
and GPUs through the real pynvml against the mock libnvidia-ml.so.1 (attribution, GPU lost).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.system import free_ports
from tests.fixtures.s3 import REGION, SeaweedServer
from tests.fixtures.s3_proxy import S3Proxy

pytestmark = pytest.mark.integration

SCENARIOS = Path(__file__).resolve().parents[2] / "sidecar" / "nvml_mock"


def run_cli(tmp: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, Any], str]:
    """Run the CLI in ``tmp`` (all output under ./soak-output); returns code, artifact, stderr."""
    base = {
        "SOAK_MONITOR__SAMPLE_INTERVAL_S": "0.2",
        "SOAK_MONITOR__POST_SHUTDOWN_GRACE_S": "0.2",
        "SOAK_MONITOR__STATUS_LINE": "off",
        "SOAK_LAUNCHER__KILL_GRACE_S": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "run", "--local", *args],
        cwd=tmp,
        env={**os.environ, **base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    (artifact_path,) = (tmp / "soak-output" / "runs").glob("*/*/artifact.json")
    return proc.returncode, json.loads(artifact_path.read_text(encoding="utf-8")), proc.stderr


def trainer(*flags: str) -> list[str]:
    return ["--", sys.executable, "-m", "sidecar.examples.trainer", "--steps", "6", "--step-s", "0.1", *flags]


def s3_env(server: SeaweedServer, endpoint: str | None = None) -> dict[str, str]:
    return {
        "SOAK_S3__BUCKET": server.bucket,
        "SOAK_S3__ENDPOINT_URL": endpoint or server.endpoint,
        "SOAK_S3__REGION": REGION,
        "SOAK_S3__ADDRESSING_STYLE": "path",
        "SOAK_S3__MAX_ATTEMPTS": "2",
        "SOAK_S3__CONNECT_TIMEOUT_S": "1",
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
    }


@pytest.mark.s3
def test_a_passing_run_uploads_its_evidence_with_checksums(tmp_path: Path, seaweedfs: SeaweedServer) -> None:
    code, artifact, stderr = run_cli(tmp_path, *trainer(), env=s3_env(seaweedfs))
    assert code == 0, stderr
    upload = artifact["upload"]
    assert upload["error"] is None
    assert set(upload["uris"]) == {"samples.jsonl.gz", "console.log", "artifact.json"}
    client = seaweedfs.client()
    for name, uri in upload["uris"].items():
        bucket, key = uri.removeprefix("s3://").split("/", 1)
        assert bucket == seaweedfs.bucket
        assert key.startswith(f"soak/local/local/{artifact['context']['run_id']}/1-local/")
        body = client.get_object(Bucket=bucket, Key=key, ChecksumMode="ENABLED")
        data = body["Body"].read()
        assert hashlib.sha256(data).hexdigest() == upload["sha256"][name]
        assert body["ChecksumSHA256"] == base64.b64encode(hashlib.sha256(data).digest()).decode()
    # the uploaded artifact is the local one as it stood before its own upload was recorded
    (local,) = (tmp_path / "soak-output" / "runs").glob("*/*/artifact.json")
    assert local.is_file()


@pytest.mark.s3
def test_the_report_of_an_uploaded_attempt_reads_it_back_from_s3(
    tmp_path: Path, seaweedfs: SeaweedServer
) -> None:
    code, artifact, stderr = run_cli(tmp_path, *trainer(), env=s3_env(seaweedfs))
    assert code == 0, stderr
    out, uri = tmp_path / "report.html", artifact["upload"]["uris"]["artifact.json"]
    done = subprocess.run(
        [sys.executable, "-m", "sidecar.cli", "report", uri, "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **s3_env(seaweedfs)},
    )
    assert done.returncode == 0, done.stderr
    page = out.read_text(encoding="utf-8")
    assert artifact["context"]["run_id"] in page and page.count('<path class="series"') >= 5


@pytest.mark.s3
def test_a_store_that_is_down_at_the_start_is_transient_before_the_trainer_starts(
    tmp_path: Path, seaweedfs: SeaweedServer
) -> None:
    (closed,) = free_ports(1)
    env = s3_env(seaweedfs, endpoint=f"http://127.0.0.1:{closed}")
    code, artifact, _ = run_cli(tmp_path, *trainer(), env=env)
    assert (code, artifact["failure_classification"]) == (151, "transient_infra")
    assert (
        "cannot probe the S3 store" in artifact["failure_reason"]
        and str(closed) in artifact["failure_reason"]
    )
    assert artifact["samples"]["samples_file"] is None  # the trainer never ran


@contextlib.contextmanager
def down_after_the_start(server: SeaweedServer) -> Iterator[str]:
    """An endpoint that answers the store probe and then nothing (503): a store gone mid-run."""
    with S3Proxy(server.endpoint, "probe_only", credentials=(server.access_key, server.secret_key)) as proxy:
        yield proxy.endpoint


@pytest.mark.s3
def test_a_store_that_goes_down_loses_the_evidence_of_a_pass(
    tmp_path: Path, seaweedfs: SeaweedServer
) -> None:
    with down_after_the_start(seaweedfs) as endpoint:
        code, artifact, _ = run_cli(tmp_path, *trainer(), env=s3_env(seaweedfs, endpoint=endpoint))
    assert (code, artifact["failure_classification"]) == (16, "evidence_lost")
    assert "127.0.0.1" in artifact["upload"]["error"]
    assert artifact["failure_reason"].startswith("soak passed but its artifact was not uploaded")


@pytest.mark.s3
def test_a_failed_upload_never_hides_the_soaks_own_verdict(tmp_path: Path, seaweedfs: SeaweedServer) -> None:
    with down_after_the_start(seaweedfs) as endpoint:
        code, artifact, _ = run_cli(tmp_path, *trainer("--crash"), env=s3_env(seaweedfs, endpoint=endpoint))
    assert (code, artifact["failure_classification"]) == (10, "learner_failure")
    assert artifact["upload"]["error"]


def test_mock_gpus_through_the_real_pynvml_path(tmp_path: Path, nvml_mock_dir: Path) -> None:
    env = {"SOAK_GPU__MOCK_LIBRARY_DIR": str(nvml_mock_dir)}
    code, artifact, stderr = run_cli(
        tmp_path,
        "--gpu-backend",
        "mock",
        "--gpu-scenario",
        str(SCENARIOS / "two_gpus_growing.json"),
        *trainer(),
        env=env,
    )
    assert code == 0, stderr
    summary = artifact["resource_summary"]
    assert [d["uuid"][-4:] for d in summary["gpu_devices"]] == ["0000", "0001"]
    assert summary["gpu_attribution"] == "pid"
    assert summary["max_gpu_used_memory_mib"] >= 3000  # 1000 + 2000 MiB attributed to the trainer
    assert len(artifact["provenance"]["gpu_devices"]) == 2


def with_mock_gpus(
    tmp_path: Path, nvml_mock_dir: Path, device: int, fields: dict[str, Any], *flags: str
) -> tuple[int, dict[str, Any], str, dict[str, Any]]:
    """A run on the bundled two-GPU scenario, ``fields`` set on GPU ``device``; also the scenario."""
    scenario = json.loads((SCENARIOS / "two_gpus_growing.json").read_text(encoding="utf-8"))
    scenario["devices"][device].update(fields)
    path = tmp_path / "scenario.json"
    path.write_text(json.dumps(scenario), encoding="utf-8")
    env = {"SOAK_GPU__MOCK_LIBRARY_DIR": str(nvml_mock_dir)}
    gpu = ("--gpu-backend", "mock", "--gpu-scenario", str(path))
    code, artifact, stderr = run_cli(tmp_path, *gpu, *trainer(*flags), env=env)
    return code, artifact, stderr, scenario


def test_a_lost_gpu_is_a_retryable_hardware_verdict(tmp_path: Path, nvml_mock_dir: Path) -> None:
    code, artifact, stderr, _ = with_mock_gpus(tmp_path, nvml_mock_dir, 1, {"lost_at": 0.3}, "--steps", "100")
    assert (code, artifact["failure_classification"]) == (150, "gpu_fault"), stderr
    assert "GPU is lost" in artifact["failure_reason"]
    assert artifact["resource_summary"]["gpu_fault"]


def test_an_xid_that_blames_the_gpu_stops_the_soak_as_a_retryable_gpu_fault(
    tmp_path: Path, nvml_mock_dir: Path
) -> None:
    """XID 79 arrives through the event thread mid-run: the trainer is stopped at once, the verdict is
    gpu_fault (150, retried on another node), and the artifact keeps the event."""
    xid = {"events": [{"at": 0.3, "type": "xid", "data": 79}]}
    code, artifact, stderr, scenario = with_mock_gpus(tmp_path, nvml_mock_dir, 1, xid, "--steps", "100")
    assert (code, artifact["failure_classification"]) == (150, "gpu_fault"), stderr
    assert "XID 79: GPU has fallen off the bus" in artifact["failure_reason"]
    health = artifact["resource_summary"]["gpu_health"]
    assert health["gpu_xids"] == [79] and health["events"][0]["device_index"] == 1
    assert [d["uuid"] for d in health["devices"]] == [d["uuid"] for d in scenario["devices"]]


@pytest.mark.parametrize(("flags", "code"), [((), 0), (("--crash",), 10)])
def test_an_xid_the_application_caused_never_blames_the_gpu(
    tmp_path: Path, nvml_mock_dir: Path, flags: tuple[str, ...], code: int
) -> None:
    """XID 31 (a page fault of the application's own making): a trainer that passes still passes; one
    that fails is the trainer's failure, and its reason names the XID as the trainer's doing."""
    xid = {"events": [{"at": 0.1, "type": "xid", "data": 31}]}
    got, artifact, stderr, _ = with_mock_gpus(tmp_path, nvml_mock_dir, 0, xid, "--steps", "10", *flags)
    assert got == code, stderr
    assert artifact["resource_summary"]["gpu_health"]["application_xids"] == [31]
    if code:
        # The example trainer's crash writes its own classification: the trainer's failure, not the GPU's.
        assert artifact["failure_classification"] == "learner_failure"
        reason = artifact["failure_reason"]
        assert "the trainer caused GPU 0" in reason and "XID 31: GPU memory page fault" in reason


def test_the_artifact_says_where_a_real_attempts_time_went(tmp_path: Path) -> None:
    """A real local soak of the example trainer: the launcher's start to the go-ahead, the way to the
    first progress, productive work, the teardown; they add up to the attempt, from the sidecar's
    start to its verdict."""
    code, artifact, stderr = run_cli(tmp_path, *trainer(), env={"SOAK_GPU__BACKEND": "none"})
    assert code == 0, stderr
    phases = artifact["phases"]["phases"]
    assert [p["kind"] for p in phases] == ["launcher", "startup", "productive", "teardown"], phases
    assert all(p["seconds"] > 0 for p in phases)
    assert phases[2]["seconds"] >= 0.3  # six steps of 0.1 s, less the first sample's wait
    span = phases[-1]["start_unix"] + phases[-1]["seconds"] - phases[0]["start_unix"]
    assert abs(sum(p["seconds"] for p in phases) - span) < 1e-3
    assert artifact["phases"]["lost_work_known"] and artifact["phases"]["checkpoint"] is None
