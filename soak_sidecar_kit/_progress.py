"""Progress records (``contract``: progress.jsonl): at most one line per interval, a phase change at
once, every line with the run's declared total so that the sidecar's estimate never loses it."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from soak_sidecar_kit import contract
from soak_sidecar_kit._files import ProgressDir


class ProgressLog:
    """The newest figures of this process, and the lines written of them (local rank 0 only)."""

    def __init__(
        self,
        files: ProgressDir | None,
        *,
        interval_s: float,
        total_steps: int | None,
        clock: Callable[[], float],
    ) -> None:
        self._files = files
        self._interval_s = interval_s
        self._clock = clock
        self.total_steps = total_steps
        self.phase = contract.TRAIN
        self.step: int | None = None
        # The summary's figures: steps, samples, tokens, last_loss.
        self.figures: dict[str, Any] = {}
        self._last_line: float | None = None

    def due(self) -> bool:
        """Whether a line would be written now: a costly figure (a loss on the GPU) need only be
        taken then."""
        return self._files is not None and (
            self._last_line is None or self._clock() - self._last_line >= self._interval_s
        )

    def record(
        self,
        step: int,
        *,
        samples: float | None = None,
        tokens: float | None = None,
        loss: float | None = None,
        phase: str = contract.TRAIN,
        force: bool = False,
    ) -> None:
        if phase not in contract.PHASES:
            raise ValueError(
                f"soak_sidecar_kit: phase must be one of {', '.join(contract.PHASES)}, got {phase!r}"
            )
        if not 0 <= int(step) <= contract.MAX_COUNT:
            raise ValueError(f"soak_sidecar_kit: a step must be an integer from 0 to 2**53, got {step!r}")
        self.step = int(step)
        self.figures["steps"] = self.step
        counts = {"samples": samples, "tokens": tokens}
        for name, value in counts.items():
            if value is not None:
                self.figures[name] = count(value)
        if loss is not None:
            self.figures["last_loss"] = finite(loss)
        changed, self.phase = phase != self.phase, phase
        if not (force or changed or self.due()):
            return
        line: dict[str, Any] = {"step": self.step, "phase": phase}
        line.update((name, count(value)) for name, value in counts.items() if value is not None)
        if loss is not None:
            line["loss"] = finite(loss)
            if line["loss"] is None:
                line["loss_nonfinite"] = True
        self._write(line)

    def saved(self, step: int) -> None:
        """A checkpoint landed: a line at once, in the phase the trainer is in (the save's own phase
        ended with it). Its step is the trainer's newest, never less: an asynchronous save that
        lands steps later must not read as the step count going back."""
        newest = int(step) if self.step is None else max(self.step, int(step))
        self._write({"step": newest, "phase": self.phase, "saved": True})

    def _write(self, line: dict[str, Any]) -> None:
        if self._files is None:
            return
        now = self._clock()
        self._last_line = now
        if self.total_steps:
            line["total_steps"] = int(self.total_steps)
        self._files.append_record({"t": round(now, 3), **line})


def finite(value: float) -> float | None:
    """A JSON number the sidecar takes, or None for what is not one (NaN, inf, text)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        return None
    if not math.isfinite(number):
        return None
    return int(number) if number.is_integer() and abs(number) < contract.MAX_COUNT else number


def count(value: float) -> float | None:
    """A cumulative count the sidecar takes (0 to 2**53), or None: a record with a wrong one would be
    refused whole."""
    number = finite(value)
    return number if number is not None and 0 <= number <= contract.MAX_COUNT else None
