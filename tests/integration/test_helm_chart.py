"""The Helm chart, rendered by real Helm engines (v3 binary and v4 SDK) and checked offline.

Lint, Kubernetes schema validation (kubernetes-validate --strict, oldest and newest supported
versions), values-schema rejections, the pod's security settings, the podFailurePolicy against
the exit-code table in code, and the sidecar's environment against the settings model.
"""

from __future__ import annotations

import copy
import json
import math
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sidecar.core.exitcodes import ExitCode
from sidecar.nvml_mock.scenario import load_scenario
from sidecar.settings import Settings, load_settings
from tests.components import require
from tests.fixtures.helm import (
    CHART_DIR,
    RUN_ID,
    HelmBinaryEngine,
    HelmEngine,
    HelmFailedError,
    HelmSdkEngine,
    Manifest,
    parse_manifests,
)

pytestmark = [pytest.mark.integration, pytest.mark.helm]

CI_VALUES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
VALUE_SETS: dict[str, dict[str, Any]] = {"default": {"runId": RUN_ID}} | {
    path.name: yaml.safe_load(path.read_text()) for path in CI_VALUES
}
OLDEST_KUBERNETES = "1.31.0"
SCHEMA = json.loads((CHART_DIR / "values.schema.json").read_text())
DEFAULTS = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def newest_kubernetes() -> str:
    from kubernetes_validate import utils

    return str(utils.latest_version())


