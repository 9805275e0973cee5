"""KubeClient retry and error mapping over real HTTP, against a scripted server on 127.0.0.1.

The real kube-apiserver cannot be told to answer 503 or 429 on demand; this small server can,
and it speaks the same wire protocol to the real kubernetes client code path.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from sidecar import cli
from sidecar.adapters.kube.client import KubeClient
from sidecar.adapters.kube.connection import connect
from sidecar.adapters.kube.publisher import PodPublisher, create_event, patch_annotations
from sidecar.adapters.kube.reads import get_pod
from sidecar.adapters.kube.termination import write_termination_message
from sidecar.core.errors import ConfigError, ForbiddenError, PublishError
from sidecar.core.publication import Publication, parse_termination_message

pytestmark = pytest.mark.integration

DIGEST = "sha256:" + "0123456789abcdef" * 4
POD = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "pod-uid",
        "ownerReferences": [
            {"apiVersion": "v1", "kind": "ConfigMap", "name": "cm", "uid": "cm-uid"},
            {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "job-uid", "controller": True},
        ],
    },
    "spec": {
        "nodeName": "node-1",
        "containers": [
            {"name": "trainer", "image": "registry.example/trainer:1"},
            {"name": "soak-sidecar", "image": "registry.example/sidecar:1"},
        ],
    },
    "status": {
        "phase": "Running",
        "containerStatuses": [
            {
                "name": "trainer",
                "image": "registry.example/trainer:1",
                "imageID": f"registry.example/trainer@{DIGEST}",
                "ready": True,
                "restartCount": 0,
            }
        ],
    },
}


@dataclass
class Script:
    """Answers to give, in order (status, headers, body); 200 with the pod once exhausted."""

    answers: list[tuple[int, dict[str, str], object]] = field(default_factory=list)
    requests: list[tuple[str, str, str, bytes]] = field(default_factory=list)
    auth: list[str] = field(default_factory=list)


@pytest.fixture
def scripted() -> Iterator[tuple[str, Script]]:
    script = Script()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            script.requests.append((self.command, self.path, self.headers.get("Content-Type", ""), body))
            script.auth.append(self.headers.get("Authorization", ""))
            status, headers, payload = script.answers.pop(0) if script.answers else (200, {}, POD)
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_PATCH = do_POST = _answer  # noqa: N815 - http.server's naming

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def status_body(code: int, reason: str) -> dict[str, object]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": reason, "code": code}


def make_client(url: str, sleeps: list[float], retries: int = 3) -> KubeClient:
    return KubeClient(connect(host=url, token="t0ken"), retries=retries, backoff_s=0.2, sleep=sleeps.append)


def test_get_pod_retries_5xx_then_reads_identity(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.answers += [(503, {}, status_body(503, "ServiceUnavailable"))] * 2
    sleeps: list[float] = []
    with make_client(url, sleeps) as client:
        identity = get_pod(client, "ns", "p")
    assert script.auth == ["Bearer t0ken"] * 3
    assert len(script.requests) == 3
    assert len(sleeps) == 2 and 0.1 <= sleeps[0] <= 0.2 and 0.2 <= sleeps[1] <= 0.4
    assert identity.trainer_image_digest == DIGEST
    assert identity.trainer_image == "registry.example/trainer:1"
    assert (identity.job_name, identity.job_uid) == ("j", "job-uid")
    assert (identity.uid, identity.node_name) == ("pod-uid", "node-1")


def test_missing_trainer_status_gives_no_digest(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    no_status = json.loads(json.dumps(POD))
    no_status["status"] = {"phase": "Pending"}
    no_status["metadata"]["ownerReferences"] = []
    script.answers.append((200, {}, no_status))
    with make_client(url, []) as client:
        identity = get_pod(client, "ns", "p")
    assert identity.trainer_image_digest is None and identity.job_name is None


def test_patch_is_a_merge_patch_retried_on_conflict_and_429(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.answers += [
        (409, {}, status_body(409, "Conflict")),
        (429, {"Retry-After": "3"}, status_body(429, "TooManyRequests")),
    ]
    sleeps: list[float] = []
    with make_client(url, sleeps) as client:
        patch_annotations(client, "ns", "p", {"soak.sidecar.io/verdict": "passed", "gone": None})
    methods = [(m, p, ct) for m, p, ct, _ in script.requests]
    assert methods == [("PATCH", "/api/v1/namespaces/ns/pods/p", "application/merge-patch+json")] * 3
    assert json.loads(script.requests[-1][3]) == {
        "metadata": {"annotations": {"soak.sidecar.io/verdict": "passed", "gone": None}}
    }
    assert sleeps[1] == 3.0  # Retry-After honoured


def test_forbidden_is_not_retried(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.answers.append((403, {}, status_body(403, "Forbidden")))
    with make_client(url, []) as client, pytest.raises(ForbiddenError, match="forbidden") as info:
        patch_annotations(client, "ns", "p", {"a": "b"})
    assert len(script.requests) == 1
    assert int(info.value.exit_code) == 15
    assert info.value.__cause__ is not None  # chained, but only a SoakError escapes


def test_not_found_is_not_retried(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.answers.append((404, {}, status_body(404, "NotFound")))
    with make_client(url, []) as client, pytest.raises(PublishError, match="HTTP 404"):
        get_pod(client, "ns", "p")
    assert len(script.requests) == 1


def test_retries_exhausted(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.answers += [(500, {}, status_body(500, "InternalError"))] * 10
    sleeps: list[float] = []
    with make_client(url, sleeps, retries=2) as client, pytest.raises(PublishError, match="3 tries"):
        get_pod(client, "ns", "p")
    assert len(script.requests) == 3 and len(sleeps) == 2


def test_event_conflict_means_an_earlier_try_landed(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    script.answers += [
        (504, {}, status_body(504, "Timeout")),
        (409, {}, status_body(409, "AlreadyExists")),
    ]
    with make_client(url, []) as client:
        name = create_event(client, "ns", "p", "pod-uid", reason="SoakPassed", message="m")
    bodies = [json.loads(body) for _, _, _, body in script.requests]
    assert len(bodies) == 2 and bodies[0]["metadata"]["name"] == bodies[1]["metadata"]["name"] == name
    assert bodies[0]["involvedObject"]["uid"] == "pod-uid"


def free_closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_unreachable_api_still_leaves_the_termination_message(tmp_path: Path) -> None:
    sleeps: list[float] = []
    client = KubeClient(
        connect(host=f"http://127.0.0.1:{free_closed_port()}", token="t"),
        retries=2,
        backoff_s=0.01,
        sleep=sleeps.append,
    )
    log = tmp_path / "termination-log"
    publisher = PodPublisher(
        client,
        namespace="ns",
        pod_name="p",
        pod_uid="u",
        prefix="soak.sidecar.io/",
        termination_log=log,
        container="soak-sidecar",
    )
    pub = Publication("failed", "stale_progress", "x" * 100_000, 12, attempt=3)
    with client:
        outcome = publisher.publish(pub)
    assert outcome.termination_message and not outcome.annotations and not outcome.event
    assert len(outcome.errors) == 2
    assert all("unreachable after 3 tries" in str(e) for e in outcome.errors)
    assert len(sleeps) == 4
    back = parse_termination_message(log.read_text(encoding="utf-8"))
    assert back is not None and (back.exit_code, back.attempt) == (12, 3)
    assert log.stat().st_size <= 4096


def test_termination_message_write_errors_are_publish_errors(tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="termination message"):
        write_termination_message(tmp_path / "missing-dir" / "log", "x")
    target = tmp_path / "log"
    target.write_text("an older, longer message" * 10, encoding="utf-8")
    write_termination_message(target, "€" * 3000)
    data = target.read_bytes()
    assert len(data) <= 4096 and data.decode("utf-8").endswith("\u2026")


def test_explicit_host_needs_a_token() -> None:
    with pytest.raises(ConfigError):
        connect(host="http://127.0.0.1:1")


def test_progress_is_rate_limited(scripted: tuple[str, Script]) -> None:
    url, script = scripted
    with make_client(url, []) as client:
        publisher = PodPublisher(
            client,
            namespace="ns",
            pod_name="p",
            pod_uid="u",
            prefix="soak.sidecar.io/",
            termination_log=None,
            progress_interval_s=30.0,
        )
        sent = [
            publisher.progress("running", 1000.0, 10.0),
            publisher.progress("running", 1010.0, 20.0),  # within the interval
            publisher.progress("stopping", 1011.0, 21.0),  # phase change goes out at once
            publisher.progress("stopping", 1045.0, 55.0),
        ]
        script.answers += [(500, {}, status_body(500, "InternalError"))] * 4
        failed = publisher.progress("publishing", 1046.0, 56.0)
    assert sent == [True, False, True, True]
    assert failed is False  # advisory: swallowed
    assert len(script.requests) == 3 + 4
    last_ok = json.loads(script.requests[2][3])["metadata"]["annotations"]
    assert last_ok == {"soak.sidecar.io/phase": "stopping", "soak.sidecar.io/heartbeat": "1045"}


def test_verdict_cli_with_the_api_down(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{free_closed_port()}"}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
                "current-context": "x",
            }
        ),
        encoding="utf-8",
    )
    assert cli.main(["verdict", "job", "--kubeconfig", str(kubeconfig)]) == 151
    err = capsys.readouterr().err
    assert "list pods in ns" in err and "unreachable" in err  # namespace from the context
