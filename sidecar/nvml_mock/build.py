"""Build the mock libnvidia-ml.so.1 with gcc.

``python -m sidecar.nvml_mock.build OUT_DIR [--scenario S.json]`` prints the library path (and the
compiled scenario path); the Dockerfile and CI use it. Equivalent plain command::

    gcc -shared -fPIC -O2 -Wall -Wextra -std=c11 -Wl,-soname,libnvidia-ml.so.1 \\
        -o OUT_DIR/libnvidia-ml.so.1 sidecar/nvml_mock/nvml_mock.c -lpthread
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from sidecar.core.errors import ConfigError
from sidecar.nvml_mock.scenario import compile_scenario

SOURCE = Path(__file__).with_name("nvml_mock.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
CFLAGS = ("-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-std=c11", f"-Wl,-soname,{LIBRARY_NAME}")


def source_digest() -> str:
    """sha256 of the C source: names a cache directory so an edited source is rebuilt."""
    return hashlib.sha256(SOURCE.read_bytes()).hexdigest()


def build_mock_library(out_dir: Path) -> Path:
    """Compile nvml_mock.c into out_dir/libnvidia-ml.so.1 (replaced atomically)."""
    compiler = os.environ.get("CC") or shutil.which("gcc")
    if compiler is None:
        raise ConfigError(
            "cannot build the NVML mock: gcc not found (install gcc or set gpu.mock_library_dir)"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / LIBRARY_NAME
    # Build beside the target and rename, so a concurrent loader never maps a half-written file.
    fd, tmp = tempfile.mkstemp(prefix=".libnvidia-ml-", suffix=".so", dir=out_dir)
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *CFLAGS, "-o", tmp, str(SOURCE), "-lpthread"],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )
        if result.returncode != 0:
            raise ConfigError(f"building the NVML mock failed ({compiler}): {result.stderr.strip()[-2000:]}")
        # mkstemp made it 0600; a non-root sidecar must be able to map it.
        os.chmod(tmp, 0o755)  # noqa: S103 (a shared library must be readable to be mapped)
        os.replace(tmp, target)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ConfigError(f"building the NVML mock failed: {exc}") from exc
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def cached_mock_library(cache_root: Path) -> Path:
    """The library built once per source version under cache_root (built now if missing)."""
    out_dir = cache_root / source_digest()[:16]
    target = out_dir / LIBRARY_NAME
    if target.is_file():
        return target
    return build_mock_library(out_dir)


def mock_library(library_dir: Path | None) -> Path:
    """The library to load: the one in ``library_dir`` as given, else the user cache's (built now if
    missing)."""
    if library_dir is not None:
        return library_dir / LIBRARY_NAME
    return cached_mock_library(default_cache_root())


def default_cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "soak-sidecar" / "nvml-mock"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m sidecar.nvml_mock.build", description=__doc__.splitlines()[0]
    )
    parser.add_argument("out_dir", type=Path, help="directory to write libnvidia-ml.so.1 into")
    parser.add_argument(
        "--scenario", type=Path, help="also validate and compile this scenario JSON into out_dir"
    )
    args = parser.parse_args(argv)
    try:
        print(build_mock_library(args.out_dir))
        if args.scenario is not None:
            print(compile_scenario(args.scenario, args.out_dir))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 64
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
