"""The compile plan: which kernels the bundle holds and which keys of each to compile.

Every runtime's planner fills it through `Plan.add_kernel` and `Plan.add`; `add` keeps a dict
index, so planning stays linear however many keys a deployment reaches. The plan's JSON form
(`--emit-plan` / `--from-plan`) is the dataclasses' fields, one object per kernel and request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nojit.aot.bundle_writer import write_text_atomically
from nojit.aot.errors import BuildError

PLAN_FORMAT = 1


@dataclass
class PlanKernel:
    """One kernel: its runtime, its source digest, its parameter names and what the bundle records of it."""

    runtime: str
    source_hash: str
    params: list[str]
    info: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"runtime": self.runtime, "source_hash": self.source_hash, "params": self.params, "info": self.info}


@dataclass
class PlanRequest:
    """One key to compile: the key in its runtime's JSON form, exact or generic, and where it came from.

    `sample` describes the call that produced the key (device checks replay it); `compile_inputs` is
    what a runtime needs beyond the key to compile it (TileLang: the recorded variant)."""

    kernel: str
    key: Any
    variant: str  # "exact" or "generic"
    origin: str  # registry:<owner> | derived:<site> | recorded:<file> | generic
    sample: dict[str, Any] | None = None
    compile_inputs: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kernel": self.kernel, "key": self.key, "variant": self.variant, "origin": self.origin}
        if self.sample is not None:
            out["sample"] = self.sample
        if self.compile_inputs:
            out["extra"] = self.compile_inputs
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> PlanRequest:
        return cls(obj["kernel"], obj["key"], obj["variant"], obj["origin"], obj.get("sample"), obj.get("extra") or {})


def _index_key(kernel: str, key: Any, variant: str) -> tuple[str, str, str]:
    return kernel, variant, json.dumps(key, sort_keys=True)


@dataclass
class Plan:
    """Everything to compile: kernels (identity, source hash) and requests (key + origin)."""

    deployment: dict[str, Any]
    vllm: str | None
    kernels: dict[str, PlanKernel] = field(default_factory=dict)
    requests: list[PlanRequest] = field(default_factory=list)
    _index: set[tuple[str, str, str]] = field(default_factory=set, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._index = {_index_key(r.kernel, r.key, r.variant) for r in self.requests}

    def runtimes(self) -> set[str]:
        return {k.runtime for k in self.kernels.values()}

    def add_kernel(self, kernel_id: str, kernel: PlanKernel) -> None:
        """Record a kernel once (the first planner to meet it describes it)."""
        self.kernels.setdefault(kernel_id, kernel)

    def add(self, request: PlanRequest) -> bool:
        """Add a request unless the same (kernel, key, variant) is already planned."""
        index_key = _index_key(request.kernel, request.key, request.variant)
        if index_key in self._index:
            return False
        self._index.add(index_key)
        self.requests.append(request)
        return True

    def keep_kernels(self, keep: Callable[[str, PlanKernel], bool]) -> None:
        """Drop every kernel (and its requests) for which `keep` is false."""
        self.kernels = {kid: k for kid, k in self.kernels.items() if keep(kid, k)}
        self.requests = [r for r in self.requests if r.kernel in self.kernels]
        self._index = {_index_key(r.kernel, r.key, r.variant) for r in self.requests}

    def keep_requests(self, keep: Callable[[PlanRequest], bool]) -> None:
        """Drop every request for which `keep` is false (kernels stay)."""
        self.requests = [r for r in self.requests if keep(r)]
        self._index = {_index_key(r.kernel, r.key, r.variant) for r in self.requests}

    def to_json(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, "deployment": self.deployment, "vllm": self.vllm,
                "kernels": {kid: k.to_json() for kid, k in self.kernels.items()},
                "requests": [r.to_json() for r in self.requests]}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Plan:
        kernels = {kid: PlanKernel(k["runtime"], k["source_hash"], list(k["params"]), k["info"])
                   for kid, k in obj["kernels"].items()}
        return cls(obj["deployment"], obj.get("vllm"), kernels, [PlanRequest.from_json(r) for r in obj["requests"]])

    @classmethod
    def read(cls, path: str) -> Plan:
        try:
            with open(path) as f:
                obj = json.load(f)
        except (OSError, ValueError) as exc:
            raise BuildError(f"cannot read plan {path}: {exc}", fix="write it with `nojit build --emit-plan`") from None
        if not isinstance(obj, dict) or obj.get("format") != PLAN_FORMAT:
            raise BuildError(f"{path} is not a nojit plan (format {PLAN_FORMAT})", fix="write it with `nojit build --emit-plan`")
        try:
            return cls.from_json(obj)
        except (KeyError, TypeError, AttributeError) as exc:
            raise BuildError(f"{path} is not a nojit plan: missing or malformed {exc}",
                             fix="write it with `nojit build --emit-plan`") from None

    def write(self, path: str) -> None:
        write_text_atomically(path, json.dumps(self.to_json(), indent=1, sort_keys=True))
