"""Keys nojit derives itself from vLLM's call sites, where vLLM declares none (or declares them wrong).

Some kernels on the DeepSeek-V4 path have no warmup owner (plain @triton.jit launched from
model or runner code), some owners are registered too late to count (MTP), and a few
declarations miss real run-time keys (pointer-alignment combinations, a synthetic KV-cache
stride). For each, a row here states the call exactly as the call site makes it: argument
kinds (tensor dtype and 16-byte alignment, int values of each Triton class, constexprs)
and launch options, as a function of the deployment, with the file:line it was read from.
The keys are then computed by Triton's own binder, as for declared kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nojit.aot.deployment import Deployment


@dataclass(frozen=True)
class Tensor:
    """What a Triton key sees of a tensor argument: its dtype and whether data_ptr % 16 == 0."""

    dtype: Any
    aligned: bool = True

    def data_ptr(self) -> int:
        return 0 if self.aligned else 4


Calls = Callable[[Deployment], list[dict[str, Any]]]


@dataclass(frozen=True)
class DerivedKernel:
    kernel: str  # "module:qualname" of the JITFunction
    site: str  # vLLM 0.33.0 file:line of the launch this mirrors
    calls: Calls  # one kwargs dict per distinct call (kernel params and launch options), [] = not reached
    why: str  # why nojit derives these keys instead of taking vLLM's declaration
    groups: tuple[str, ...] = ("dsv4",)


def all_derived() -> tuple[DerivedKernel, ...]:
    """Every derived row: DeepSeek-V4 model kernels and vLLM's model-runner kernels."""
    from nojit.aot.triton_derived_dsv4 import DSV4_DERIVED
    from nojit.aot.triton_derived_runner import RUNNER_DERIVED

    return DSV4_DERIVED + RUNNER_DERIVED


def select_derived(groups: set[str] | None) -> list[DerivedKernel]:
    return [d for d in all_derived() if groups is None or groups & set(d.groups)]
