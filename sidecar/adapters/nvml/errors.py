"""How the adapter reads NVML's errors: which mean a metric is unsupported for good, which mean the
GPU itself failed, and how one is described in a reason."""

from __future__ import annotations

import pynvml

MIB = 1024.0 * 1024.0
UNSUPPORTED = frozenset(
    {
        pynvml.NVML_ERROR_NOT_SUPPORTED,
        pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
        pynvml.NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
    }
)
FAULTS = {
    pynvml.NVML_ERROR_GPU_IS_LOST: "GPU is lost",
    pynvml.NVML_ERROR_RESET_REQUIRED: "GPU requires a reset",
}


def describe(exc: pynvml.NVMLError) -> str:
    return f"{exc} (NVML error {exc.value})"
