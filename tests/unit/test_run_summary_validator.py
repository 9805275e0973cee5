"""The pluggable runtime-manifest validator: loading, ordering after replay ingress, failures."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from sidecar.adapters.validators import resolve_manifest_validator
from sidecar.core.errors import ConfigError
from sidecar.core.run_summary import ValidatorUnavailable, evaluate_parsed

DATA = Path(__file__).resolve().parents[1] / "data" / "run_summary"

PLUGIN = textwrap.dedent(
    """
    CALLS = []

    def strict(manifest, *, completed):
        CALLS.append((dict(manifest), completed))
        if manifest.get("producer") != "unilab":
            raise ValueError(f"producer must be 'unilab', got {manifest.get('producer')!r}")

    def typed(manifest, completed):
        if not isinstance(manifest.get("schema_version"), int):
            raise TypeError("schema_version must be int")

    def crashes(manifest, *, completed):
        raise RuntimeError("validator bug")

    class Holder:
        @staticmethod
        def nested(manifest, *, completed):
            return None

    NOT_CALLABLE = 42
    """
)


def load(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((DATA / name).read_text())
    return document


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path holding plug-in modules; they are unloaded afterwards."""
    (tmp_path / "soak_test_plugin.py").write_text(PLUGIN)
    (tmp_path / "soak_test_broken.py").write_text("raise RuntimeError('broken at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("soak_test_plugin", "soak_test_broken", "soak_test_ep"):
        sys.modules.pop(name, None)


def test_module_function_spec_is_called_with_completed_flag(plugin_path: Path) -> None:
    validator = resolve_manifest_validator("soak_test_plugin:strict")
    assert callable(validator)
    plugin = sys.modules["soak_test_plugin"]

    completed = load("minimal_completed.json")
    outcome = evaluate_parsed(completed, manifest_validator=validator)
    assert outcome.failures == ("runtime_manifest violates v2 contract: producer must be 'unilab', got None",)
    assert outcome.classification == "schema_violation"
    assert plugin.CALLS[-1][1] is True

    completed["runtime_manifest"]["producer"] = "unilab"
    assert evaluate_parsed(completed, manifest_validator=validator).passed

    abnormal = load("minimal_abnormal.json")
    outcome = evaluate_parsed(abnormal, manifest_validator=validator)
    assert plugin.CALLS[-1][1] is False
    # after the status message, before the shutdown description; the kind stays the trainer's
    assert outcome.failures[:2] == (
        "run_summary status is 'failed', expected 'completed'",
        "runtime_manifest violates v2 contract: producer must be 'unilab', got None",
    )
    assert outcome.failures[2].startswith("shutdown classification='learner_failure'")
    assert outcome.classification == "learner_failure"


def test_type_errors_count_and_positional_completed_is_accepted(plugin_path: Path) -> None:
    validator = resolve_manifest_validator("soak_test_plugin:typed")
    assert callable(validator)
    assert evaluate_parsed(load("minimal_completed.json"), manifest_validator=validator).passed


def test_dotted_attribute(plugin_path: Path) -> None:
    validator = resolve_manifest_validator("soak_test_plugin:Holder.nested")
    assert callable(validator)
    assert evaluate_parsed(load("minimal_completed.json"), manifest_validator=validator).passed


def test_replay_ingress_failure_hides_the_generic_validator(plugin_path: Path) -> None:
    validator = resolve_manifest_validator("soak_test_plugin:strict")
    plugin = sys.modules["soak_test_plugin"]
    calls_before = len(plugin.CALLS)
    document = load("minimal_completed.json")
    document["runtime_manifest"]["replay_ingress"]["occupancy"] = 3
    outcome = evaluate_parsed(document, manifest_validator=validator)
    assert outcome.failures == ("replay_ingress occupancy does not match publication sequences: 3 != 0",)
    assert len(plugin.CALLS) == calls_before  # never reached


def test_crashing_validator_is_a_failure_not_an_exception(plugin_path: Path) -> None:
    validator = resolve_manifest_validator("soak_test_plugin:crashes")
    assert callable(validator)
    outcome = evaluate_parsed(load("minimal_completed.json"), manifest_validator=validator)
    assert outcome.failures == ("runtime_manifest validator failed: RuntimeError: validator bug",)
    assert outcome.classification == "schema_violation"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "soak_no_such_module:validate",
            "runtime_manifest validation requires soak_no_such_module:validate: "
            "No module named 'soak_no_such_module'",
        ),
        (
            "soak_test_broken:validate",
            "runtime_manifest validation requires soak_test_broken:validate: RuntimeError: broken at import",
        ),
        (
            "soak_test_plugin:missing",
            "runtime_manifest validation requires soak_test_plugin:missing: "
            "AttributeError: module 'soak_test_plugin' has no attribute 'missing'",
        ),
        (
            "soak_test_plugin:NOT_CALLABLE",
            "runtime_manifest validation requires soak_test_plugin:NOT_CALLABLE: 42 is not callable",
        ),
    ],
)
def test_unloadable_validator_fails_every_validation(plugin_path: Path, spec: str, message: str) -> None:
    validator = resolve_manifest_validator(spec)
    assert validator == ValidatorUnavailable(message)
    outcome = evaluate_parsed(load("minimal_completed.json"), manifest_validator=validator)
    assert outcome.failures == (message,)
    outcome = evaluate_parsed(load("minimal_abnormal.json"), manifest_validator=validator)
    assert message in outcome.failures


@pytest.mark.parametrize("spec", ["no_colon", ":f", "mod:", " : "])
def test_malformed_spec_is_a_config_error(spec: str) -> None:
    with pytest.raises(ConfigError, match="must be 'module:function'"):
        resolve_manifest_validator(spec)


def test_no_validator_skips_the_generic_step() -> None:
    assert resolve_manifest_validator(None, entry_point_group="soak_sidecar.test.none") is None
    assert evaluate_parsed(load("minimal_completed.json"), manifest_validator=None).passed


def _distribution(root: Path, name: str, entries: Mapping[str, str]) -> None:
    dist = root / f"{name}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    lines = "\n".join(f"{key} = {value}" for key, value in entries.items())
    (dist / "entry_points.txt").write_text(f"[soak_sidecar.test.validators]\n{lines}\n")


def test_entry_point_group(plugin_path: Path) -> None:
    _distribution(plugin_path, "soak_test_ep", {"unilab": "soak_test_plugin:strict"})
    validator = resolve_manifest_validator(None, entry_point_group="soak_sidecar.test.validators")
    assert callable(validator)
    outcome = evaluate_parsed(load("minimal_completed.json"), manifest_validator=validator)
    assert outcome.failures == ("runtime_manifest violates v2 contract: producer must be 'unilab', got None",)


def test_entry_point_that_cannot_load(plugin_path: Path) -> None:
    _distribution(plugin_path, "soak_test_ep", {"gone": "soak_gone_module:f"})
    validator = resolve_manifest_validator(None, entry_point_group="soak_sidecar.test.validators")
    assert validator == ValidatorUnavailable(
        "runtime_manifest validation requires soak_gone_module:f: No module named 'soak_gone_module'"
    )


def test_several_entry_points_are_ambiguous(plugin_path: Path) -> None:
    _distribution(
        plugin_path, "soak_test_ep", {"a": "soak_test_plugin:strict", "b": "soak_test_plugin:typed"}
    )
    with pytest.raises(ConfigError, match=r"several runtime_manifest validators .* a \(.*\), b \("):
        resolve_manifest_validator(None, entry_point_group="soak_sidecar.test.validators")
