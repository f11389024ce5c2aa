"""A dependency-free progress bar for long builds: redraws in place on a terminal, logs lines otherwise."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, label: str, enabled: bool = True) -> None:
        self.total = total
        self.label = label
        self.enabled = enabled and total > 0
        self.count = 0
        self.start = time.perf_counter()
        self._tty = sys.stderr.isatty()
        self._last = 0.0

    def step(self, what: str = "") -> None:
        self.count += 1
        if not self.enabled:
            return
        now = time.perf_counter()
        elapsed = now - self.start
        width = 30
        filled = int(width * self.count / self.total)
        line = f"{self.label} [{'#' * filled}{'.' * (width - filled)}] {self.count}/{self.total} {elapsed:6.1f}s {what[:40]}"
        if self._tty:
            sys.stderr.write("\r" + line.ljust(110))
            sys.stderr.flush()
        elif now - self._last > 5 or self.count == self.total:
            self._last = now
            sys.stderr.write(line + "\n")

    def done(self) -> None:
        if self.enabled and self._tty:
            sys.stderr.write("\n")
