"""The sidecar's side of the run dir as the launcher watches it: the heartbeat and control.json."""

from __future__ import annotations

import os
import time

from .protocol.fields import ProtocolError
from .protocol.files import read_bytes, read_json
from .protocol.names import CONTROL_FILE, HEARTBEAT_FILE, PROTOCOL
from .protocol.records import ControlRequest

# Re-read of control.json and the heartbeat when inotify misses a change or is unavailable.
FALLBACK_POLL_S = 0.5


class SidecarChannel:
    def __init__(self, run_dir: str, launch_id: str) -> None:
        self.run_dir = run_dir
        self.launch_id = launch_id
        self.heartbeat_changed_at = 0.0  # monotonic
        self.last_poll = 0.0  # monotonic
        self._heartbeat: bytes | None = None
        self._control_seq = -1

    def start_heartbeat_clock(self) -> None:
        """At go: the heartbeat as it is now, and its clock started."""
        self._heartbeat = read_bytes(os.path.join(self.run_dir, HEARTBEAT_FILE))
        self.heartbeat_changed_at = time.monotonic()

    def check_heartbeat(self) -> None:
        """The heartbeat counts when its content changes (never by mtime, which the trainer could set)."""
        content = read_bytes(os.path.join(self.run_dir, HEARTBEAT_FILE))
        if content is not None and content != self._heartbeat:
            self._heartbeat = content
            self.heartbeat_changed_at = time.monotonic()

    def poll(self, now: float, changed: set[str]) -> ControlRequest | None:
        """Heartbeat and control when inotify reports a change, and on the fallback poll: a new
        control request of this launcher, if any."""
        if HEARTBEAT_FILE in changed:
            self.check_heartbeat()
        due = now - self.last_poll >= FALLBACK_POLL_S
        request = self.new_control() if CONTROL_FILE in changed or due else None
        if due:
            self.check_heartbeat()
            self.last_poll = now
        return request

    def new_control(self) -> ControlRequest | None:
        raw = read_json(os.path.join(self.run_dir, CONTROL_FILE))
        if raw is None or raw.get("protocol") != PROTOCOL or raw.get("launch_id") != self.launch_id:
            return None
        try:
            request = ControlRequest.parse(raw)
        except ProtocolError:
            return None
        if request.seq <= self._control_seq:
            return None
        self._control_seq = request.seq
        return request
