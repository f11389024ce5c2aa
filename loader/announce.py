"""What nojit prints about itself in a process: one line per process, and strict mode's unserved-JIT block.

vLLM starts its engine core and workers with fork by default; a forked process inherits the
installation without running the plugin again, so the registry warmup (which every worker runs)
announces too, once per process.
"""

from __future__ import annotations

import os
import sys

from nojit.loader.runtimes import in_manifest_order
from nojit.loader.settings import Mode, settings

_announced_pid: int | None = None


def announce(inst: object) -> None:
    """Print the summary line (and in strict mode the unserved-JIT block) once in this process."""
    global _announced_pid
    if settings.quiet or _announced_pid == os.getpid():
        return
    _announced_pid = os.getpid()
    print(summary_line(inst), file=sys.stderr, flush=True)
    if getattr(inst, "mode", None) is Mode.STRICT:
        from nojit.loader.unserved import report

        served = frozenset(k.runtime for k in inst.bundle.index.kernels.values())  # type: ignore[attr-defined]
        print("\n".join(report(served)), file=sys.stderr, flush=True)


def summary_line(inst: object) -> str:
    """One line: which process, which bundle and versions, how many kernels, mode, firewall."""
    from nojit.loader.install import Installation

    assert isinstance(inst, Installation)
    m = inst.bundle.index
    p = m.producer
    versions = ", ".join(f"{name} {v}" for name, v in (("vLLM", p.vllm), ("Triton", p.triton), ("TileLang", p.tilelang))
                         if v)
    runtimes = [k.runtime for k in m.kernels.values()]
    counts = " + ".join(f"{runtimes.count(r.name)} {r.display}" for r in in_manifest_order() if r.name in runtimes)
    kernels = f"{counts or 'no'} kernels, {m.entry_count} entries"
    notes = [n for n in (getattr(h.state, "startup_note", lambda: "")() for h in inst.handles.values()) if n]
    if notes:
        kernels += " (" + "; ".join(notes) + ")"
    return (f"nojit[pid {os.getpid()}]: {inst.bundle.path} ({versions}; {m.target.arch}): {kernels}; "
            f"mode {inst.mode.value}; firewall {firewall_state(inst)}")


def firewall_state(inst: object) -> str:
    """The compiler firewall's state as one phrase (nojit.loader.strict.firewall, when present)."""
    if getattr(inst, "mode", None) is not Mode.STRICT:
        return "off (not strict)"
    try:
        from nojit.loader.strict import firewall  # type: ignore[attr-defined]
    except ImportError:
        return "in-process guards only"
    report = firewall.active() if hasattr(firewall, "active") else None
    if report is None:
        return "not active"
    from nojit.loader.strict import exec_guard
    from nojit.loader.strict import inprocess_guard
    from nojit.loader.strict import landlock

    parts = [r.summary() for r in (landlock.report(), exec_guard.report(), inprocess_guard.report()) if r is not None]
    return (f"on ({len(report.names)} stand-ins in {report.bin_dir}, versions from {report.versions_from})"
            + "".join(f"; {p}" for p in parts))
