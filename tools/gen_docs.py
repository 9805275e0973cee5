"""Regenerate the README's configuration and exit-code tables from the code (one source of truth).

    python tools/gen_docs.py          # rewrite README.md in place
    python tools/gen_docs.py --check  # exit 1 when README.md is stale (the test suite runs this)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from sidecar.core.verdict import exit_code_table_markdown
from sidecar.settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"


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


def render(readme: str) -> str:
    for marker, table in (("settings", settings_table()), ("exit-codes", exit_code_table_markdown())):
        begin, end = f"<!-- BEGIN {marker} -->", f"<!-- END {marker} -->"
        head, _, rest = readme.partition(begin)
        _, _, tail = rest.partition(end)
        if not rest:
            raise SystemExit(f"README.md lacks the {begin} marker")
        readme = f"{head}{begin}\n{table}\n{end}{tail}"
    return readme


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    current = README.read_text(encoding="utf-8")
    fresh = render(current)
    if args.check:
        if fresh != current:
            print("README.md is stale: run python tools/gen_docs.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(fresh, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
