"""Import vLLM's own call-site modules from a verbatim copy of their files, without vLLM installed.

`mount(root)` puts a finder first on sys.meta_path for `vllm` and `vllm.*`:
  * a name in STUBS gets a small stand-in built here (the heavy imports the call sites reach but
    do not use on the paths driven: platform probing, logging setup, configs, distributed state);
  * a package whose __init__ pulls in the engine (EMPTY_PACKAGES) becomes an empty package;
  * everything else is loaded from root/vllm/... as it is (a missing file is a clear ImportError).
`loaded` lists the files actually loaded, which tools/prepare_device.py carries to the device.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import logging
import os
import re
import sys
import types
from typing import Any

# Packages whose __init__.py imports the engine (configs, platforms, model registry): made empty.
EMPTY_PACKAGES = frozenset({
    "vllm", "vllm.model_executor", "vllm.model_executor.models", "vllm.models", "vllm.v1", "vllm.v1.worker",
    "vllm.v1.worker.gpu", "vllm.v1.attention", "vllm.v1.attention.backends", "vllm.v1.sample",
    "vllm.v1.sample.ops", "vllm.model_executor.layers", "vllm.v1.spec_decode",
    "vllm.models.deepseek_v4", "vllm.models.deepseek_v4.common", "vllm.models.common",
    # FLA's ops package __init__ imports every GDN op (tests/gpu/checks/check_autotune.py imports the ones it drives)
    "vllm.third_party", "vllm.third_party.flash_linear_attention", "vllm.third_party.flash_linear_attention.ops",
})


class _AnyMeta(type):
    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything

# Packages whose __init__ re-exports the engine (model registry): a stand-in __init__, real submodules.
STUB_PACKAGES = frozenset({"vllm.model_executor.models"})


class _Anything(metaclass=_AnyMeta):
    """A stand-in class usable as a base class, decorator, type annotation or value."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __class_getitem__(cls, item: Any) -> Any:
        return cls

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything


