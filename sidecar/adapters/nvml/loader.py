"""Opening the GPU backend the settings ask for, and the mock-library loader for backend ``mock``.

The mock library and its compiled scenario are handed in by the caller that wires the adapters
(``MockNvml``): building them is the mock package's business, not the adapter's.
"""

from __future__ import annotations

import ctypes
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import pynvml

from sidecar.adapters.nvml.sampler import NullGpuBackend, NvmlGpuBackend
from sidecar.core.errors import ConfigError, GpuUnavailableError
from sidecar.core.gpu_select import DeviceSelection, select_devices
from sidecar.core.ports import GpuBackend
from sidecar.settings import GpuSettings


@dataclass(frozen=True)
class MockNvml:
    """Backend ``mock``'s inputs: the mock libnvidia-ml.so.1 and the compiled scenario it reads."""

    library: Path
    scenario: Path


# Prepares the mock for one opening, writing the compiled scenario into the scratch directory.
MockPreparer = Callable[[Path], MockNvml]


def load_mock_library(library: Path) -> ctypes.CDLL:
    """Load the mock libnvidia-ml.so.1 so that pynvml's dlopen("libnvidia-ml.so.1") finds it.

    The mock's soname is libnvidia-ml.so.1 and the dynamic loader matches a bare dlopen name against
    the sonames of objects already loaded, so preloading it by path is enough; LD_LIBRARY_PATH is
    only read at process start. Refuses when a real NVML is already loaded in this process.
    """
    if not library.is_file():
        raise ConfigError(f"NVML mock library not found: {library}")
    loaded = pynvml.nvmlLib
    if loaded is not None:
        # NVML is loaded once per process; an earlier mock (of any directory) is reused.
        if not hasattr(loaded, "soak_nvml_mock_version"):
            raise ConfigError(
                "a real NVML library is already loaded in this process; the mock cannot replace it"
            )
        return loaded  # type: ignore[no-any-return]
    try:
        return ctypes.CDLL(str(library.resolve()))
    except OSError as exc:
        raise ConfigError(f"cannot load the NVML mock library {library}: {exc}") from exc


def _open_mock(
    prepare: MockPreparer, selection: DeviceSelection, process_interval_s: float
) -> NvmlGpuBackend:
    with tempfile.TemporaryDirectory(prefix="soak-nvml-mock-") as scratch:
        mock = prepare(Path(scratch))
        library = load_mock_library(mock.library)
        # The mock reads its scenario at the first nvmlInit only; the override is dropped after it.
        library.soak_nvml_mock_set_scenario(str(mock.scenario).encode())
        try:
            return NvmlGpuBackend.open(selection, process_interval_s)
        finally:
            library.soak_nvml_mock_set_scenario(None)


def open_gpu_backend(
    settings: GpuSettings,
    trainer_env: Mapping[str, str] | None,
    *,
    mock: MockPreparer | None = None,
) -> GpuBackend:
    """The GPU backend the settings ask for, or a NullGpuBackend saying why there is no GPU data.

    ``trainer_env`` is the trainer's environment (None when unreadable); ``mock`` is called only
    when backend ``mock`` opens GPUs. Raises GpuUnavailableError when ``settings.require`` is set
    and no GPU data can be had; ConfigError for a broken or missing mock.
    """
    if settings.backend == "none":
        return NullGpuBackend("GPU sampling is off (gpu.backend=none)")
    selection = select_devices(settings.devices, trainer_env)
    if selection.mode == "none":
        reason = f"the trainer has no GPUs ({selection.source})"
        if settings.require:
            raise GpuUnavailableError(reason)
        return NullGpuBackend(reason)
    try:
        if settings.backend == "mock":
            if mock is None:
                raise ConfigError("gpu.backend=mock, but no mock NVML library was provided")
            return _open_mock(mock, selection, settings.process_interval_s)
        return NvmlGpuBackend.open(selection, settings.process_interval_s)
    except GpuUnavailableError as exc:
        if settings.require:
            raise
        return NullGpuBackend(str(exc))
