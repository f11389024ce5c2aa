"""The version rule: which producer facts must match the serving process, and the message when not.

A cubin is only right for the Triton that compiled it (its launch ABI and key rules), the
vLLM whose kernel source it came from, and the GPU architecture it was assembled for. The
loader compares each with what the serving process has and refuses the bundle, listing
every difference, unless the operator allowed that fact to differ (NOJIT_ALLOW_MISMATCH).
Versions are read from package metadata, so checking TileLang's never imports it.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
from dataclasses import dataclass

from nojit.loader.errors import BundleMismatchError
from nojit.loader.bundle.manifest import RUNTIMES, Index, Manifest
from nojit.loader.packages import dist_info_dir

from nojit.loader.settings import MISMATCH_FACTS, TOOL_FACTS  # noqa: F401  (the words NOJIT_ALLOW_MISMATCH accepts)

log = logging.getLogger("nojit")


def installed_version(distribution: str) -> str | None:
    """The installed version, cheaply: an imported module's __version__, else the dist-info next to the
    package (one directory listing), else a full metadata search (its first use scans sys.path: ~20 ms)."""
    version = getattr(sys.modules.get(distribution), "__version__", None)
    if isinstance(version, str):
        return version
    info = dist_info_dir(distribution)
    if info is not None and os.path.isfile(os.path.join(info, "METADATA")):
        with open(os.path.join(info, "METADATA"), encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
                if not line.strip():
                    break
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class RuntimeVersions:
    """What the serving process has. None: not installed (or, for capability, not known yet)."""

    vllm: str | None
    triton: str | None
    tilelang: str | None

    @classmethod
    def of_this_process(cls) -> RuntimeVersions:
        return cls(*(installed_version(TOOL_FACTS[fact][0]) for fact in ("vllm", "triton", "tilelang")))


def _runtimes(manifest: Manifest | Index) -> set[str]:
    return {k.runtime for k in manifest.kernels.values()}


def _compared(manifest: Manifest | Index, runtime: RuntimeVersions) -> list[str]:
    """The producer facts of the bundle's runtimes this process must match (each runtime's provenance says which;
    a package that need not be installed to serve is compared only where it is installed)."""
    facts = []
    for rt in sorted(_runtimes(manifest)):
        p = RUNTIMES[rt].provenance if rt in RUNTIMES else None
        if p and p.producer_version and not (p.optional_install and getattr(runtime, p.producer_version) is None):
            facts.append(p.producer_version)
    return facts


def version_differences(manifest: Manifest | Index, runtime: RuntimeVersions) -> dict[str, str]:
    """fact -> human description, for every producer fact that differs from this process."""
    diffs: dict[str, str] = {}
    p = manifest.producer
    if p.vllm != runtime.vllm:
        diffs["vllm"] = f"vllm: bundle built from {p.vllm}, this process has {runtime.vllm or 'no vllm installed'}"
    for fact in _compared(manifest, runtime):
        built, have = getattr(p, fact), getattr(runtime, fact)
        if built != have:
            diffs[fact] = f"{fact}: bundle built with {built}, this process has {have or f'no {fact} installed'}"
    return diffs


def check_versions(manifest: Manifest | Index, path: str, runtime: RuntimeVersions, allow: frozenset[str]) -> list[str]:
    """Raise BundleMismatchError for differences not allowed; return the allowed ones (to log)."""
    diffs = version_differences(manifest, runtime)
    refused = {k: v for k, v in diffs.items() if k not in allow}
    if refused:
        names = ",".join(sorted(refused))
        raise BundleMismatchError(
            f"bundle {path} does not match this process:\n    " + "\n    ".join(refused.values()),
            fix=f"rebuild the bundle with `nojit build` in this environment, or set NOJIT_ALLOW_MISMATCH={names} "
            "to serve it anyway (its cubins may then be wrong for this software)",
        )
    return [diffs[k] for k in sorted(diffs) if k in allow]


def check_arch(manifest: Manifest | Index, path: str, capability: tuple[int, int], allow: frozenset[str]) -> None:
    """sm_90a SASS runs on compute capability 9.0 only; anything else must be refused."""
    have = capability[0] * 10 + capability[1]
    if have != manifest.target.capability and "arch" not in allow:
        raise BundleMismatchError(
            f"bundle {path} holds {manifest.target.arch} cubins (compute capability "
            f"{manifest.target.capability}); this GPU is compute capability {capability[0]}.{capability[1]}",
            fix="build a bundle for this GPU (its deployment's platform), or serve on an H100/H200",
        )


def check_source(kernel: str, bundled: str, live: str, path: str, allow: frozenset[str]) -> bool:
    """True when the live kernel source is the one the bundle compiled (or `source` is allowed)."""
    if bundled == live:
        return True
    if "source" in allow:
        return False
    raise BundleMismatchError(
        f"kernel {kernel}: its source changed since bundle {path} was built "
        f"(bundle source hash {bundled[:16]}, live {live[:16]})",
        fix="rebuild the bundle against the installed vLLM with `nojit build`",
    )


def check_tool_versions(fact: str, built: dict[str, object], what: str, path: str, allow: frozenset[str]) -> list[str]:
    """The versions of fact's tools (TOOL_FACTS) that `what` in bundle `path` was made with (`built`: distribution
    -> version) against this process's: a difference is refused unless `fact` is allowed (then logged and returned)."""
    diffs = [f"{tool} {built.get(tool)} (bundle) vs {here} (installed)"
             for tool in TOOL_FACTS[fact] if built.get(tool) != (here := installed_version(tool))]
    if diffs and fact not in allow:
        raise BundleMismatchError(f"{what} in bundle {path} was made with other {fact} tools: {'; '.join(diffs)}",
                                  fix=f"install the versions the bundle names, rebuild the bundle with these, or set "
                                  f"NOJIT_ALLOW_MISMATCH={fact} to serve it anyway (it may then fail to load or be wrong)")
    for line in diffs:
        log.warning("nojit: serving %s from %s although %s (NOJIT_ALLOW_MISMATCH=%s)", what, path, line, fact)
    return diffs
