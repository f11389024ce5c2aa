"""The rows a model gives the Triton planner: declared owners and derived calls.

A `TritonOwner` names vLLM's own warmup owner (a VllmTritonJitKernel or a
triton_kernel_dispatcher_with_warmup object), the JITFunction it launches, and the arguments
vLLM's model code passes to `register_warmup` as a function of the deployment; the keys then
come from the owner's `get_warmup_keys`, run by vLLM itself.

A `DerivedKernel` covers a kernel vLLM declares no keys for (or declares them wrong): it
states the call exactly as the call site makes it (argument kinds: tensor dtype and 16-byte
alignment, int values of each Triton class, constexprs; and launch options), as a function
of the deployment, with the file:line it was read from. Its keys are computed by Triton's own
binder, as for declared kernels. The rows themselves live with their model (aot/models/).

A `TritonSite` runs a call site itself (vLLM's own Python on the stand-in GPU) while the JIT and
Triton's `Autotuner.run` are recorded: for autotuned kernels, whose tuning keys and pruned
configs only Triton's own Autotuner computes (autotune.py), so a row cannot state them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nojit.aot.deployment import Deployment

Registrations = Callable[[Deployment], list[dict[str, Any]]]
Calls = Callable[[Deployment], list[dict[str, Any]]]


@dataclass(frozen=True)
class TritonOwner:
    owner: str  # "module:attribute" of vLLM's warmup owner object
    kernel: str  # "module:qualname" of the JITFunction it launches
    registrations: Registrations  # register_warmup kwargs per call site; [] = not reached
    site: str  # where vLLM registers it
    groups: tuple[str, ...] = ("dsv4",)


@dataclass(frozen=True)
class Tensor:
    """What a Triton key sees of a tensor argument: its dtype and whether data_ptr % 16 == 0."""

    dtype: Any
    aligned: bool = True

    def data_ptr(self) -> int:
        return 0 if self.aligned else 4


@dataclass(frozen=True)
class DerivedKernel:
    kernel: str  # "module:qualname" of the JITFunction
    site: str  # vLLM 0.33.0 file:line of the launch this mirrors
    calls: Calls  # one kwargs dict per distinct call (kernel params and launch options), [] = not reached
    why: str  # why nojit derives these keys instead of taking vLLM's declaration
    groups: tuple[str, ...] = ("dsv4",)


@dataclass(frozen=True)
class TritonSite:
    kernels: tuple[str, ...]  # "module:qualname" of every JITFunction the site may reach (any other is an error)
    site: str  # vLLM 0.33.0 file:line of the call this runs
    run: Callable[[Deployment], "bool | None"]  # runs the call site; False: the deployment does not reach it
    why: str
    groups: tuple[str, ...] = ("dsv4",)


@dataclass(frozen=True)
class TritonTables:
    """A model's Triton rows, in planning order."""

    owners: tuple[TritonOwner, ...]
    derived: tuple[DerivedKernel, ...]
    vllm_config: Callable[[Deployment], Any]  # the slice of VllmConfig the owners' warmup-key providers read
    sites: tuple[TritonSite, ...] = ()


def once(d: Deployment) -> list[dict[str, Any]]:
    """One registration with no arguments."""
    return [{}]
