"""The README's promises that code can check: fresh tables, the two quickstart commands, CI parity."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_tables_match_the_code() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr


def test_readme_starts_with_the_two_commands_and_ci_runs_the_same_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert block[0].startswith("pip install -e '.[dev]' && soak-sidecar run --local")
    test_command = block[1].split("#", 1)[0].split("&&", 1)[1].strip()
    assert test_command == "python3 -m pytest"
    # CI runs that command in two halves (a marker expression and its negation: the whole suite),
    # then the e2e package again on kind.
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    halves = re.findall(rf'{test_command} -m "([^"]+)"', ci)
    assert halves[:2] == ["$first_half", "not ($first_half)"], halves
    assert re.search(r'^first_half="[^"$]+"$', ci, re.MULTILINE)


def test_every_setting_is_documented_with_unit_or_default() -> None:
    from sidecar.settings import Settings

    for group_field in Settings.model_fields.values():
        group_type = group_field.annotation
        assert group_type is not None
        for name, field in group_type.model_fields.items():
            assert field.description and "Default" in field.description, name
