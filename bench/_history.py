"""A module as an earlier commit had it: the baseline a benchmark measures against in the same run."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def module_at(commit: str, path: str) -> types.ModuleType:
    """``path`` (repository-relative) as ``commit`` had it, loaded as a module of its own."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:{path}"], capture_output=True, text=True, check=True
    ).stdout
    module = types.ModuleType(f"baseline_{Path(path).stem}")
    sys.modules[module.__name__] = module  # dataclasses look their module up there
    exec(compile(source, f"{module.__name__}.py", "exec"), module.__dict__)
    return module
