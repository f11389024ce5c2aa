"""How long compiles took, per kernel, kept beside the compile cache: the plan's time estimate.

A request that must compile has, by definition, no cache entry, so its own time is unknown; the
best guess is the mean of the same kernel's other keys, else of its runtime's. The file is one
small JSON object (`<cache>/compile-times.json`: kernel id -> [runtime, compiles, total seconds]),
replaced atomically after each build; a missing or unreadable file means no estimate, never an error.
"""

from __future__ import annotations

import json
import os
from typing import Any

from nojit.aot.bundle_writer import atomic_file

FILE = "compile-times.json"


class CompileTimes:
    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, FILE)
        try:
            with open(self.path) as f:
                raw = json.load(f)
            self.kernels: dict[str, list[Any]] = {k: v for k, v in raw.items() if isinstance(v, list) and len(v) == 3}
        except (OSError, ValueError, AttributeError):
            self.kernels = {}

    def record(self, kernel: str, runtime: str, seconds: float) -> None:
        _rt, n, total = self.kernels.get(kernel, [runtime, 0, 0.0])
        self.kernels[kernel] = [runtime, n + 1, total + seconds]

    def guess(self, kernel: str, runtime: str) -> float | None:
        """Seconds one compile of `kernel` should take: its own mean, else its runtime's; None: never seen."""
        own = self.kernels.get(kernel)
        if own and own[1]:
            return own[2] / own[1]
        same = [v for v in self.kernels.values() if v[0] == runtime and v[1]]
        return sum(v[2] for v in same) / sum(v[1] for v in same) if same else None

    def save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        with atomic_file(self.path) as f:
            f.write(json.dumps(self.kernels, sort_keys=True).encode())
