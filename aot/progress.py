"""A dependency-free progress bar for long builds: redraws in place on a terminal, logs lines otherwise.

Each line has the count, the time so far, an ETA (the remaining compiles at the mean pace so far)
and the item that finished last."""

from __future__ import annotations

import sys
import time
from typing import TextIO


def clock(seconds: float) -> str:
    """75 -> "1m15s", 3 -> "3s"."""
    seconds = int(round(seconds))
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Progress:
    def __init__(self, total: int, label: str, enabled: bool = True, stream: TextIO | None = None) -> None:
        self.total = total
        self.label = label
        self.enabled = enabled and total > 0
        self.count = 0
        self.start = time.perf_counter()
        self.stream = stream or sys.stderr
        self._tty = self.stream.isatty()
        self._last = 0.0

    def line(self, what: str, now: float) -> str:
        elapsed = now - self.start
        width = 30
        filled = int(width * self.count / self.total)
        eta = elapsed / self.count * (self.total - self.count) if self.count else 0.0
        return (f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.count}/{self.total} "
                f"{clock(elapsed)} ETA {clock(eta)} {what[:40]}")

    def step(self, what: str = "") -> None:
        self.count += 1
        if not self.enabled:
            return
        now = time.perf_counter()
        line = self.line(what, now)
        if self._tty:
            self.stream.write("\r" + line.ljust(110))
            self.stream.flush()
        elif now - self._last > 5 or self.count == self.total:
            self._last = now
            self.stream.write(line + "\n")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled and self._tty:
            self.stream.write("\n")
            self.stream.flush()
