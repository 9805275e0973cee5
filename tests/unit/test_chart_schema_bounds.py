"""The chart's values schema refuses whatever the sidecar would refuse at start: every value the Job
template passes to a SOAK_ setting has bounds in values.schema.json at least as strict as the
setting's (a Helm install fails at once, not a pod minutes later)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import annotated_types as at
import pytest

from sidecar.settings import Settings

CHART = Path(__file__).resolve().parents[2] / "helm" / "soak-sidecar"
SCHEMA = json.loads((CHART / "values.schema.json").read_text(encoding="utf-8"))
# "- name: SOAK_GROUP__FIELD" then "value: {{ ... .Values.a.b ... }}": which value feeds which setting.
MAPPED = re.findall(
    r"- name: SOAK_(\w+?)__(\w+)\n\s+value: \{\{ (?:include \"soak-sidecar\.number\" )?\.Values\.([\w.]+)",
    (CHART / "templates" / "job.yaml").read_text(encoding="utf-8"),
)


def schema_node(path: str) -> dict[str, Any]:
    node: dict[str, Any] = SCHEMA
    for part in path.split("."):
        node = node["properties"][part]
    return node


def setting_bounds(group: str, name: str) -> tuple[float, bool, float, bool]:
    """(low, low is exclusive, high, high is exclusive) of a settings field."""
    field = Settings.model_fields[group.lower()].annotation.model_fields[name.lower()]  # type: ignore[union-attr]
    low, low_open, high, high_open = -math.inf, False, math.inf, False
    for bound in field.metadata:
        if isinstance(bound, at.Ge):
            low = float(bound.ge)  # type: ignore[arg-type]
        elif isinstance(bound, at.Gt):
            low, low_open = float(bound.gt), True  # type: ignore[arg-type]
        elif isinstance(bound, at.Le):
            high = float(bound.le)  # type: ignore[arg-type]
        elif isinstance(bound, at.Lt):
            high, high_open = float(bound.lt), True  # type: ignore[arg-type]
    return low, low_open, high, high_open


def numeric(node: dict[str, Any]) -> bool:
    kinds = node.get("type")
    return bool({"number", "integer"} & set(kinds if isinstance(kinds, list) else [kinds]))


NUMERIC = [(g, n, v) for g, n, v in MAPPED if numeric(schema_node(v))]


def test_the_template_maps_the_numeric_values_this_test_checks() -> None:
    names = {value for _, _, value in NUMERIC}
    assert {"deadline.budgetSeconds", "monitor.sampleIntervalSeconds", "metrics.port"} <= names


@pytest.mark.parametrize(("group", "name", "value"), NUMERIC, ids=[v for _, _, v in NUMERIC])
def test_the_schema_is_at_least_as_strict_as_the_setting(group: str, name: str, value: str) -> None:
    node = schema_node(value)
    low, low_open, high, high_open = setting_bounds(group, name)
    if "exclusiveMinimum" in node:
        schema_low, schema_low_open = float(node["exclusiveMinimum"]), True
    else:
        schema_low, schema_low_open = float(node.get("minimum", -math.inf)), False
    schema_high = float(node.get("maximum", node.get("exclusiveMaximum", math.inf)))
    assert schema_low > low or (schema_low == low and (schema_low_open or not low_open)), (
        f"{value}: the schema's low bound {schema_low} is looser than SOAK_{group}__{name}'s {low}"
    )
    assert schema_high < high or (schema_high == high and ("exclusiveMaximum" in node or not high_open)), (
        f"{value}: the schema's high bound {schema_high} is looser than SOAK_{group}__{name}'s {high}"
    )


def test_the_chart_says_the_sidecar_runs_as_its_own_uid() -> None:
    """podSecurity is the trainer's identity; the sidecar's own UID is sidecar.runAsUser, and the
    chart's text must not claim one UID for every container."""
    chart = Path(__file__).resolve().parents[2] / "helm" / "soak-sidecar"
    helpers = (chart / "templates" / "_helpers.tpl").read_text(encoding="utf-8")
    assert '"uid" .Values.sidecar.runAsUser' in helpers
    for name in ("values.yaml", "values.schema.json", "templates/_helpers.tpl"):
        text = (chart / name).read_text(encoding="utf-8")
        assert "every container" not in text, name
    assert "The sidecar runs as another UID (sidecar.runAsUser)" in (chart / "values.yaml").read_text()
