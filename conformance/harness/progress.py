"""Where a rank is in its step, for a watchdog on another thread to report."""

from __future__ import annotations

import threading
import time


class Progress:
    """Where a rank is right now; read by the watchdog from another thread."""

    def __init__(self):
        self._lock = threading.Lock()
        self.case_id: str | None = None
        self.step: str | None = None
        self.collective: str | None = None
        self.since = time.monotonic()

    def enter(self, case_id: str | None = None, step: str | None = None) -> None:
        with self._lock:
            if case_id is not None:
                self.case_id, self.since = case_id, time.monotonic()
            self.step, self.collective = step, None

    def set_collective(self, kind: str | None) -> None:
        with self._lock:
            self.collective = kind

    def where(self) -> str:
        with self._lock:
            place = f"step {self.step}" if self.step else "between steps"
            if self.collective:
                place += f", inside {self.collective} (waiting for peers)"
            return place
