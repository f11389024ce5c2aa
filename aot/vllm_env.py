"""Import vLLM's real kernels on a build machine with no GPU, as a given GPU would see them.

vLLM decides several things about its kernels from the GPU it runs on: whether Triton is
usable at all (no driver means `triton.jit` becomes a placeholder), the PDL flag baked into
every mHC TileLang kernel, the SM count behind the mHC split choice, DeepGEMM support. A
build box has no GPU, so the deployment states those facts and this module makes vLLM see
exactly them, before any vLLM kernel module is imported. Nothing here touches the compiled
code: the kernels are vLLM's own objects; only the questions vLLM asks about the device are
answered from the deployment instead of a driver.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType, SimpleNamespace
from typing import Any

from nojit.aot.errors import BuildError


@dataclass(frozen=True)
class PlatformFacts:
    """What a serving GPU would report to vLLM. Defaults: H200 SXM (H100 SXM is the same)."""

    device_name: str = "NVIDIA H200"
    capability: tuple[int, int] = (9, 0)
    sm_count: int = 132
    total_memory_bytes: int = 143771 * (1 << 20)
    pdl: bool = True
    deep_gemm: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "device_name": self.device_name,
            "capability": list(self.capability),
            "sm_count": self.sm_count,
            "total_memory_bytes": self.total_memory_bytes,
            "pdl": self.pdl,
            "deep_gemm": self.deep_gemm,
        }


_installed: PlatformFacts | None = None


def _device_properties(facts: PlatformFacts) -> SimpleNamespace:
    major, minor = facts.capability
    return SimpleNamespace(
        name=facts.device_name,
        major=major,
        minor=minor,
        multi_processor_count=facts.sm_count,
        total_memory=facts.total_memory_bytes,
        is_integrated=False,
        L2_cache_size=60 * (1 << 20),
        warp_size=32,
    )


def install_deployment_platform(facts: PlatformFacts) -> None:
    """Make vLLM, in this build process only, see the deployment's GPU.

    Must run before any `vllm` kernel module is imported. Idempotent for the same facts;
    a second, different set of facts in one process is refused (vLLM caches what it saw).
    """
    global _installed
    if _installed is not None:
        if _installed != facts:
            raise BuildError(
                f"platform facts already installed as {_installed}; one build process serves one "
                f"deployment platform (asked for {facts})",
                fix="run a separate `nojit build` per deployment",
            )
        return
    already = [m for m in (TILELANG_KERNELS_MODULE, "vllm.tilelang_utils") if m in sys.modules]
    if already:
        raise BuildError(
            f"vLLM kernel modules were imported before the deployment platform was installed: {already}",
            fix="call nojit.aot.vllm_env.install_deployment_platform() before importing vLLM kernels",
        )
    # vLLM keeps real Triton JITFunctions when the visible-device list is empty (its
    # "distributed environment" rule); otherwise, with no driver, triton.jit is a placeholder.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    os.environ.setdefault("VLLM_USE_DEEP_GEMM", "1" if facts.deep_gemm else "0")

    import torch

    props = _device_properties(facts)
    torch.cuda.get_device_properties = lambda device=None: props  # type: ignore[assignment]
    torch.cuda.get_device_capability = lambda device=None: facts.capability  # type: ignore[assignment]

    import vllm.platforms as platforms
    from vllm.platforms.interface import DeviceCapability, Platform, PlatformEnum

    # vllm.platforms.cuda cannot be imported without libcuda (it loads vLLM's CUDA
    # extension), so this is vLLM's base Platform with the CUDA identity and answers.
    class DeploymentCudaPlatform(Platform):
        """A CUDA platform answering device questions from the deployment."""

        _enum = PlatformEnum.CUDA
        device_name = "cuda"
        device_type = "cuda"
        dispatch_key = "CUDA"
        ray_device_key = "GPU"
        dist_backend = "nccl"
        device_control_env_var = "CUDA_VISIBLE_DEVICES"

        @classmethod
        def get_device_capability(cls, device_id: int = 0) -> DeviceCapability:
            return DeviceCapability(major=facts.capability[0], minor=facts.capability[1])

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return facts.device_name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return facts.total_memory_bytes

        @classmethod
        def device_count(cls) -> int:
            return 1

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return facts.sm_count

        @classmethod
        def is_arch_support_pdl(cls) -> bool:
            return facts.pdl

        @classmethod
        def support_deep_gemm(cls) -> bool:
            return facts.deep_gemm

        @classmethod
        def is_fully_connected(cls, physical_device_ids: list[int]) -> bool:
            return True

    # Switch the class of vLLM's own platform object, so that modules which bound
    # `current_platform` at import see the deployment's answers too.
    platform = platforms.current_platform
    _neutral_class[0] = type(platform)
    _deployment_class[0] = DeploymentCudaPlatform
    platform.__class__ = DeploymentCudaPlatform
    _installed = facts


_neutral_class: list[type] = [object]
_deployment_class: list[type] = [object]
TILELANG_KERNELS_MODULE = "vllm.model_executor.kernels.mhc.tilelang_kernels"
# Modules that define their Triton kernels only under `if current_platform.is_cuda():` at
# import (dsv4_topk.py:38). vLLM's package imports load them under the neutral platform,
# without the kernel; they are reloaded once under the deployment platform. They import
# nothing that needs libcuda (torch, vllm.platforms, vllm.triton_utils).
CUDA_ONLY_KERNEL_MODULES = frozenset({"vllm.model_executor.layers.fused_moe.router.dsv4_topk"})
_cuda_reloaded: set[str] = set()


@contextlib.contextmanager
def _neutral_platform() -> Iterator[None]:
    import vllm.platforms as platforms

    platform = platforms.current_platform
    platform.__class__ = _neutral_class[0]
    try:
        yield
    finally:
        platform.__class__ = _deployment_class[0]


def import_kernel_module(name: str) -> ModuleType:
    """Import a vLLM module that holds Triton kernels or their warmup owners.

    Many vLLM modules run CUDA-only setup at import (probing vLLM's CUDA extension, which
    needs libcuda). They are imported with vLLM's neutral platform; the deployment's answers
    apply again as soon as the import returns, for everything computed at call time (keys,
    launch options). TileLang's kernel module is the exception: it bakes PDL and its pass
    configs in at import, so it must be imported under the deployment platform first.
    """
    if _installed is None:
        raise BuildError("the deployment platform is not installed", fix="call install_deployment_platform() first")
    module = sys.modules.get(name)
    if module is None:
        had_tilelang = TILELANG_KERNELS_MODULE in sys.modules
        with _neutral_platform():
            module = importlib.import_module(name)
        if not had_tilelang and TILELANG_KERNELS_MODULE in sys.modules:
            raise BuildError(
                f"importing {name} imported the TileLang kernels under the neutral platform",
                fix="import vllm.model_executor.kernels.mhc.tilelang_kernels before the Triton kernel modules",
            )
    if name in CUDA_ONLY_KERNEL_MODULES and name not in _cuda_reloaded:
        _cuda_reloaded.add(name)
        module = importlib.reload(module)  # under the deployment platform: defines the CUDA kernels
    return module


def installed_platform() -> PlatformFacts | None:
    return _installed
