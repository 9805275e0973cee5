"""The tests' one retry primitive: poll a probe until it holds (a handshake), never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable


def wait_until(
    what: str, probe: Callable[[], bool], timeout_s: float = 30.0, interval_s: float = 0.05
) -> None:
    """Poll ``probe`` until it returns true; ``TimeoutError`` naming ``what`` after ``timeout_s``.

    A probe may raise to fail at once (a helper process died, so the condition never comes)."""
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s:g} s")
        time.sleep(interval_s)
