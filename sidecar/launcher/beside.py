"""What ``install-launcher`` puts beside the launcher's file, found from the launcher's side: py-spy
(a stall's stacks) and the trainer kit (``kit/soak_sidecar_kit``, added to the trainer's PYTHONPATH)."""

from __future__ import annotations

import os
import sys

from .protocol.names import KIT_DIR_NAME, KIT_PACKAGE


def launcher_dir() -> str:
    """The folder of the launcher's file. Run as a zipapp, sys.argv[0] names a module inside the
    archive (soak-launcher.py/soak_launcher/__main__.py): the archive is the file on that path."""
    path = os.path.abspath(sys.argv[0])
    probe = path
    while not os.path.isfile(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return os.path.dirname(path)
        probe = parent
    return os.path.dirname(probe)


def kit_dir(folder: str | None = None) -> str | None:
    """The folder to put on the trainer's path for the kit beside the launcher; None without one."""
    found = os.path.join(launcher_dir() if folder is None else folder, KIT_DIR_NAME)
    return found if os.path.isfile(os.path.join(found, KIT_PACKAGE, "__init__.py")) else None


def with_kit(env: dict[str, str], kit: str | None) -> dict[str, str]:
    """``env`` with the kit's folder after the trainer's own PYTHONPATH entries (a copy the user put
    first wins; site-packages comes after PYTHONPATH, so this one wins over an installed one)."""
    if kit is None:
        return env
    current = env.get("PYTHONPATH", "")
    parts = [part for part in current.split(os.pathsep) if part]
    if kit not in parts:
        parts.append(kit)
    return {**env, "PYTHONPATH": os.pathsep.join(parts)}