def only(manifests: list[Manifest], kind: str) -> Manifest:
    found = [m for m in manifests if m["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, got {len(found)}"
    return found[0]


def pod_spec(manifests: list[Manifest]) -> dict[str, Any]:
    spec: dict[str, Any] = only(manifests, "Job")["spec"]["template"]["spec"]
    return spec


def container(manifests: list[Manifest], name: str) -> dict[str, Any]:
    spec = pod_spec(manifests)
    (found,) = [c for c in spec["containers"] + spec.get("initContainers", []) if c["name"] == name]
    return dict(found)


def with_values(base: dict[str, Any], **dotted: Any) -> dict[str, Any]:
    """A deep copy of base with dotted keys set (``{"job.backoffLimit": 1}``)."""
    values = copy.deepcopy(base)
    for key, value in dotted.items():
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return values


_RENDERED: dict[tuple[str, str, str], list[Manifest]] = {}


def render(engine: HelmEngine, values: dict[str, Any], release: str = "soak") -> list[Manifest]:
    """engine.template, memoised per engine and values (tests get their own copy)."""
    key = (engine.name, release, json.dumps(values, sort_keys=True))
    if key not in _RENDERED:
        _RENDERED[key] = engine.template(values, release=release)
    return copy.deepcopy(_RENDERED[key])


@pytest.fixture(scope="module", params=sorted(VALUE_SETS))
def value_set(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, VALUE_SETS[request.param]


# -- lint and Kubernetes validation ------------------------------------------------------------


def test_lint_strict_is_clean(helm_engine: HelmEngine, value_set: tuple[str, dict[str, Any]]) -> None:
    assert helm_engine.lint(value_set[1]) == []


def test_lint_reports_missing_run_id(helm_engine: HelmEngine) -> None:
    findings = helm_engine.lint({})
    assert any("runId" in finding for finding in findings), findings


def kubernetes_validate_cli(path: Path, version: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", version, str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, "newest"])
def test_rendered_objects_validate_strictly(helm_engine: HelmEngine, version: str, tmp_path: Path) -> None:
    """``kubernetes-validate --strict`` on every object of every value set, one call per version."""
    version = newest_kubernetes() if version == "newest" else version
    manifests = [m for values in VALUE_SETS.values() for m in render(helm_engine, values)]
    assert sum(m["kind"] == "Job" for m in manifests) == len(VALUE_SETS)
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(manifests))
    result = kubernetes_validate_cli(rendered, version)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("passed for resource") == len(manifests), result.stdout


def test_kubernetes_validate_catches_a_bad_object(helm_engine: HelmEngine, tmp_path: Path) -> None:
    """The validation above must be able to fail: an unknown container field is rejected."""
    manifests = render(helm_engine, VALUE_SETS["default"])
    pod_spec(manifests)["containers"][0]["bogusField"] = True
    rendered = tmp_path / "bad.yaml"
    rendered.write_text(yaml.safe_dump_all(manifests))
    result = kubernetes_validate_cli(rendered, OLDEST_KUBERNETES)
    assert result.returncode != 0
    assert "bogusField" in result.stdout + result.stderr


def test_chart_refuses_kubernetes_older_than_1_31(helm_binary: Path) -> None:
    result = subprocess.run(
        [
            str(helm_binary),
            "template",
            "soak",
            str(CHART_DIR),
            "--kube-version",
            "1.30.0",
            "--set",
            f"runId={RUN_ID}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode != 0
    assert "kubeVersion" in result.stderr or "incompatible" in result.stderr, result.stderr


# -- values schema -----------------------------------------------------------------------------


BAD_VALUES: dict[str, dict[str, Any]] = {
    "unknown top-level key": {"runId": RUN_ID, "replicas": 2},
    "unknown nested key": with_values({"runId": RUN_ID}, **{"deadline.budgetSecs": 10}),
    "missing runId": {},
    "runId not a UUID": {"runId": "soak-1"},
    "runId with trailing junk": {"runId": RUN_ID + "0"},
    "negative budget": with_values({"runId": RUN_ID}, **{"deadline.budgetSeconds": -1}),
    "zero budget": with_values({"runId": RUN_ID}, **{"deadline.budgetSeconds": 0}),
    "zero budget cap": with_values({"runId": RUN_ID}, **{"deadline.maxBudgetSeconds": 0}),
    "budget as a string": with_values({"runId": RUN_ID}, **{"deadline.budgetSeconds": "1h"}),
    "root UID": with_values({"runId": RUN_ID}, **{"podSecurity.runAsUser": 0}),
    "unknown store": with_values({"runId": RUN_ID}, **{"deadline.store": "memory"}),
    "file store without a PVC": with_values({"runId": RUN_ID}, **{"deadline.store": "file"}),
    "unknown retryable action": with_values({"runId": RUN_ID}, **{"job.retryableExitCodeAction": "FailJob"}),
    "empty trainer command": with_values({"runId": RUN_ID}, **{"trainer.command": []}),
    "unknown gpu backend": with_values({"runId": RUN_ID}, **{"gpu.backend": "cuda"}),
    "unknown resources key": with_values({"runId": RUN_ID}, **{"trainer.resources": {"limit": {}}}),
    "bad image digest": with_values({"runId": RUN_ID}, **{"image.digest": "latest"}),
    "negative stale timeout": with_values({"runId": RUN_ID}, **{"monitor.staleProgressSeconds": -5}),
    "phase calibration below 1": with_values({"runId": RUN_ID}, **{"monitor.phaseCalibrationFactor": 0.5}),
    # What the sidecar would refuse at start (tests/unit/test_chart_schema_bounds.py checks them all).
    "sample interval below 10 ms": with_values({"runId": RUN_ID}, **{"monitor.sampleIntervalSeconds": 0.001}),
    "budget above a year": with_values({"runId": RUN_ID}, **{"deadline.budgetSeconds": 1e12}),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_schema_rejects_bad_values(helm_engine: HelmEngine, case: str) -> None:
    with pytest.raises(HelmFailedError):
        render(helm_engine, BAD_VALUES[case])


def test_template_rejects_budget_above_its_cap(helm_engine: HelmEngine) -> None:
    values = with_values({"runId": RUN_ID}, **{"deadline.budgetSeconds": 7201})
    with pytest.raises(HelmFailedError, match="maxBudgetSeconds"):
        render(helm_engine, values)
    raised = with_values(values, **{"deadline.maxBudgetSeconds": 7201})
    env = sidecar_environment(render(helm_engine, raised))
    assert env["SOAK_DEADLINE__BUDGET_S"] == env["SOAK_DEADLINE__MAX_BUDGET_S"] == "7201"


def test_template_rejects_margin_not_below_budget(helm_engine: HelmEngine) -> None:
    values = with_values(
        {"runId": RUN_ID}, **{"deadline.budgetSeconds": 100, "deadline.checkpointMarginSeconds": 100}
    )
    with pytest.raises(HelmFailedError, match="checkpointMarginSeconds"):
        render(helm_engine, values)


def test_stop_grace_reaches_the_sidecar_and_must_fit_the_pods_grace(helm_engine: HelmEngine) -> None:
    """trainer.stopGraceSeconds: the sidecar's default (30 s) when null; refused when it leaves the
    sidecar less than 10 s of terminationGracePeriodSeconds."""
    assert "SOAK_LAUNCHER__STOP_GRACE_S" not in sidecar_environment(render(helm_engine, {"runId": RUN_ID}))
    short = with_values({"runId": RUN_ID}, **{"pod.terminationGracePeriodSeconds": 15})
    values = with_values(short, **{"trainer.stopGraceSeconds": 0})
    assert sidecar_environment(render(helm_engine, values))["SOAK_LAUNCHER__STOP_GRACE_S"] == "0"
    for stop_grace in (None, 6):
        values = with_values(short, **{"trainer.stopGraceSeconds": stop_grace})
        with pytest.raises(HelmFailedError, match="stopGraceSeconds must leave the sidecar at least 10 s"):
            render(helm_engine, values)


def test_the_trainers_memory_limit_reaches_the_sidecar(helm_engine: HelmEngine) -> None:
    values = with_values(
        {"runId": RUN_ID},
        **{"trainer.resources": {"limits": {"memory": "8Gi"}}, "monitor.failOnProjectedMemoryLimit": True},
    )
    names = ("SOAK_MONITOR__MEMORY_LIMIT", "SOAK_MONITOR__FAIL_ON_PROJECTED_MEMORY_LIMIT")
    env = sidecar_environment(render(helm_engine, values))
    assert [env[name] for name in names] == ["8Gi", "true"]
    plain = sidecar_environment(render(helm_engine, {"runId": RUN_ID}))
    assert not set(names) & set(plain)


def test_slowdown_limit_reaches_the_sidecar_only_when_set(helm_engine: HelmEngine) -> None:
    assert "SOAK_GPU__FAIL_ON_SLOWDOWN_S" not in sidecar_environment(render(helm_engine, {"runId": RUN_ID}))
    values = with_values({"runId": RUN_ID}, **{"gpu.failOnSlowdownSeconds": 300})
    assert sidecar_environment(render(helm_engine, values))["SOAK_GPU__FAIL_ON_SLOWDOWN_S"] == "300"


def test_phase_calibration_reaches_the_sidecar_only_when_set(helm_engine: HelmEngine) -> None:
    name = "SOAK_MONITOR__PHASE_CALIBRATION_FACTOR"
    assert name not in sidecar_environment(render(helm_engine, {"runId": RUN_ID}))
    values = with_values({"runId": RUN_ID}, **{"monitor.phaseCalibrationFactor": 3})
    assert sidecar_environment(render(helm_engine, values))[name] == "3"


def test_a_checkpoint_volume_resumes_a_retried_pod(
    helm_engine: HelmEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """checkpoint.existingClaim: the PVC read-write in the trainer, read-only in the sidecar, and the
    settings that make a retried pod resume from the soak's record in it; none of it without."""
    plain = render(helm_engine, {"runId": RUN_ID})
    assert not {"SOAK_DEADLINE__CHECKPOINT_PATH", "SOAK_DEADLINE__AUTO_RESUME"} & set(
        sidecar_environment(plain)
    )
    assert "checkpoints" not in {v["name"] for v in pod_spec(plain)["volumes"]}
    values = with_values(
        {"runId": RUN_ID}, **{"checkpoint.existingClaim": "soak-ck", "checkpoint.subPath": "a"}
    )
    manifests = render(helm_engine, values)
    (volume,) = [v for v in pod_spec(manifests)["volumes"] if v["name"] == "checkpoints"]
    assert volume["persistentVolumeClaim"] == {"claimName": "soak-ck"}
    mounts = {
        name: [m for m in container(manifests, name)["volumeMounts"] if m["name"] == "checkpoints"]
        for name in ("trainer", "soak-sidecar")
    }
    assert mounts["trainer"] == [{"name": "checkpoints", "mountPath": "/soak/checkpoints", "subPath": "a"}]
    assert mounts["soak-sidecar"] == [
        {"name": "checkpoints", "mountPath": "/soak/checkpoints", "readOnly": True, "subPath": "a"}
    ]
    for name in [n for n in os.environ if n.startswith("SOAK_")]:
        monkeypatch.delenv(name)
    for name, value in sidecar_environment(manifests).items():
        monkeypatch.setenv(name, value)
    deadline = load_settings().deadline
    assert str(deadline.checkpoint_path) == f"/soak/checkpoints/{RUN_ID}/checkpoint.json"
    assert deadline.auto_resume is True
    by_hand = with_values(values, **{"checkpoint.autoResume": False})
    assert sidecar_environment(render(helm_engine, by_hand))["SOAK_DEADLINE__AUTO_RESUME"] == "false"


def _schema_nodes(node: dict[str, Any], path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    yield path, node
    for key, child in node.get("properties", {}).items():
        yield from _schema_nodes(child, f"{path}.{key}" if path else key)


# Kubernetes objects passed through verbatim (validated by Kubernetes itself) and the mock
# scenario (validated by the sidecar's scenario loader) are the only open objects.
OPEN_OBJECTS = {
    "commonLabels",
    "job.annotations",
    "job.labels",
    "pod.annotations",
    "pod.labels",
    "pod.nodeSelector",
    "pod.affinity",
    "gpu.mock.scenario",
    "serviceAccount.annotations",
    "trainer.resources.requests",
    "trainer.resources.limits",
    "sidecar.resources.requests",
    "sidecar.resources.limits",
    "metrics.podMonitor.labels",
}


def test_schema_is_draft07_closed_described_and_defaults_match_values_yaml() -> None:
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    assert SCHEMA["required"] == ["runId"]
    for path, node in _schema_nodes(SCHEMA):
        if not path:
            continue
        assert node.get("description"), f"{path} has no description"
        if node.get("type") == "object" and path not in OPEN_OBJECTS:
            assert node.get("additionalProperties") is False, f"{path} accepts unknown keys"
        if path.count(".") == 0 or "default" in node:
            value: Any = DEFAULTS
            for part in path.split("."):
                value = value[part]
            assert node["default"] == value, f"{path}: schema default differs from values.yaml"


def test_every_values_yaml_key_is_commented() -> None:
    # Example data under these keys (a scenario, Kubernetes quantities) is not chart structure.
    examples = ("gpu.mock.scenario.", "sidecar.resources.")
    stack: list[str] = []
    commented = False
    for number, line in enumerate((CHART_DIR / "values.yaml").read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("# --"):
            commented = True
            continue
        if not stripped or stripped.startswith("#") or stripped.startswith("-"):
            continue
        key = stripped.split(":", 1)[0]
        depth = (len(line) - len(line.lstrip())) // 2
        stack = [*stack[:depth], key]
        path = ".".join(stack)
        if not path.startswith(examples):
            assert commented, f"values.yaml:{number}: {path} has no '# --' comment"
        commented = False


# -- the pod: layout and security --------------------------------------------------------------


def test_pod_layout(helm_engine: HelmEngine, value_set: tuple[str, dict[str, Any]]) -> None:
    values = value_set[1]
    manifests = render(helm_engine, values)
    job = only(manifests, "Job")
    spec = pod_spec(manifests)
    assert spec["restartPolicy"] == "Never"
    assert spec["shareProcessNamespace"] is True
    assert job["spec"]["podReplacementPolicy"] == "Failed"
    completions = values.get("job", {}).get("completions", 1)
    assert job["spec"]["completions"] == completions and job["spec"]["parallelism"] == completions
    merged = {**DEFAULTS["deadline"], **values.get("deadline", {})}
    grace = {**DEFAULTS["job"], **values.get("job", {})}["activeDeadlineGraceSeconds"]
    assert job["spec"]["activeDeadlineSeconds"] == math.ceil(merged["budgetSeconds"]) + grace
    assert job["spec"]["activeDeadlineSeconds"] > merged["budgetSeconds"]

    assert [c["name"] for c in spec["initContainers"]] == ["install-launcher"]
    assert [c["name"] for c in spec["containers"]] == ["trainer", "soak-sidecar"]
    # A regular container: a native sidecar (restartPolicy Always) never sets the pod phase.
    assert all("restartPolicy" not in c for c in spec["initContainers"] + spec["containers"])

    init = container(manifests, "install-launcher")
    assert init["command"] + init["args"] == ["soak-sidecar", "install-launcher", "--dest", "/soak/bin"]
    sidecar = container(manifests, "soak-sidecar")
    assert sidecar["command"] + sidecar["args"] == ["soak-sidecar", "run", "--pod"]
    assert init["image"] == sidecar["image"]
    assert sidecar["terminationMessagePath"] == "/dev/termination-log"
    assert sidecar["terminationMessagePolicy"] == "File"

    trainer = container(manifests, "trainer")
    trainer_values = {**DEFAULTS["trainer"], **values.get("trainer", {})}
    assert trainer["command"] == [
        trainer_values["python"],
        "/soak/bin/soak-launcher.py",
        "--run-dir",
        "/soak/run",
        # Why the launcher stopped the trainer lands in the pod status even when the sidecar died.
        "--termination-log",
        "/dev/termination-log",
        "--",
        *trainer_values["command"],
    ]
    assert trainer.get("args", []) == trainer_values["args"]
    if not trainer_values["image"]:
        assert trainer["image"] == sidecar["image"]

    mounts = {c["name"]: {m["mountPath"]: m for m in c["volumeMounts"]} for c in spec["containers"]}
    assert mounts["trainer"]["/soak/bin"]["readOnly"] is True
    assert "/soak/run" in mounts["trainer"] and "/soak/run" in mounts["soak-sidecar"]
    assert "/soak/progress" in mounts["trainer"] and "/soak/progress" in mounts["soak-sidecar"]
    assert {m["name"] for m in init["volumeMounts"]} == {"soak-bin"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["soak-bin"] and "emptyDir" in volumes["soak-run"]
    claim = values.get("progress", {}).get("existingClaim")
    if claim:
        assert volumes["progress"]["persistentVolumeClaim"]["claimName"] == claim
    else:
        assert "emptyDir" in volumes["progress"]


def test_security_settings(helm_engine: HelmEngine, value_set: tuple[str, dict[str, Any]]) -> None:
    values = value_set[1]
    manifests = render(helm_engine, values)
    spec = pod_spec(manifests)
    uid = values.get("podSecurity", {}).get("runAsUser", DEFAULTS["podSecurity"]["runAsUser"])
    assert uid > 0
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == uid
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert spec["automountServiceAccountToken"] is False
    assert "hostPID" not in spec and "hostNetwork" not in spec
    sidecar_uid = values.get("sidecar", {}).get("runAsUser", DEFAULTS["sidecar"]["runAsUser"])
    assert sidecar_uid != uid, "the sidecar runs under a UID of its own by default"
    for item in spec["initContainers"] + spec["containers"]:
        context = item["securityContext"]
        assert context["runAsNonRoot"] is True, item["name"]
        expected = sidecar_uid if item["name"] == "soak-sidecar" else uid
        assert context["runAsUser"] == expected, f"{item['name']}: runs as {context['runAsUser']}"
        assert context["readOnlyRootFilesystem"] is True, item["name"]
        assert context["allowPrivilegeEscalation"] is False, item["name"]
        assert context["privileged"] is False, item["name"]
        assert context["capabilities"] == {"drop": ["ALL"]}, item["name"]
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, item["name"]

    # The API token reaches the sidecar only, through a projected volume like the one the
    # kubelet would have injected everywhere.
    (token_volume,) = [v for v in spec["volumes"] if "projected" in v]
    sources = token_volume["projected"]["sources"]
    assert {"path": "token"}.items() <= sources[0]["serviceAccountToken"].items()
    assert sources[1]["configMap"]["name"] == "kube-root-ca.crt"
    assert sources[2]["downwardAPI"]["items"][0]["fieldRef"]["fieldPath"] == "metadata.namespace"
    for item in spec["initContainers"] + spec["containers"]:
        paths = {m["mountPath"]: m for m in item.get("volumeMounts", [])}
        if item["name"] == "soak-sidecar":
            assert paths[TOKEN_DIR]["name"] == token_volume["name"]
            assert paths[TOKEN_DIR]["readOnly"] is True
        else:
            assert TOKEN_DIR not in paths, item["name"]
            assert token_volume["name"] not in {m["name"] for m in item.get("volumeMounts", [])}

    create_sa = values.get("serviceAccount", {}).get("create", True)
    sa_name = spec["serviceAccountName"]
    if create_sa:
        account = only(manifests, "ServiceAccount")
        assert account["metadata"]["name"] == sa_name
        assert account["automountServiceAccountToken"] is False
    else:
        assert sa_name == values["serviceAccount"]["name"]
        assert not [m for m in manifests if m["kind"] == "ServiceAccount"]


def test_rbac_is_least_privilege(helm_engine: HelmEngine) -> None:
    manifests = render(helm_engine, VALUE_SETS["default"])
    role = only(manifests, "Role")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    # read_namespaced_pod, patch_namespaced_pod (annotations), create_namespaced_event; not
    # list_namespaced_pod (the attempt number falls back without it).
    assert granted == {
        ("", "pods", "get"),
        ("", "pods", "patch"),
        ("", "events", "create"),
        ("batch", "jobs", "get"),
    }
    assert all("*" not in rule["verbs"] for rule in role["rules"])
    # Only the pods' own Job: a soak must not read other Jobs of the namespace.
    job_rules = [rule for rule in role["rules"] if rule["resources"] == ["jobs"]]
    assert [rule["resourceNames"] for rule in job_rules] == [[only(manifests, "Job")["metadata"]["name"]]]
    assert all("resourceNames" not in rule for rule in role["rules"] if rule not in job_rules)
    binding = only(manifests, "RoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": pod_spec(manifests)["serviceAccountName"],
            "namespace": "soak",
        }
    ]
    assert not [m for m in manifests if m["kind"] in {"ClusterRole", "ClusterRoleBinding"}]


def test_rbac_and_service_account_can_be_external(helm_engine: HelmEngine) -> None:
    manifests = render(helm_engine, VALUE_SETS["file-store-values.yaml"])
    assert {m["kind"] for m in manifests} == {"Job"}
    with pytest.raises(HelmFailedError, match=r"serviceAccount\.name"):
        render(helm_engine, with_values({"runId": RUN_ID}, **{"serviceAccount.create": False}))


def test_labels(helm_engine: HelmEngine) -> None:
    manifests = render(helm_engine, VALUE_SETS["default"], release="nightly")
    for manifest in manifests:
        labels = manifest["metadata"]["labels"]
        assert labels["app.kubernetes.io/name"] == "soak-sidecar"
        assert labels["app.kubernetes.io/instance"] == "nightly"
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["helm.sh/chart"] == "soak-sidecar-0.1.0"
        # Cluster-scoped objects carry the namespace: one release per namespace, unique names.
        cluster_scoped = manifest["kind"].startswith("ValidatingAdmissionPolicy")
        assert manifest["metadata"]["name"] == (
            "nightly-soak-sidecar-soak" if cluster_scoped else "nightly-soak-sidecar"
        )
    pod_labels = only(manifests, "Job")["spec"]["template"]["metadata"]["labels"]
    assert pod_labels["soak.sidecar.io/run-id"] == RUN_ID


# -- podFailurePolicy against the exit-code table ----------------------------------------------


def policy_action(rules: list[dict[str, Any]], code: int) -> str | None:
    """The action Kubernetes takes when soak-sidecar exits with code (first matching rule)."""
    for rule in rules:
        on_codes = rule.get("onExitCodes")
        if on_codes is None or on_codes.get("containerName") != "soak-sidecar":
            continue
        listed = code in on_codes["values"]
        if listed == (on_codes["operator"] == "In"):
            return str(rule["action"])
    return None  # no rule: the default, which counts against backoffLimit


@pytest.mark.parametrize("retryable_action", ["Count", "Ignore"])
def test_pod_failure_policy_matches_exit_code_table(helm_engine: HelmEngine, retryable_action: str) -> None:
    values = with_values({"runId": RUN_ID}, **{"job.retryableExitCodeAction": retryable_action})
    rules = only(render(helm_engine, values), "Job")["spec"]["podFailurePolicy"]["rules"]

    assert rules[0] == {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    }
    for rule in rules[1:]:
        on_codes = rule["onExitCodes"]
        assert on_codes["containerName"] == "soak-sidecar"
        assert on_codes["values"] == sorted(set(on_codes["values"])), "values must be sorted, unique"
        assert 1 <= len(on_codes["values"]) <= 255
        assert 0 not in on_codes["values"], "0 is not allowed with In (and means passed)"

    # Every named code of ExitCode, from the table in code; a suspended Job's attempt is no failure.
    for code in ExitCode:
        expected = None if code == ExitCode.PASSED else retryable_action if code.retryable else "FailJob"
        expected = "Ignore" if code == ExitCode.JOB_SUSPENDED else expected
        assert policy_action(rules, int(code)) == expected, code.name
    # And every possible exit status: 1-127 permanent (Kubeflow convention), the named retryable
    # codes get the configured action, anything else >= 128 (killed by a signal) the default.
    named_retryable = {int(code) for code in ExitCode if code.retryable}
    for status in range(1, 256):
        if status < 128:
            expected = "FailJob"
        elif status == ExitCode.JOB_SUSPENDED:
            expected = "Ignore"
        elif status in named_retryable:
            expected = retryable_action
        else:
            expected = None
        assert policy_action(rules, status) == expected, status


def test_disruptions_can_count(helm_engine: HelmEngine) -> None:
    values = with_values({"runId": RUN_ID}, **{"job.ignoreDisruptions": False})
    rules = only(render(helm_engine, values), "Job")["spec"]["podFailurePolicy"]["rules"]
    assert all("onPodConditions" not in rule for rule in rules)


# -- the sidecar's configuration contract ------------------------------------------------------


FIELD_REF_SAMPLES = {
    "metadata.name": "soak-abcde",
    "metadata.namespace": "soak",
    "metadata.uid": "0f9e8d7c-6b5a-4948-8372-615243342516",
    "metadata.annotations['batch.kubernetes.io/job-completion-index']": "1",
}


def sidecar_environment(manifests: list[Manifest]) -> dict[str, str]:
    """The sidecar's env as the kubelet would set it (downward API filled with samples)."""
    env: dict[str, str] = {}
    for item in container(manifests, "soak-sidecar")["env"]:
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item.get("valueFrom", {}):
            env[item["name"]] = FIELD_REF_SAMPLES[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            assert "secretKeyRef" in item["valueFrom"], item
            env[item["name"]] = "secret"
    return env


def assert_credentials_are_sidecar_files(
    manifests: list[Manifest], env: dict[str, str], values: dict[str, Any], settings: Settings
) -> None:
    # Credentials are never environment variables, only files in the sidecar container.
    assert not [name for name in env if name.startswith("AWS_")]
    secret = values.get("s3", {}).get("credentials", {}).get("existingSecret")
    if secret:
        assert str(settings.s3.credentials_dir) == "/soak/credentials/s3"
        sidecar = container(manifests, "soak-sidecar")
        assert {"name": "s3-credentials", "mountPath": "/soak/credentials/s3", "readOnly": True} in sidecar[
            "volumeMounts"
        ]
        trainer = container(manifests, "trainer")
        assert "s3-credentials" not in {m["name"] for m in trainer["volumeMounts"]}
        (volume,) = [v for v in pod_spec(manifests)["volumes"] if v["name"] == "s3-credentials"]
        assert volume["secret"]["secretName"] == secret
        assert {i["path"] for i in volume["secret"]["items"]} == {"access-key-id", "secret-access-key"}
    else:
        assert settings.s3.credentials_dir is None


def test_sidecar_env_builds_valid_settings(
    helm_engine: HelmEngine, value_set: tuple[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    values = value_set[1]
    manifests = render(helm_engine, values)
    env = sidecar_environment(manifests)
    for name in list(os.environ):
        if name.startswith("SOAK_"):
            monkeypatch.delenv(name)
    for name, value in env.items():
        assert isinstance(value, str), name
        monkeypatch.setenv(name, value)

    soak_names = [name for name in env if name.startswith("SOAK_")]
    for name in soak_names:
        group, _, field = name.removeprefix("SOAK_").lower().partition("__")
        assert group in Settings.model_fields, f"{name}: no settings group {group!r}"
        model = Settings.model_fields[group].annotation
        assert model is not None and field in model.model_fields, f"{name}: no field {group}.{field}"

    settings = load_settings()
    deadline = {**DEFAULTS["deadline"], **values.get("deadline", {})}
    assert settings.deadline.run_id == values["runId"]
    assert settings.deadline.budget_s == deadline["budgetSeconds"]
    assert settings.deadline.max_budget_s == deadline["maxBudgetSeconds"]
    assert settings.deadline.checkpoint_margin_s == deadline["checkpointMarginSeconds"]
    assert settings.deadline.store == deadline["store"]
    if deadline["store"] == "file":
        assert str(settings.deadline.store_dir) == "/soak/deadlines"
    assert str(settings.launcher.run_dir) == "/soak/run"
    assert str(settings.monitor.progress_dir) == "/soak/progress"
    assert str(settings.artifact.output_dir) == "/soak/artifacts"
    assert settings.kube.pod_name == FIELD_REF_SAMPLES["metadata.name"]
    assert settings.kube.namespace == FIELD_REF_SAMPLES["metadata.namespace"]
    assert settings.kube.pod_uid == FIELD_REF_SAMPLES["metadata.uid"]
    assert settings.kube.trainer_container == "trainer"
    assert str(settings.kube.termination_log) == "/dev/termination-log"
    s3 = {**DEFAULTS["s3"], **values.get("s3", {})}
    assert settings.s3.bucket == s3["bucket"]
    assert settings.s3.endpoint_url == (s3["endpointUrl"] or None)
    monitor = {**DEFAULTS["monitor"], **values.get("monitor", {})}
    assert settings.monitor.sample_interval_s == monitor["sampleIntervalSeconds"]
    assert_credentials_are_sidecar_files(manifests, env, values, settings)
    if values.get("gpu", {}).get("mock", {}).get("enabled"):
        assert settings.gpu.backend == "mock"
        assert str(settings.gpu.mock_scenario) == "/soak/gpu-mock/scenario.json"
    else:
        assert settings.gpu.backend == values.get("gpu", {}).get("backend", "auto")


def test_sidecar_env_uses_plain_numbers(helm_engine: HelmEngine) -> None:
    values = with_values(
        {"runId": RUN_ID},
        **{
            "deadline.budgetSeconds": 604800,
            "deadline.maxBudgetSeconds": 604800,
            "monitor.sampleIntervalSeconds": 0.25,
            "monitor.startupTimeoutSeconds": 1000000,
        },
    )
    env = sidecar_environment(render(helm_engine, values))
    assert env["SOAK_DEADLINE__BUDGET_S"] == "604800"
    assert env["SOAK_MONITOR__SAMPLE_INTERVAL_S"] == "0.25"
    assert env["SOAK_MONITOR__STARTUP_TIMEOUT_S"] == "1000000"


def test_gpu_mock_configmap_holds_a_valid_scenario(helm_engine: HelmEngine, tmp_path: Path) -> None:
    manifests = render(helm_engine, VALUE_SETS["kind-values.yaml"])
    config_map = only(manifests, "ConfigMap")
    spec = pod_spec(manifests)
    (volume,) = [v for v in spec["volumes"] if v["name"] == "gpu-mock"]
    assert volume["configMap"]["name"] == config_map["metadata"]["name"]
    annotations = only(manifests, "Job")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/gpu-mock"]
    scenario = tmp_path / "scenario.json"
    scenario.write_text(config_map["data"]["scenario.json"])
    assert json.loads(scenario.read_text()) == DEFAULTS["gpu"]["mock"]["scenario"]
    load_scenario(scenario)
    # No mock, no ConfigMap.
    assert not [m for m in render(helm_engine, VALUE_SETS["default"]) if m["kind"] == "ConfigMap"]


def test_sidecar_sees_node_gpus_only_for_nvml(helm_engine: HelmEngine) -> None:
    def nvidia_env(values: dict[str, Any]) -> dict[str, str]:
        env = sidecar_environment(render(helm_engine, values))
        return {k: v for k, v in env.items() if k.startswith("NVIDIA_")}

    assert nvidia_env(VALUE_SETS["default"]) == {
        "NVIDIA_VISIBLE_DEVICES": "all",
        "NVIDIA_DRIVER_CAPABILITIES": "utility",
    }
    assert nvidia_env(VALUE_SETS["kind-values.yaml"]) == {}
    assert nvidia_env(with_values({"runId": RUN_ID}, **{"gpu.backend": "none"})) == {}
    trainer = container(render(helm_engine, VALUE_SETS["gpu-values.yaml"]), "trainer")
    assert trainer["resources"]["limits"]["nvidia.com/gpu"] == 1


def test_notes_tell_how_to_read_the_verdict() -> None:
    require("helm-sdk")
    import helm_python

    chart = helm_python.Chart.load(CHART_DIR)
    rendered = chart.render({"runId": RUN_ID}, name="nightly", namespace="ml", is_install=True)
    (notes,) = [text for path, text in rendered.items() if path.endswith("NOTES.txt")]
    # It waits as long as the Job may run: the budget plus the backstop's grace (7200 + 1800).
    assert "soak-sidecar verdict nightly-soak-sidecar -n ml --wait 9000" in notes
    assert RUN_ID in notes


def test_engines_render_the_same_objects(helm_binary: Path) -> None:
    require("helm-sdk")
    for name, values in VALUE_SETS.items():

        def ordered(manifests: list[Manifest]) -> list[Manifest]:
            return sorted(manifests, key=lambda m: (m["kind"], m["metadata"]["name"]))

        binary = ordered(HelmBinaryEngine(helm_binary).template(values))
        assert binary == ordered(HelmSdkEngine().template(values)), name


def test_the_network_policy_is_optional_closes_ingress_and_limits_egress(helm_engine: HelmEngine) -> None:
    assert "NetworkPolicy" not in {m["kind"] for m in render(helm_engine, VALUE_SETS["default"])}
    values = VALUE_SETS["gpu-values.yaml"]
    manifests = render(helm_engine, values)
    policy = only(manifests, "NetworkPolicy")["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["ingress"] == []
    pod_labels = only(manifests, "Job")["spec"]["template"]["metadata"]["labels"]
    assert policy["podSelector"]["matchLabels"].items() <= pod_labels.items()
    dns, *given = policy["egress"]
    assert {p["port"] for p in dns["ports"]} == {53}
    assert given == values["networkPolicy"]["egress"]


GOLDEN = Path(__file__).resolve().parents[1] / "data" / "chart"


@pytest.mark.parametrize("name", ["default", "file-store-values.yaml", "gpu-values.yaml", "kind-values.yaml"])
def test_single_pod_values_render_exactly_as_recorded(helm_engine: HelmEngine, name: str) -> None:
    """tests/data/chart holds what each single-pod value set rendered before multi-pod soaks
    (``helm template soak helm/soak-sidecar --namespace soak --values VALUES``); a deliberate change
    regenerates it (since: gpu-values' trainer memory limit reaches the sidecar)."""
    golden = GOLDEN / ("default.yaml" if name == "default" else name)

    def by_kind(manifests: list[Manifest]) -> list[Manifest]:  # engines order kinds differently
        return sorted(manifests, key=lambda m: (m["kind"], m["metadata"]["name"]))

    expected = by_kind(parse_manifests(golden.read_text(encoding="utf-8")))
    assert by_kind(render(helm_engine, VALUE_SETS[name])) == expected


def test_an_indexed_soak_rendezvouses_through_a_headless_service(helm_engine: HelmEngine) -> None:
    values = VALUE_SETS["indexed-values.yaml"]
    manifests = render(helm_engine, values)
    job = only(manifests, "Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == ("Indexed", 2, 2)
    assert spec["backoffLimitPerIndex"] == 1 and spec["maxFailedIndexes"] == 0
    rules = {rule["action"] for rule in spec["podFailurePolicy"]["rules"]}
    assert "FailJob" in rules  # a permanent verdict of any index fails the Job at once
    service = only(manifests, "Service")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= job["spec"]["template"]["metadata"]["labels"].items()
    assert pod["subdomain"] == service["metadata"]["name"]
    trainer = {e["name"]: e for e in container(manifests, "trainer")["env"]}
    master = f"{job['metadata']['name']}-0.{service['metadata']['name']}.soak.svc"
    assert trainer["MASTER_ADDR"]["value"] == trainer["PET_MASTER_ADDR"]["value"] == master
    assert trainer["MASTER_PORT"]["value"] == "29400" and trainer["NNODES"]["value"] == "2"
    index_path = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    assert trainer["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"] == index_path
    sidecar = {e["name"]: e for e in container(manifests, "soak-sidecar")["env"]}
    assert sidecar["SOAK_KUBE__COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == index_path
    assert sidecar["SOAK_KUBE__COMPLETIONS"]["value"] == "2"


def test_metrics_port_podmonitor_and_network_policy(helm_engine: HelmEngine) -> None:
    """metrics.enabled: a named port on the sidecar, the settings that serve it, a PodMonitor that
    selects the soak's pods by that port, and a NetworkPolicy that lets the scrape (and, in a
    multi-pod soak, the other pods) in."""
    values = with_values(
        {"runId": RUN_ID},
        **{
            "metrics.enabled": True,
            "metrics.podMonitor.enabled": True,
            "metrics.podMonitor.labels": {"release": "kube-prometheus"},
            "networkPolicy.enabled": True,
            "job.completions": 2,
        },
    )
    manifests = render(helm_engine, values)
    sidecar = container(manifests, "soak-sidecar")
    assert sidecar["ports"] == [{"name": "metrics", "containerPort": 9400, "protocol": "TCP"}]
    env = sidecar_environment(manifests)
    assert (env["SOAK_METRICS__PORT"], env["SOAK_METRICS__ADDRESS"]) == ("9400", "0.0.0.0")
    monitor = only(manifests, "PodMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
    pod_labels = only(manifests, "Job")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert (endpoint["port"], endpoint["path"], endpoint["interval"]) == ("metrics", "/metrics", "30s")
    peers, scrape = only(manifests, "NetworkPolicy")["spec"]["ingress"]
    assert peers["from"][0]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert scrape == {"ports": [{"protocol": "TCP", "port": 9400}]}
    plain = render(helm_engine, {"runId": RUN_ID})
    assert "ports" not in container(plain, "soak-sidecar")
    assert "PodMonitor" not in {m["kind"] for m in plain}