class CudaLikePlatform:
    """What the call sites ask `current_platform` on an H200 (sm_90, CUDA, PDL)."""

    # Under TRITON_INTERPRET=1 (the CPU validation of the check) kernels run on CPU tensors.
    device_type = "cpu" if os.environ.get("TRITON_INTERPRET") == "1" else "cuda"
    device_name = "cuda"
    dispatch_key = "CUDA"
    simple_compile_backend = "inductor"

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_xpu(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def is_arch_support_pdl(self) -> bool:
        return True

    def is_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        return _cap(capability) == 90

    def is_device_capability_family(self, capability: Any, device_id: int = 0) -> bool:
        return _cap(capability) // 10 == 9

    def has_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        return _cap(capability) <= 90

    def get_device_capability(self, device_id: int = 0) -> Any:
        return types.SimpleNamespace(major=9, minor=0, to_int=lambda: 90, as_version_str=lambda: "9.0")

    def fp8_dtype(self) -> Any:
        import torch

        return torch.float8_e4m3fn

    def is_pin_memory_available(self) -> bool:
        return False

    def get_device_name(self, device_id: int = 0) -> str:
        import torch

        return torch.cuda.get_device_name(device_id)

    def import_kernels(self) -> None:
        """vLLM's CUDA extension (vllm._C) is not carried: the driven call sites are Triton only."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("is_", "use_")):  # other platform probes (ROCm fnuz, XPU, ...): not this one
            return lambda *args, **kwargs: False
        raise AttributeError(f"the check's stub current_platform has no {name!r} (tests/gpu/checks/vllm_mount.py)")


def _cap(c: Any) -> int:
    return c[0] * 10 + c[1] if isinstance(c, tuple) else int(c)


def _stub_platforms(m: types.ModuleType) -> None:
    m.current_platform = CudaLikePlatform()
    _stub_any(m)


class _OnceLogger(logging.LoggerAdapter):
    """vLLM's logger API (`warning_once`, `info_once`, `debug_once`) over a standard logger."""

    def debug_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.debug(msg, *args)

    def info_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.info(msg, *args)

    def warning_once(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.warning(msg, *args)


def _stub_logger(m: types.ModuleType) -> None:
    m.init_logger = lambda name: _OnceLogger(logging.getLogger(name), {})
    m.logger = logging.getLogger("vllm")
    _stub_any(m)


def _stub_platform_utils(m: types.ModuleType) -> None:
    import torch

    m.is_uva_available = lambda: False  # the V2 runner's non-UVA buffers (plain device tensors)
    m.is_pin_memory_available = lambda: False
    m.num_compute_units = lambda device_id=0: torch.cuda.get_device_properties(device_id).multi_processor_count \
        if torch.cuda.is_available() else 132
    m.cuda_device_count_stateless = lambda: torch.cuda.device_count()
    # platform_utils.py:69-74 (the MoE tile-config file name): the platform's device name, as vLLM asks it
    m.get_device_name_as_file_name = lambda device_id=0: re.sub(
        r"[\s/]+", "_", sys.modules["vllm.platforms"].current_platform.get_device_name(device_id))


def _stub_any(m: types.ModuleType) -> None:
    """Names not defined explicitly resolve to _Anything (importable, never used on the driven paths)."""
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Anything

    m.__getattr__ = __getattr__  # type: ignore[attr-defined]


def _stub_forward_context(m: types.ModuleType) -> None:
    """get_forward_context() returns CURRENT, whose attn_metadata a step sets around a layer's forward."""
    m.CURRENT = types.SimpleNamespace(attn_metadata=None, is_padding=None)
    m.get_forward_context = lambda: m.CURRENT
    m.is_forward_context_available = lambda: True
    _stub_any(m)


class _NotRocm:
    """rocm_aiter_ops on CUDA: every `is_*` / `are_*` probe answers False."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("is_", "are_")):
            return lambda *args, **kwargs: False
        raise AttributeError(f"the check's stub rocm_aiter_ops has no {name!r} (tests/gpu/checks/vllm_mount.py)")


def _stub_aiter(m: types.ModuleType) -> None:
    m.rocm_aiter_ops = _NotRocm()
    _stub_any(m)


def _stub_config_model(m: types.ModuleType) -> None:
    """vllm.config.model's one constant the samplers test against (config/model.py:104)."""
    m.PROCESSED_LOGPROBS_MODES = ("processed_logits", "processed_logprobs")
    _stub_any(m)


def _stub_breakable_cudagraph(m: types.ModuleType) -> None:
    """eager_break_during_capture marks custom-op kernels for the breakable CUDA graph capture; eager here: the
    function itself (torch's custom-op registration reads its signature)."""
    m.eager_break_during_capture = lambda fn: fn
    _stub_any(m)


def _stub_triton_importing(m: types.ModuleType) -> None:
    m.HAS_TRITON = True  # as on the device; vLLM's probe says False on a box whose Triton has no active driver
    _stub_any(m)


STUBS = {
    "vllm.platforms": _stub_platforms,
    "vllm.logger": _stub_logger,
    "vllm.utils.platform_utils": _stub_platform_utils,
    "vllm.config": _stub_any,
    "vllm.config.model": _stub_config_model,
    "vllm.distributed": _stub_any,
    "vllm.sampling_params": _stub_any,
    "vllm.forward_context": _stub_forward_context,
    "vllm.vllm_flash_attn": _stub_any,
    "vllm._custom_ops": _stub_any,
    "vllm._aiter_ops": _stub_aiter,
    "vllm.model_executor.layers.quantization": _stub_any,
    "vllm.multimodal": _stub_any,
    "vllm.usage": _stub_any,
    "vllm.utils.network_utils": _stub_any,
    "vllm.utils.flashinfer": _stub_any,
    "vllm.v1.core.sched": _stub_any,
    # v1/worker/utils.py (KVBlockZeroer's module) imports these for other helpers of that module
    "vllm.model_executor.layers.attention": _stub_any,
    "vllm.model_executor.layers.mamba": _stub_any,
    "vllm.model_executor.layers.utils": _stub_any,
    "vllm.model_executor.models.interfaces": _stub_any,
    "vllm.model_executor.models.utils": _stub_any,
    "vllm.v1.core.kv_cache_utils": _stub_any,
    # v1/worker/mamba_utils.py (batch_memcpy's module) imports the V1 input batch for its other helpers' types
    "vllm.v1.worker.gpu_input_batch": _stub_any,
    # models/deepseek_v4/attention.py (the indexer forward that launches _fill_short_context_topk_indices) imports
    # these for its layers' weights and other paths; the short-context branch driven reads none of them
    "vllm.compilation.breakable_cudagraph": _stub_breakable_cudagraph,
    "vllm.model_executor.layers.linear": _stub_any,
    "vllm.model_executor.layers.sparse_attn_indexer": _stub_any,
    "vllm.model_executor.model_loader": _stub_any,
    "vllm.model_executor.layers.fusion": _stub_any,
    "vllm.model_executor.layers.layernorm": _stub_any,
    "vllm.models.deepseek_v4.common.rope": _stub_any,
    "vllm.models.deepseek_v4.compressor": _stub_any,
    "vllm.utils.multi_stream_utils": _stub_any,
    # third-party packages the device does not have, imported only for configs and types
    "transformers": _stub_any,
    "PIL": _stub_any,
    "uvloop": _stub_any,
    "vllm.triton_utils.importing": _stub_triton_importing,
}


def _stub_for(name: str) -> Any:
    """The stub filler for name: its own, or _stub_any under a stubbed package (vllm.config.cache...)."""
    if name in STUBS:
        return STUBS[name]
    for prefix in STUBS:
        if name.startswith(prefix + "."):
            return _stub_any
    return None


class VllmFinder(importlib.abc.MetaPathFinder):
    def __init__(self, root: str) -> None:
        self.base = os.path.join(os.path.abspath(root), "vllm")
        self.loaded: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        stub = _stub_for(name)
        if stub is None and name != "vllm" and not name.startswith("vllm."):
            return None
        if stub is not None:
            spec = importlib.machinery.ModuleSpec(name, _StubLoader(stub), is_package=True)
            spec.submodule_search_locations = []
            return spec
        rel = os.path.join(self.base, *name.split(".")[1:])
        if name in STUB_PACKAGES and not os.path.isdir(rel):  # no carried submodule: the stand-in __init__ alone
            spec = importlib.machinery.ModuleSpec(name, _StubLoader(_stub_any), is_package=True)
            spec.submodule_search_locations = [rel]
            return spec
        if os.path.isdir(rel):
            init = os.path.join(rel, "__init__.py")
            if name in EMPTY_PACKAGES or name in STUB_PACKAGES or not os.path.isfile(init):
                fill = _stub_any if name in STUB_PACKAGES else (lambda m: None)
                spec = importlib.machinery.ModuleSpec(name, _StubLoader(fill), is_package=True)
                spec.submodule_search_locations = [rel]
                return spec
            self.loaded.append(os.path.relpath(init, self.base))
            return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[rel])
        if os.path.isfile(rel + ".py"):
            self.loaded.append(os.path.relpath(rel + ".py", self.base))
            return importlib.util.spec_from_file_location(name, rel + ".py")
        raise ImportError(f"{name}: not in the carried vLLM copy {self.base} (add it with tools/prepare_device.py)")


class _StubLoader(importlib.abc.Loader):
    def __init__(self, fill: Any) -> None:
        self.fill = fill

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        module.__doc__ = "stand-in made by tests/gpu/checks/vllm_mount.py"
        self.fill(module)


def mount(root: str) -> VllmFinder:
    """Serve `vllm.*` from root/vllm (see the module docstring). Needs a process that has not imported vLLM."""
    if any(m == "vllm" or m.startswith("vllm.") for m in sys.modules if not m.startswith("vllm.tilelang_utils")):
        raise RuntimeError("vllm is already imported in this process; mount needs a fresh process")
    finder = VllmFinder(root)
    sys.meta_path.insert(0, finder)
    return finder
