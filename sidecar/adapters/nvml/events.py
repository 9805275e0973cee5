"""XID and ECC events through NVML's event API, on a thread of their own.

The thread waits in ``nvmlEventSetWait_v2`` (ctypes releases the GIL for the call, and the wait is
bounded by ``WAIT_MS`` so closing never waits long); events queue up until the next sample drains
them, which takes a lock for a list swap only, so events never delay a sample. A driver without the
event API, or devices that support none of these events, leave ``unavailable`` saying why.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import time
from collections.abc import Sequence
from typing import Any, Literal

import pynvml

from sidecar.adapters.nvml.errors import describe
from sidecar.core.samples import GpuEvent

WAIT_MS = 200
_KINDS: dict[int, Literal["xid", "ecc_single_bit", "ecc_double_bit"]] = {
    pynvml.nvmlEventTypeXidCriticalError: "xid",
    pynvml.nvmlEventTypeSingleBitEccError: "ecc_single_bit",
    pynvml.nvmlEventTypeDoubleBitEccError: "ecc_double_bit",
}
_WANTED = sum(_KINDS)
_ABSENT = frozenset({pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})


def _address(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


class EventWatcher:
    """Watches the given devices (index, uuid, handle) until :meth:`close`."""

    def __init__(self, devices: Sequence[tuple[int, str, Any]]) -> None:
        self._by_address = {_address(handle): (index, uuid) for index, uuid, handle in devices}
        self._lock = threading.Lock()
        self._queue: list[GpuEvent] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._set: Any = None
        self.unavailable: str | None = None
        self._start(devices)

    def _start(self, devices: Sequence[tuple[int, str, Any]]) -> None:
        try:
            self._set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            self.unavailable = f"NVML events unavailable: {describe(exc)}"
            return
        problems = []
        registered = 0
        for index, _uuid, handle in devices:
            try:
                types = pynvml.nvmlDeviceGetSupportedEventTypes(handle) & _WANTED
                if types:
                    pynvml.nvmlDeviceRegisterEvents(handle, types, self._set)
                    registered += 1
                else:
                    problems.append(f"GPU {index}: no XID or ECC events")
            except pynvml.NVMLError as exc:
                if exc.value not in _ABSENT:
                    problems.append(f"GPU {index}: {describe(exc)}")
                else:
                    problems.append(f"GPU {index}: events not supported")
        if not registered:
            self.unavailable = "NVML events unavailable: " + ("; ".join(problems) or "no GPUs")
            self._free()
            return
        if problems:
            self.unavailable = "NVML events partly unavailable: " + "; ".join(problems)
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = pynvml.nvmlEventSetWait_v2(self._set, WAIT_MS)
            except pynvml.NVMLError as exc:
                if exc.value != pynvml.NVML_ERROR_TIMEOUT:
                    # A lost GPU or a driver problem (the samples find the device's fault):
                    # no busy loop while it lasts.
                    self._stop.wait(WAIT_MS / 1000.0)
                continue
            self._received(data)

    def _received(self, data: Any) -> None:
        kind = _KINDS.get(int(data.eventType))
        device = self._by_address.get(_address(data.device))
        if kind is None or device is None:
            return
        event = GpuEvent(
            t_wall=time.time(),
            device_index=device[0],
            device_uuid=device[1],
            kind=kind,
            data=int(data.eventData),
        )
        with self._lock:
            self._queue.append(event)

    def drain(self) -> list[GpuEvent]:
        """Events since the last drain, oldest first."""
        with self._lock:
            events, self._queue = self._queue, []
        return events

    def close(self) -> None:
        """Stops the thread (within one wait) and frees the event set; before nvmlShutdown."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=WAIT_MS / 1000.0 * 5)
        self._free()

    def _free(self) -> None:
        if self._set is None or (self._thread is not None and self._thread.is_alive()):
            return
        with contextlib.suppress(pynvml.NVMLError):  # the set goes with nvmlShutdown anyway
            pynvml.nvmlEventSetFree(self._set)
        self._set = None
