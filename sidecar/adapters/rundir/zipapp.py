"""The launcher as one file: the ``sidecar.launcher`` package packed into a reproducible zipapp
(sorted entries, fixed timestamps, no compression), which any Python of the trainer image runs as
``python3 soak-launcher.py ...``. ``install-launcher`` writes it for the chart's init container;
local mode runs the same bytes from a cache keyed by their digest."""

from __future__ import annotations

import functools
import hashlib
import io
import os
import shutil
import sys
import zipfile
from pathlib import Path

import soak_sidecar_kit
from sidecar.adapters.fsutil import write_atomic
from sidecar.core.errors import ConfigError
from sidecar.launcher.protocol import names
from sidecar.launcher.protocol.names import STACK_READER as PY_SPY

# The package's name inside the archive: its modules import each other relatively, so any name works.
ARCHIVE_PACKAGE = "soak_launcher"
_SHEBANG = b"#!/usr/bin/env python3\n"
_ROOT_MAIN = f'import runpy\nrunpy.run_module("{ARCHIVE_PACKAGE}", run_name="__main__", alter_sys=True)\n'
_FIXED_TIME = (1980, 1, 1, 0, 0, 0)  # the earliest a zip entry can hold


def _package_dir() -> Path:
    return Path(names.__file__).resolve().parents[1]


def launcher_archive() -> bytes:
    """The zipapp's bytes: the same for the same sources, whoever builds them and when."""
    root = _package_dir()
    sources = sorted(path for path in root.rglob("*.py") if "__pycache__" not in path.parts)
    entries = [("__main__.py", _ROOT_MAIN.encode())]
    entries += [
        (f"{ARCHIVE_PACKAGE}/{path.relative_to(root).as_posix()}", path.read_bytes()) for path in sources
    ]
    buffer = io.BytesIO()
    buffer.write(_SHEBANG)
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, data in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def kit_sources() -> list[tuple[str, bytes]]:
    """The trainer kit's modules (soak_sidecar_kit/*.py), as paths under the kit folder and bytes."""
    root = Path(soak_sidecar_kit.__file__).resolve().parent
    return [(f"{names.KIT_PACKAGE}/{path.name}", path.read_bytes()) for path in sorted(root.glob("*.py"))]


def build_launcher(dest_dir: Path) -> Path:
    """Write the launcher into dest_dir as LAUNCHER_FILE_NAME (executable), and the trainer kit beside
    it (KIT_DIR_NAME/soak_sidecar_kit/), where the launcher puts it on the trainer's path; ConfigError
    if it cannot."""
    target = dest_dir / names.LAUNCHER_FILE_NAME
    kit = dest_dir / names.KIT_DIR_NAME
    try:
        dest_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(target, launcher_archive())
        target.chmod(0o755)
        (kit / names.KIT_PACKAGE).mkdir(parents=True, exist_ok=True)
        for name, data in kit_sources():
            write_atomic(kit / name, data)
    except OSError as exc:
        raise ConfigError(f"cannot write the launcher into {dest_dir}: {exc}") from exc
    return target


def install_stack_reader(dest_dir: Path) -> Path | None:
    """py-spy (a static binary this package depends on) beside the launcher, where the launcher looks
    first for a stall's stacks; None when this environment has none to copy."""
    found = shutil.which(PY_SPY, path=os.pathsep.join([str(Path(sys.executable).parent), os.defpath]))
    found = found or shutil.which(PY_SPY)
    if found is None:
        return None
    target = dest_dir / PY_SPY
    try:
        write_atomic(target, Path(found).read_bytes())
        target.chmod(0o755)
    except OSError as exc:
        raise ConfigError(f"cannot write {PY_SPY} into {dest_dir}: {exc}") from exc
    return target


@functools.cache
def launcher_path() -> Path:
    """The built launcher in this user's cache (built once per source digest): what local mode runs."""
    data, kit = launcher_archive(), kit_sources()
    digest = hashlib.sha256(data)
    for name, source in kit:
        digest.update(name.encode() + b"\0" + hashlib.sha256(source).digest())
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    folder = cache / "soak-sidecar" / "launcher" / digest.hexdigest()[:16]
    target = folder / names.LAUNCHER_FILE_NAME
    try:
        if (
            target.is_file()
            and not target.is_symlink()
            and target.read_bytes() == data
            and all((folder / names.KIT_DIR_NAME / name).read_bytes() == source for name, source in kit)
        ):
            return target
    except OSError:
        pass  # rebuild below
    return build_launcher(folder)
