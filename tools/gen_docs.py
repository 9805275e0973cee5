"""Regenerate the docs' tables from the code (one source of truth): the README's configuration and
exit-code tables, docs/gpu-health.md's XID table, and the chart's lists of retryable and ignored
exit codes (its podFailurePolicy).

    python tools/gen_docs.py          # rewrite them in place
    python tools/gen_docs.py --check  # exit 1 when one is stale (the test suite runs this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sidecar.core.exitcodes import ExitCode
from sidecar.core.gpu_health import XID_CATALOG
from sidecar.core.verdict import exit_code_table_markdown
from sidecar.settings import Settings

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
GPU_HEALTH = ROOT / "docs" / "gpu-health.md"
HELPERS = ROOT / "helm" / "soak-sidecar" / "templates" / "_helpers.tpl"
MARKDOWN_MARKERS = ("<!-- BEGIN {} -->", "<!-- END {} -->")
# Go template comments: Helm renders nothing of them.
TEMPLATE_MARKERS = (
    "{{{{/* BEGIN {}: generated from ExitCode by tools/gen_docs.py, do not edit */}}}}",
    "{{{{/* END {} */}}}}",
)


def _default(value: Any) -> str:
    if value is None:
        return "unset"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "empty"
    return str(value)


def settings_table() -> str:
    rows = ["| environment variable | default | meaning |", "|---|---|---|"]
    for group_name, group_field in Settings.model_fields.items():
        group = group_field.default_factory() if group_field.default_factory else group_field.default  # type: ignore[call-arg]
        assert isinstance(group, BaseModel)
        for name, field in type(group).model_fields.items():
            env = f"SOAK_{group_name.upper()}__{name.upper()}"
            text = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{env}` | `{_default(getattr(group, name))}` | {text} |")
    return "\n".join(rows)


def xid_table() -> str:
    blame = {
        "gpu": "the GPU or its node: `gpu_fault` (150, retried on another node)",
        "application": "the application: recorded against the trainer, never a GPU fault",
    }
    rows = ["| XID | meaning | blames |", "|---|---|---|"]
    rows += [
        f"| {xid} | {entry.meaning} | {blame[entry.cause]} |" for xid, entry in sorted(XID_CATALOG.items())
    ]
    return "\n".join(rows)


def chart_exit_code_lists() -> str:
    """The chart's named retryable exit codes (the podFailurePolicy's retryable action) and those
    that are no failure (ignored), from ExitCode."""
    retryable = [int(code) for code in ExitCode if code.retryable and code.failure]
    ignored = [int(code) for code in ExitCode if code.retryable and not code.failure]
    return "\n".join([
        '{{- define "soak-sidecar.retryableExitCodes" -}}',
        f"[{', '.join(map(str, retryable))}]",
        "{{- end }}",
        "",
        '{{- define "soak-sidecar.ignoredExitCodes" -}}',
        f"[{', '.join(map(str, ignored))}]",
        "{{- end }}",
    ])  # fmt: skip


def fill(text: str, name: str, tables: dict[str, str], markers: tuple[str, str] = MARKDOWN_MARKERS) -> str:
    for marker, table in tables.items():
        begin, end = markers[0].format(marker), markers[1].format(marker)
        head, _, rest = text.partition(begin)
        _, _, tail = rest.partition(end)
        if not rest:
            raise SystemExit(f"{name} lacks the {begin} marker")
        text = f"{head}{begin}\n{table}\n{end}{tail}"
    return text


def refresh_helpers(text: str) -> str:
    return fill(text, HELPERS.name, {"exit-code-lists": chart_exit_code_lists()}, TEMPLATE_MARKERS)


def render(readme: str) -> str:
    return fill(readme, "README.md", {"settings": settings_table(), "exit-codes": exit_code_table_markdown()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    stale = []
    for path, refresh in (
        (README, render),
        (GPU_HEALTH, lambda text: fill(text, GPU_HEALTH.name, {"xids": xid_table()})),
        (HELPERS, refresh_helpers),
    ):
        current = path.read_text(encoding="utf-8")
        fresh = refresh(current)
        if fresh == current:
            continue
        stale.append(path.name)
        if not args.check:
            path.write_text(fresh, encoding="utf-8")
    if args.check and stale:
        print(f"{', '.join(stale)} stale: run python tools/gen_docs.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
