"""The serving policy: what happens when a kernel asks for a key, in one place.

Exact entry -> serve it. Otherwise the generic (universal) entry for the key's constexpr
and dtype combination -> serve it and count it. Otherwise the mode decides: strict raises
KernelNotInBundleError naming the kernel, the key and how to add it; permissive warns once
per key and lets the JIT compile; record does what permissive does. In record mode every
distinct (kernel, key, outcome) the process requested is appended to a JSONL file that
`nojit build --add-keys` merges into the next build.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from nojit.loader.errors import KernelNotInBundleError
from nojit.loader.private_dir import append_line, open_append
from nojit.loader.settings import Mode

log = logging.getLogger("nojit")

class KeyRecorder:
    """Appends one JSON line per distinct (kernel, key, outcome), safe across threads and ranks. The file
    (NOJIT_RECORD_FILE, default <bundle>.keys.jsonl) is refused at install unless it is, or can be created
    as, a regular file of this user whose folder nobody else can change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._seen: set[tuple[str, str, str]] = set()
        self._lock = threading.Lock()
        os.close(open_append(path, 0o644))  # refused now, at install, unless a regular file of this user

    def record(self, kernel: str, runtime: str, key_json: Any, outcome: str, source_hash: str) -> None:
        text = json.dumps(key_json, sort_keys=True, separators=(",", ":"))
        ident = (kernel, text, outcome)
        if ident in self._seen:
            return
        with self._lock:
            if ident in self._seen:
                return
            self._seen.add(ident)
            line = json.dumps(
                {"kernel": kernel, "runtime": runtime, "key": key_json, "outcome": outcome, "source_hash": source_hash},
                sort_keys=True,
                separators=(",", ":"),
            )
            # One write(2) per line on an O_APPEND descriptor: lines from several
            # processes (one per tensor-parallel rank) do not interleave.
            # (never through a symlink, only into a regular file of this user: private_dir.open_append)
            append_line(self.path, (line + "\n").encode(), 0o644)


class ServingPolicy:
    """Counts outcomes and applies the mode on a miss."""

    def __init__(self, mode: Mode, bundle_path: str, recorder: KeyRecorder | None = None) -> None:
        self.mode = mode
        self.bundle_path = bundle_path
        self.recorder = recorder
        self.recording = recorder is not None
        self.counts: Counter[tuple[str, str]] = Counter()
        self._warned: set[tuple[str, str]] = set()

    def served(self, kernel: str, runtime: str, key_json: Callable[[], Any], outcome: str, source_hash: str) -> None:
        """Called on hits when recording, and on every generic fallback. key_json is called only when
        recording, so a counted fallback costs no JSON conversion on the launch path."""
        self.counts[(kernel, outcome)] += 1
        if self.recorder is not None:
            self.recorder.record(kernel, runtime, key_json(), outcome, source_hash)

    def miss(self, kernel: str, runtime: str, key_json: Any, key_text: str, source_hash: str, reason: str = "",
             fix: str = "") -> None:
        """No entry serves this key. Raises in strict mode (with `fix`, else how to add the key); otherwise warns
        once and returns."""
        self.counts[(kernel, "miss")] += 1
        if self.recorder is not None:
            self.recorder.record(kernel, runtime, key_json, "miss", source_hash)
        if self.mode is Mode.STRICT:
            why = f" ({reason})" if reason else ""
            raise KernelNotInBundleError(
                kernel,
                key_text + why,
                self.bundle_path,
                fix=fix or "run the workload once with NOJIT_MODE=record (NOJIT_RECORD_FILE=keys.jsonl), then "
                "`nojit build --add-keys keys.jsonl` and deploy the new bundle; "
                "or set NOJIT_MODE=permissive to let the JIT compile missing keys",
            )
        ident = (kernel, key_text)
        if ident not in self._warned:
            self._warned.add(ident)
            log.warning("nojit: %s key %s is not in %s%s; compiling it with the JIT", kernel, key_text, self.bundle_path,
                        f" ({reason})" if reason else "")

    def contain(self, kernel: str, exc: Exception) -> bool:
        """An internal nojit error on a call: in permissive and record modes the call falls back to the JIT
        (True; logged once per kernel); in strict mode it is raised (False)."""
        if self.mode is Mode.STRICT:
            return False
        self.counts[(kernel, "contained")] += 1
        if (kernel, "error") not in self._warned:
            self._warned.add((kernel, "error"))
            log.warning("nojit: %s failed in the loader (%s); this call and later failures go to the JIT", kernel,
                        str(exc).splitlines()[0][:300])
        return True

    def summary(self) -> dict[str, int]:
        out: Counter[str] = Counter()
        for (_, outcome), n in self.counts.items():
            out[outcome] += n
        return dict(out)
