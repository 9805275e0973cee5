"""After the trainer: nothing it started may outlive the launcher."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable

from .deadline import MonotonicDeadline
from .output import log
from .proc import alive_descendants, command_of
from .protocol.names import DEFAULT_EXIT_GRACE_S, DEFAULT_KILL_GRACE_S
from .stopping import Stopper
from .supervise import REAP_LIMIT_S
from .trainer import Trainer


def clean_up(
    stopper: Stopper,
    trainer: Trainer | None,
    deadline: MonotonicDeadline | None,
    wait: Callable[[float | None], list[int]],
    reap: Callable[[], bool],
    *,
    interrupted: Callable[[], str | None] = lambda: None,
) -> None:
    """After the exit grace, TERM survivors, KILL them after kill_grace_s (at once past the deadline
    or when the run was killed), reap everything; what could not be reaped is recorded as unreaped.
    ``interrupted``: why the sidecar wants the grace over (its stop, its loss), or None."""
    state, me = stopper.state, stopper.launcher_pid
    if trainer is not None and trainer.status is not None and not (state.term_sent or state.kill_sent):
        _exit_grace(stopper, deadline, wait, interrupted)
    survivors = alive_descendants(me)
    if survivors and not state.kill_sent:
        _term_survivors(stopper, survivors, deadline, wait)
    if alive_descendants(me):
        stopper.kill_everything(state.survivors_killed)
    end = time.monotonic() + REAP_LIMIT_S
    while not reap() and time.monotonic() < end:
        wait(0.05)
        if alive_descendants(me):
            stopper.kill_everything(state.survivors_killed)
    state.unreaped = alive_descendants(me)
    if trainer is not None:
        _drain_output(trainer, wait)


def _exit_grace(
    stopper: Stopper,
    deadline: MonotonicDeadline | None,
    wait: Callable[[float | None], list[int]],
    interrupted: Callable[[], str | None],
) -> None:
    """The trainer exited on its own: its descendants get exit_grace_s to exit by themselves (a rank
    still exiting when rank 0 ends is no survivor), reaped as they do. Never past the deadline's
    TERM (term_grace_s before it): what outlives the trainer is then TERMed as a survivor, a leak,
    not killed at the deadline as if the deadline had ended the run. A stop signal from outside, the
    sidecar's stop request, or its loss (heartbeat, owner) ends the grace."""
    go = stopper.go
    grace = go.exit_grace_s if go else DEFAULT_EXIT_GRACE_S
    if deadline is not None:
        term_at = go.term_grace_s if go else 0.0
        grace = min(grace, max(0.0, deadline.remaining() - term_at))
    end = time.monotonic() + grace
    while alive_descendants(stopper.launcher_pid):
        left = end - time.monotonic()
        if left <= 0:
            return
        # SIGCHLD wakes us for our own children; a grandchild's exit only shows at the next look.
        if wait(min(left, 0.05)):
            return
        why = interrupted()
        if why is not None:
            log(f"exit grace cut short: {why}")
            return


def _term_survivors(
    stopper: Stopper,
    survivors: list[int],
    deadline: MonotonicDeadline | None,
    wait: Callable[[float | None], list[int]],
) -> None:
    """TERM what outlived the trainer and wait kill_grace_s, never past the deadline, for it."""
    state = stopper.state
    grace = stopper.go.kill_grace_s if stopper.go else DEFAULT_KILL_GRACE_S
    for pid in survivors:
        state.survivors_killed[pid] = command_of(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    stopper.signal_group(signal.SIGTERM)
    end = time.monotonic() + grace
    while survivors:
        left = end - time.monotonic()
        if deadline is not None and deadline.remaining() <= 0:
            state.deadline_expired = True
            break
        if left <= 0:
            break
        if deadline is not None:
            left = min(left, max(0.0, deadline.remaining()))
        # SIGCHLD wakes us: adopted survivors are our children, others die with them.
        wait(min(left, 0.05))
        survivors = alive_descendants(stopper.launcher_pid)
        for pid in survivors:
            if pid not in state.survivors_killed:
                state.survivors_killed[pid] = command_of(pid)


def _drain_output(trainer: Trainer, wait: Callable[[float | None], list[int]]) -> None:
    end = time.monotonic() + 1.0
    while trainer.output_open and time.monotonic() < end:
        trainer.on_output()
        if trainer.output_open:
            wait(0.05)
