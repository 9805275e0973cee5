"""What the samples show of the trainer's work (pure): its first progress and its checkpoints, each
at the time of the sample that first showed it (the sidecar's clock)."""

from __future__ import annotations

from dataclasses import dataclass

from sidecar.core.ledger.checkpoint import CheckpointReport


@dataclass
class ProgressMoments:
    first_progress_unix: float | None = None
    checkpoint: CheckpointReport | None = None
    checkpoint_seen_unix: float | None = None
    checkpoints_seen: int = 0
    # Why the latest checkpoint record could not be read (it is then not counted).
    checkpoint_problem: str | None = None
    # The record as the attempt found it (an earlier attempt's checkpoint): not this attempt's.
    inherited: CheckpointReport | None = None

    def observe(self, t_wall: float, progress_bytes: int, checkpoint: CheckpointReport | str | None) -> None:
        """One sample: the progress dir's bytes and its checkpoint record (a problem as text)."""
        if progress_bytes > 0 and self.first_progress_unix is None:
            self.first_progress_unix = t_wall
        self.observe_checkpoint(t_wall, checkpoint)

    def observe_checkpoint(self, t_wall: float, checkpoint: CheckpointReport | str | None) -> None:
        """The checkpoint record alone: also read once more when the trainer has exited, so a checkpoint
        written on a soft stop after the last sample counts (seen then: up to one sample interval late)."""
        if isinstance(checkpoint, str):
            self.checkpoint_problem = checkpoint
        elif checkpoint is not None and checkpoint != (self.checkpoint or self.inherited):
            self.checkpoint, self.checkpoint_seen_unix = checkpoint, t_wall
            self.checkpoints_seen += 1
