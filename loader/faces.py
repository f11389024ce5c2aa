"""The face every serving runtime shows the loader, as aot/faces.py is the build side's.

A runtime's room (loader/runtimes/<runtime>/) exports one `Runtime`: how it installs into a process
(returning a `Handle`), how it is named on the startup line, which JITs of the serving process it serves
(the unserved-JIT table) and which libraries strict mode guards for it. loader/runtimes/__init__.py has
one line per runtime; install, announce, unserved and uninstall loop over that registry and name no
runtime. The manifest launch record of each runtime is the format room's (loader/bundle/manifest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.bundle.file import Bundle
from nojit.loader.bundle.manifest import LaunchRecord
from nojit.loader.policy import ServingPolicy


@dataclass(frozen=True)
class Switch:
    """A vLLM setting that keeps the process away from a JIT, and what it costs."""

    setting: str  # environment variable assignment or CLI flag, exactly as the operator types it
    avoids: str
    cost: str
    env: str | None = None  # the variable read to tell whether it is set
    off_value: str | None = None  # the value that switches the JIT off


@dataclass(frozen=True)
class ProcessJit:
    """One compiler the serving process can reach, and the bundle runtime that serves it."""

    name: str
    module: str  # importable module whose presence makes the JIT reachable
    runtime: str  # the bundle runtime whose entries serve it
    used_for: str  # what DeepSeek-V4 on sm_90 uses it for
    switches: tuple[Switch, ...] = ()
    unavoidable: str = ""  # what no switch removes (a bundle without this runtime cannot serve that part)


@dataclass(frozen=True)
class InstallContext:
    """What one runtime's install is given: the open bundle, its kernels of it, and the process's choices."""

    bundle: Bundle
    kernel_ids: list[str]  # this runtime's kernels of the bundle (install(kernels=...) applied)
    policy: ServingPolicy  # mode, recorder, counts
    allow: frozenset[str]  # NOJIT_ALLOW_MISMATCH words
    resolve: Callable[[str], Any]  # kernel id -> live object (installed vLLM modules only)
    differences: list[str]  # the version differences allowed at this install (said once per kernel)


def _nothing() -> None:
    return None


@dataclass
class Handle:
    """What one runtime's install did: its per-kernel servers and its own state, and how to undo it."""

    servers: dict[str, Any] = field(default_factory=dict)  # kernel id -> server with preload(device)
    state: Any = None  # the runtime's own record (DeepGemmServing, FlashInferServing, HummingServing)
    undo: Callable[[], None] = _nothing  # the runtime's own paths back (servers still listed)
    checked_at_first_use: bool = False  # servers have prepare(): source, section and tables at first use

    def prepare(self) -> int:
        """Check and prepare every server now; how many were."""
        if not self.checked_at_first_use:
            return 0
        for server in self.servers.values():
            server.prepare()
        return len(self.servers)

    def preload(self, device: int) -> int:
        """Load every module of this runtime on `device`; how many."""
        return sum(server.preload(device) for server in self.servers.values())

    def uninstall(self) -> None:
        self.undo()
        self.servers.clear()


@dataclass(frozen=True)
class Runtime:
    """A kernel runtime's serving face."""

    name: str  # the manifest's runtime name
    display: str  # its name on the startup line ("Triton")
    install: Callable[[InstallContext], Handle]
    jits: tuple[ProcessJit, ...] = ()  # the serving process's JITs this runtime's entries serve
    guards: tuple[str, ...] = ()  # modules whose compile entry strict mode guards for it (strict/guards.py)
    restore: Callable[[], None] | None = None  # undo what the vLLM integration put on outside install()
    # The manifest's launch record and key checks of a runtime outside the package (registered with it); the
    # package's own runtimes have theirs in the format room's table (loader/bundle/manifest.py RUNTIMES).
    launch: LaunchRecord | None = None
