"""The two faces the build sees: a runtime (how its kernels are enumerated and compiled) and a
model (what the deployment's model reaches, as tables each runtime reads).

A new runtime is a package under aot/runtimes/ exporting a `Runtime` plus one line in
aot/runtimes/__init__.py; a new model is a package under aot/models/ exporting a `Model` plus
one line in aot/models/__init__.py. Nothing else in the build names either.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.aot.plan import Plan, PlanKernel, PlanRequest


@dataclass(frozen=True)
class WorkerSettings:
    """What every compile worker is started with."""

    cache_dir: str
    kernel_sources: str | None  # a source map (kernels from extracted files, no vLLM), or None
    platform_installed: bool  # the deployment's platform stands in for the GPU in this worker


@dataclass(frozen=True)
class CompileResult:
    """One compiled key: the cubin and its launch schema (the runtime's own type), plus what the
    bundle records about the kernel and the tools that made it."""

    cubin: bytes
    launch: Any  # TritonLaunch | TileLangLaunch
    source_hash: str
    tools: dict[str, str] = field(default_factory=dict)
    kernel_info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Model:
    """A model nojit knows: which HF config it serves and, per runtime name, that runtime's tables."""

    name: str
    model_type: str  # the HF config.json "model_type" this model serves
    tables: Mapping[str, Any]  # runtime name -> the rows that runtime's planner reads
    # The model's own rules for a deployment (raise BuildError naming the field: deployment.field_error),
    # checked before planning; the deployment file's generic rules are aot/deployment.py's.
    check_deployment: Callable[[Deployment], None] = lambda d: None


@dataclass(frozen=True)
class Selection:
    """Which part of the model's tables a build keeps."""

    groups: set[str] | None = None  # row groups (None: all)
    kernels: list[str] | None = None  # substrings of kernel ids (None: all)
    cache_dir: str | None = None  # the build's --cache-dir, where a planner keeps a tool it builds to ask a library

    def wants(self, kernel_id: str) -> bool:
        return not self.kernels or any(s in kernel_id for s in self.kernels)

    def in_groups(self, groups: tuple[str, ...]) -> bool:
        return self.groups is None or bool(self.groups & set(groups))


@dataclass(frozen=True)
class Runtime:
    """A kernel runtime's build face: enumerate keys into the plan, prepare a worker, compile one key."""

    name: str
    plan: Callable[[Plan, Deployment, Model, Selection], None]
    prepare_worker: Callable[[WorkerSettings], None]
    compile: Callable[[PlanRequest, str, PlanKernel, WorkerSettings], CompileResult]  # request, kernel id, kernel
    recorded_inputs: Callable[[str, Any], dict[str, Any]] | None = None  # compile inputs of a key recorded at serve time
    add_generic: Callable[[Plan], int] | None = None  # add the generic entries of the plan's exact keys
    use_source_map: Callable[[Plan, str], None] | None = None  # take source digests from a --kernel-sources map
    # Compile cache (aot/compile_cache.py): everything one request's output depends on, as JSON (None: not
    # cacheable), computed in the build's parent; and how to read back the runtime's launch type.
    cache_inputs: Callable[[PlanRequest, PlanKernel], dict[str, Any] | None] | None = None
    launch_from_json: Callable[[dict[str, Any]], Any] | None = None
