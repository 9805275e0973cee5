"""The deadline on the launcher's own clock: the fail-safe when the sidecar is gone."""

from __future__ import annotations

import time
from collections.abc import Callable


class MonotonicDeadline:
    """remaining = min(wall remaining, monotonic remaining).

    The monotonic end is fixed when the launcher learns the deadline, so setting the wall clock
    back cannot extend it; a wall clock jumping forward shortens it (never extends).
    """

    def __init__(
        self,
        deadline_unix: float,
        wall: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.deadline_unix = deadline_unix
        self._wall = wall
        self._monotonic = monotonic
        self.monotonic_end = monotonic() + (deadline_unix - wall())

    def remaining(self) -> float:
        return min(self.deadline_unix - self._wall(), self.monotonic_end - self._monotonic())
