"""A quiet build: everything the libraries print goes to a log file; the terminal keeps nojit's own lines.

vLLM, torch, TileLang and the compile workers write to the process's file descriptors 1 and 2
(C++ warnings, `print`, loggers set up at import), not only through Python's `logging`, so the
redirect is at the descriptor level: while it is active, fds 1 and 2 are the log file, and the
compile workers, spawned then, inherit it. nojit's plan line, progress bar and summary go to
copies of the original descriptors (`Terminal`). `nojit build --verbose` skips all of this.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class Terminal:
    """Where nojit's own build lines go: the terminal (or whatever stdout/stderr were) and the log's path."""

    out: TextIO
    err: TextIO
    log_path: str | None = None


def default_log_path(output: str) -> str:
    """`out/x.nojit` -> `out/x.build.log`, next to the bundle it explains."""
    stem = output[: -len(".nojit")] if output.endswith(".nojit") else output
    return f"{stem}.build.log"


@contextlib.contextmanager
def quiet(log_path: str | None) -> Iterator[Terminal]:
    """Send fds 1 and 2 to `log_path` (truncated) for the block; None: change nothing (verbose)."""
    if log_path is None:
        yield Terminal(sys.stdout, sys.stderr)
        return
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = (os.dup(1), os.dup(2))
    out = os.fdopen(os.dup(saved[0]), "w", buffering=1)
    err = os.fdopen(os.dup(saved[1]), "w", buffering=1)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    try:
        yield Terminal(out, err, log_path)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
        out.close()
        err.close()
