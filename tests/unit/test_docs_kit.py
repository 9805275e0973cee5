"""docs/trainers.md's kit snippets: each adoption is as short as the page says, and is what the
runnable trainers CI runs under the real frameworks do (their lines marked ``# soak: N``)."""

from __future__ import annotations

import re

import pytest

from tests.docs_commands import REPO_ROOT, python_snippets

TRAINERS_MD = REPO_ROOT / "docs" / "trainers.md"
NUMBERED = re.compile(r"#\s*(\d+)\s*$")
# heading -> (the runnable trainer, the most lines the adoption may change)
ADOPTIONS = {
    "PyTorch Lightning: four lines": ("lightning_trainer.py", 4),
    "Hugging Face Trainer: three lines": ("hf_trainer.py", 3),
    "torchtitan: no line, or two": ("torchtitan_trainer.py", 2),
    "Your own loop (plain torchrun, DDP): four lines": (None, 4),
}


def numbered_lines(code: str) -> list[str]:
    """The snippet's lines marked ``# N``: the lines a user adds or changes."""
    return [line for line in code.splitlines() if NUMBERED.search(line)]


@pytest.mark.parametrize("heading", sorted(ADOPTIONS))
def test_each_adoption_changes_at_most_the_lines_its_heading_says(heading: str) -> None:
    snippets = python_snippets(TRAINERS_MD)
    trainer, most = ADOPTIONS[heading]
    marked = numbered_lines(snippets[heading])
    assert 1 <= len(marked) <= most, marked
    assert [int(NUMBERED.search(line).group(1)) for line in marked] == list(range(1, len(marked) + 1))  # type: ignore[union-attr]
    if trainer is None:
        return
    source = (REPO_ROOT / "tests" / "trainers" / trainer).read_text(encoding="utf-8")
    changed = [
        line.split("# soak:")[0].strip().rstrip(",") for line in source.splitlines() if "# soak:" in line
    ]
    assert len(changed) == len(marked), changed
    for code in changed:
        assert any(code in line for line in marked), f"{trainer}'s {code!r} is not in the snippet"
