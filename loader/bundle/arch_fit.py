"""Whether this GPU is exactly the architecture the bundle's cubins were built for.

The driver loads SASS on any GPU its binary-compatibility rule allows (sm_X0 code on a later
minor of the same major, a family-specific `sm_Xf` cubin on every member of the family), and
such a cubin has produced wrong outputs upstream: tuned for one chip, run on another. So nojit
asks for equality: the GPU's compute capability is the number in the bundle's target arch, and
every arch a runtime recorded (FlashInfer's `cuda_arch`, TileLang's nvcc flags) is the
target's. `versions.check_arch` compares the capability alone; this adds the recorded names.
"""

from __future__ import annotations

import re
from typing import Any

from nojit.loader.bundle.manifest import RUNTIMES

_ARCH = re.compile(r"\bsm_?(\d{2,3})([af]?)\b")


def arch_number(name: str) -> tuple[int, str] | None:
    """"sm_90a" / "sm90a" / "code=sm_90a" -> (90, "a"); None when no arch name is in it."""
    m = _ARCH.search(name)
    return (int(m.group(1)), m.group(2)) if m else None


def recorded_archs(index: Any) -> dict[str, set[str]]:
    """runtime -> the arch names its kernel records give (normalised "sm_90a"; which fields hold them is each
    runtime's provenance)."""
    found: dict[str, set[str]] = {}
    for k in index.kernels.values():
        record = RUNTIMES.get(k.runtime)
        for name in record.provenance.archs(k.info) if record else ():
            parsed = arch_number(name)
            if parsed:
                found.setdefault(k.runtime, set()).add(f"sm_{parsed[0]}{parsed[1]}")
    return found


def arch_problems(index: Any, capability: tuple[int, int] | None) -> list[str]:
    """Each way the bundle's archs differ from each other or from this GPU (capability None: GPU unknown)."""
    target = index.target.arch
    problems = [f"{rt} recorded {', '.join(sorted(names - {target}))}, not the bundle's target {target}"
                for rt, names in sorted(recorded_archs(index).items()) if names - {target}]
    parsed = arch_number(target)
    if parsed is None:
        problems.append(f"the bundle's target arch {target!r} is not an sm_ name")
    elif capability is not None and parsed[0] != capability[0] * 10 + capability[1]:
        problems.append(f"the bundle holds {target} cubins; this GPU is compute capability "
                        f"{capability[0]}.{capability[1]} (sm_{capability[0]}{capability[1]})")
    return problems
