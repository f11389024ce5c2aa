"""FLA's import-time questions to the GPU, answered in the build as the H200 answers them at serve.

vLLM's FLA copy (third_party/flash_linear_attention/ops/utils.py) decides some autotune config lists when
its modules are imported, from the device: `check_shared_mem()` (Triton driver's
`utils.get_device_properties(i)["max_shared_mem"]` for each of `torch.cuda.device_count()` devices, at least
100 KiB) picks `chunk_o.BKV_LIST` ([64, 128], else [32, 64]) and `cumsum.BS_LIST` ([32, 64], else [16, 32]);
`is_nvidia_hopper` (Triton's target backend and the device name) picks `chunk_o.NUM_WARPS`. On the H200
nojit's loader answers `get_device_properties` from the driver (loader/runtimes/triton/driver.py), so the
served Autotuners hold the large lists. The build box has no device (0 devices, no driver `utils`): FLA would
swallow the error and pick the small lists, and the bundle's configs would not be the served Autotuner's
(`BundleMismatchError` at serve). So FLA is imported once here, first, with those questions answered.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from nojit.aot.errors import BuildError
from nojit.aot.runtimes.triton.compiler import OfflineDriver
from nojit.aot.vllm_env import PlatformFacts, import_kernel_module

FLA_UTILS = "vllm.third_party.flash_linear_attention.ops.utils"
FLA_OPS = "vllm.third_party.flash_linear_attention.ops"
# Opt-in shared memory per block (CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, what Triton's driver.c
# reports as max_shared_mem): 227 KiB on compute capability 9.0 (CUDA C++ Programming Guide, technical
# specifications per compute capability).
MAX_SHARED_MEM_OPTIN = {(9, 0): 227 * 1024}


class _Utils:
    def __init__(self, facts: PlatformFacts) -> None:
        self.facts = facts

    def get_device_properties(self, device: int) -> dict[str, int]:
        return {"max_shared_mem": MAX_SHARED_MEM_OPTIN[self.facts.capability],
                "multiprocessor_count": self.facts.sm_count}


@contextlib.contextmanager
def _gpu_answers(facts: PlatformFacts) -> Iterator[None]:
    """One device whose Triton driver answers `utils.get_device_properties`, for the import only."""
    import torch
    from triton.runtime import driver

    answering = OfflineDriver()
    answering.__dict__["utils"] = _Utils(facts)  # an attribute: OfflineDriver's __getattr__ is not reached
    previous, count = driver._active, torch.cuda.device_count
    driver.set_active(answering)
    torch.cuda.device_count = lambda: 1  # type: ignore[assignment]
    try:
        yield
    finally:
        driver._active = previous
        torch.cuda.device_count = count  # type: ignore[assignment]


def import_fla(facts: PlatformFacts, check: bool = True) -> Any:
    """FLA's ops as the deployment's GPU configures them; the deployment platform must be installed. If FLA was
    imported before (its answers are cached for the process), its answers are checked instead, when `check`: the
    rows that plan FLA's autotuned kernels need them; resolving which prefill backend runs does not (a process that
    imported vLLM's model first, as the strict-startup probe does, may still plan the FlashInfer prefill)."""
    if facts.capability not in MAX_SHARED_MEM_OPTIN:
        raise BuildError(f"no opt-in shared memory known for compute capability {facts.capability}",
                         fix="nojit builds for sm_90 only")
    if FLA_UTILS not in sys.modules:
        with _gpu_answers(facts):
            import_kernel_module(FLA_OPS)
    utils = import_kernel_module(FLA_UTILS)
    if check and not (utils.is_nvidia and utils.is_nvidia_hopper and utils.check_shared_mem()):
        raise BuildError("vLLM's FLA was imported in this build process before nojit answered its GPU questions: "
                         "its autotune configs are not the H200's (is_nvidia_hopper "
                         f"{utils.is_nvidia_hopper}, check_shared_mem {utils.check_shared_mem()})",
                         fix="report this to nojit (the Qwen rows must import FLA first: aot/models/qwen3_5/fla_host.py)")
    return import_kernel_module(FLA_OPS)
