"""The soft stop: this process's own view of it, and the step every rank agrees to stop at.

The ranks agree through one collective (an elementwise MAX of two integers) every ``every`` calls
of ``should_stop``, never per call: ``every`` itself comes out of the collective (the smallest
proposal of any rank), so every rank counts to the same call and none is left alone in it. A rank
proposes as many calls as fit in ``check_s`` at its recent pace, from 1 to ``MAX_EVERY``.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

# An elementwise MAX of the values over every rank (a collective), or None when this process is alone.
ReduceMax = Callable[[list[int]], "list[int] | None"]
Clock = Callable[[], float]

# Calls between two agreements at most: a step time that grows after the pace was taken cannot
# delay the stop by more than this many steps.
MAX_EVERY = 1000
DEFAULT_CHECK_S = 1.0


class SoftStop:
    """``stop_file`` appearing or ``signum`` arriving asks for the stop; ``should_stop`` says when
    every rank stops."""

    def __init__(
        self,
        *,
        stop_file: str | None,
        signum: int | None,
        clock: Clock,
        check_s: float = DEFAULT_CHECK_S,
        reduce_max: ReduceMax | None = None,
    ) -> None:
        if not (math.isfinite(check_s) and check_s >= 0):
            raise ValueError(f"stop_check_s must be a finite number of seconds >= 0, got {check_s!r}")
        self._file = stop_file
        self._signum = signum
        self._clock = clock
        self._check_s = check_s
        self._reduce_max = reduce_max
        self._asked = threading.Event()
        self._agreed = False
        self._every = 1
        self._calls = 0
        self._last_check: float | None = None

    @property
    def requested(self) -> bool:
        """This process's own view, without a collective: the signal came or the file is there."""
        if self._asked.is_set():
            return True
        return self._file is not None and os.path.lexists(self._file)

    @property
    def agreed(self) -> bool:
        return self._agreed

    def ask(self) -> None:
        """The stop asked for from inside this process (the signal, a framework's own stop signal)."""
        self._asked.set()

    def agree_with(self, reduce_max: ReduceMax) -> None:
        self._reduce_max = reduce_max

    def should_stop(self) -> bool:
        """True from the agreed call on, the same call on every rank; between agreements a count."""
        if self._agreed:
            return True
        self._calls += 1
        if self._calls < self._every:
            return False
        now = self._clock()
        proposal = self._proposal(now)
        self._calls, self._last_check = 0, now
        local = self.requested
        values = [int(local), -proposal]
        agreed = (self._reduce_max or torch_max)(values)
        if agreed is None:  # alone: the own view, every call (a file check costs no collective)
            self._agreed, self._every = local, 1
        else:
            self._agreed, self._every = agreed[0] > 0, max(1, min(MAX_EVERY, -agreed[1]))
        if self._agreed:
            self.ignore_late_copies()
        return self._agreed

    def _proposal(self, now: float) -> int:
        """Calls that fit in check_s at this rank's pace since the last agreement (1 before a pace)."""
        if self._last_check is None or self._calls == 0:
            return 1
        per_call = (now - self._last_check) / self._calls
        if per_call <= 0:
            return MAX_EVERY
        return max(1, min(MAX_EVERY, math.ceil(self._check_s / per_call)))

    # -- signals -------------------------------------------------------------------------------

    def install_handler(self) -> None:
        """The soft-stop signal sets the flag; a handler installed before still runs."""
        if self._signum is None or threading.current_thread() is not threading.main_thread():
            return  # the file still works; signals can only be handled in the main thread
        previous = signal.getsignal(self._signum)

        def on_soft_stop(signum: int, frame: Any) -> None:
            self._asked.set()
            if callable(previous):
                previous(signum, frame)

        signal.signal(self._signum, on_soft_stop)

    def ignore_late_copies(self) -> None:
        """Acted on: a second copy (mpirun forwards it too) must not kill the process, including while
        the interpreter exits and Python restores the default actions."""
        if self._signum is not None and threading.current_thread() is threading.main_thread():
            with contextlib.suppress(ValueError, OSError):
                signal.signal(self._signum, signal.SIG_IGN)


def signal_number(name: str) -> int | None:
    number = getattr(signal, name.upper(), None) if name.upper().startswith("SIG") else None
    return number if isinstance(number, int) and not isinstance(number, bool) else None


def torch_max(values: list[int]) -> list[int] | None:
    """The elementwise MAX over every rank of torch.distributed's default group, when it is imported
    and initialised with more than one rank; None otherwise. One host sync (reading the result),
    which the agreement's schedule keeps to about once per ``check_s``."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    torch = sys.modules["torch"]
    # A mixed backend ("cuda:nccl,cpu:gloo", torchtitan's) takes a CPU tensor; NCCL alone a GPU one.
    backend = str(dist.get_backend())
    device = "cpu"
    if "nccl" in backend and "cpu:" not in backend:
        device = f"cuda:{torch.cuda.current_device()}"
    tensor = torch.tensor(values, dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return [int(value) for value in tensor.tolist()]
