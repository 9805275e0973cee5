"""GPU sampling through NVML (pynvml): the backend the settings ask for (``loader``), the NVML and
null backends (``sampler``), one GPU's readings (``device``), XID/ECC events on a thread of their
own (``events``), and how NVML's errors are read (``errors``).

Every pynvml error stops here: a missing library or driver becomes "no GPU data" with the reason
(``GpuUnavailableError`` only when ``gpu.require`` is set), NOT_SUPPORTED/FUNCTION_NOT_FOUND make a
metric unavailable for good, GPU_IS_LOST/RESET_REQUIRED set the device's fault, and any other error
is recorded against the metric for that sample only.
"""

from sidecar.adapters.nvml.loader import MockNvml, load_mock_library, open_gpu_backend
from sidecar.adapters.nvml.sampler import NullGpuBackend, NvmlGpuBackend

__all__ = [
    "MockNvml",
    "NullGpuBackend",
    "NvmlGpuBackend",
    "load_mock_library",
    "open_gpu_backend",
]
