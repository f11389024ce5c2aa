"""What built one runtime's entries, and what the serving process must match to serve them.

The arch check, the driver floor, the version check and `nojit doctor` each ask the same questions of every runtime
a bundle holds; the answers are a runtime's facts, so they live with its launch record (manifest.RUNTIMES), one
`Provenance` per runtime, and those modules read them instead of naming runtimes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Provenance:
    compiler: str  # what made the binaries, as the driver-floor line names it ("Triton's ptxas")
    compiler_field: str | None = None  # the kernel-record info field holding its version (None: not recorded there)
    producer_compiler: str | None = None  # the producer fact to read when no kernel record holds one ("ptxas")
    arch_fields: tuple[str, ...] = ()  # kernel-record info fields naming archs (a name, or a list of flags)
    producer_version: str | None = None  # the producer fact this process's installed package must equal
    optional_install: bool = False  # that package need not be installed to serve (then it is not compared)
    packages: tuple[tuple[str, str], ...] = ()  # (info field, distribution) the process must have at that version
    vendored_in: str | None = None  # the package the runtime's sources come with (DeepGEMM: vLLM)
    library: tuple[str, str, str] | None = None  # (info field "x+MAJOR.MINOR", distribution, name) to match

    def archs(self, info: dict[str, Any]) -> list[str]:
        """The arch names one kernel record gives (flags without an `sm_` are not arch names)."""
        names: list[str] = []
        for name in self.arch_fields:
            value = info.get(name)
            if isinstance(value, str):
                names.append(value)
            elif isinstance(value, (list, tuple)):
                names += [str(v) for v in value if "sm_" in str(v)]
        return names

    def compiler_versions(self, infos: list[dict[str, Any]], producer: Any) -> list[str]:
        """Every version of the compiler the records give (the producer's fact when none does)."""
        seen = [str(i.get(self.compiler_field)) for i in infos if self.compiler_field and i.get(self.compiler_field)]
        fallback = getattr(producer, self.producer_compiler, None) if self.producer_compiler else None
        return seen or ([str(fallback)] if fallback else [])
