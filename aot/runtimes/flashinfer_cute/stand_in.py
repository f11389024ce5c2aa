"""FlashInfer's own CuTeDSL wrappers run on the stand-in GPU: what they ask of the device, answered.

The wrappers (`flashinfer.gdn_prefill.chunk_gated_delta_rule` and the sm_90 kernels' `delta_rule_*_sm90`
launchers) ask FlashInfer's utils for the device's capability, name and SM count (they choose the CP
path by them), take `torch.cuda.current_stream`, and pass `cute.runtime.from_dlpack(t, assumed_align=128)`
of workspaces FlashInfer allocates with `torch.empty`. Here the tensors live on the CPU (torch.empty, never
touched), the device questions get the deployment's answers, the stream is 0 (a typed placeholder: it is
not compiled in) and `torch.empty` aligns to 256 bytes as cudaMalloc does (the CPU allocator's 64 would
fail the 128-byte alignment check of the tensormap workspace). CuTeDSL itself asks the driver one thing
while it traces a kernel launched with `min_blocks_per_mp > 1` and no carveout (the CP route's T precompute,
cutlass_dsl/cutlass.py `_generate_kernel_attrs`): the shared memory per multiprocessor, which it writes into
the kernel's attributes; the arch's value answers it (SMEM_PER_SM), any other attribute is refused by name.
CuTeDSL's TVM-FFI wrapper takes each tensor argument's device from the example tensor (`tvm_ffi.from_dlpack`,
cute/_tvm_ffi_args_spec_converter.py): a CPU example compiles a function that refuses CUDA tensors ("expected
device_type=cpu", seen on the H200) and passes host pointers. So the example tensors' DLPack says cuda:0, as
FlashInfer's own tensors on the serving GPU do; their bytes are never read. Everything is put back on exit.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import types
from collections.abc import Iterator
from typing import Any

import torch

from nojit.aot.errors import BuildError
from nojit.aot.vllm_env import PlatformFacts

# The FlashInfer modules that ask the device questions, by the names they imported them under.
ASKING_MODULES = (
    "flashinfer.gdn_prefill",
    "flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_sm90",
    "flashinfer.gdn_kernels.delta_rule_dsl.delta_rule_cp_sm90",
)
CACHE_MODULE = "flashinfer.gdn_kernels.delta_rule_dsl.custom_compile_cache"
ALIGN = 256  # cudaMalloc's alignment
# CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR per compute capability: 228 KB on sm_90 (CUDA C++
# Programming Guide, "Technical Specifications per Compute Capability": maximum shared memory per SM, 9.0)
SMEM_PER_SM = {(9, 0): 233472}


def _aligned_empty(original: Any) -> Any:
    def empty(*size: Any, dtype: torch.dtype | None = None, device: Any = None, **kwargs: Any) -> torch.Tensor:
        if kwargs:
            return original(*size, dtype=dtype, device=device, **kwargs)
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else tuple(size)
        dtype = dtype or torch.get_default_dtype()
        nbytes = math.prod(shape) * original((), dtype=dtype).element_size()
        raw = original((nbytes + ALIGN,), dtype=torch.uint8, device=device)
        offset = (-raw.data_ptr()) % ALIGN
        return raw[offset:offset + nbytes].view(dtype).view(shape)
    return empty


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLTensorHead(ctypes.Structure):  # dlpack.h: DLTensor starts with data, then device
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice)]


KDL_CPU, KDL_CUDA = 1, 2
_capsule_name = ctypes.pythonapi.PyCapsule_GetName
_capsule_name.restype, _capsule_name.argtypes = ctypes.c_char_p, [ctypes.py_object]
_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype, _capsule_pointer.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]


def cuda_dlpack(tensor: torch.Tensor) -> Any:
    """A DLPack capsule of a CPU tensor that says cuda:0 (an unversioned `dltensor`, whose DLTensor leads the
    DLManagedTensor): what a tensor on the serving GPU would hand CuTeDSL."""
    capsule = tensor.__dlpack__()
    name = _capsule_name(capsule)
    if name != b"dltensor":
        raise BuildError(f"torch handed a DLPack capsule named {name!r}, not 'dltensor'",
                         fix="report it to nojit with the torch version")
    head = _DLTensorHead.from_address(_capsule_pointer(capsule, name))
    if head.device.device_type != KDL_CPU:
        raise BuildError(f"an example tensor of FlashInfer's wrapper is on device type {head.device.device_type}",
                         fix="plan on the GPU-less build box (the stand-in GPU keeps example tensors on the CPU)")
    head.device.device_type, head.device.device_id = KDL_CUDA, 0
    return capsule


def _cuda_from_dlpack(original: Any) -> Any:
    def from_dlpack(tensor: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu":
            tensor = cuda_dlpack(tensor)
        return original(tensor, *args, **kwargs)
    return from_dlpack


def _device_attribute(cuda_helpers: Any, capability: tuple[int, int]) -> Any:
    smem = cuda_helpers.cuda.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR

    def answer(attribute: Any, device_id: int = 0) -> int:
        if attribute == smem and capability in SMEM_PER_SM:
            return SMEM_PER_SM[capability]
        raise BuildError(f"CuTeDSL asked the GPU for {attribute} (sm_{capability[0]}{capability[1]}), which the stand-in "
                         "does not answer", fix="report it to nojit with the FlashInfer and CuTeDSL versions")
    return answer


@contextlib.contextmanager
def flashinfer_on_stand_in(facts: PlatformFacts) -> Iterator[None]:
    """FlashInfer's wrappers see the deployment's GPU (the modules in ASKING_MODULES imported first)."""
    import importlib

    answers = {
        "get_compute_capability": lambda device=None: tuple(facts.capability),
        "get_device_name": lambda device=None: facts.device_name,
        "get_device_sm_count": lambda device=None: facts.sm_count,
    }
    saved: list[tuple[Any, str, Any]] = []
    for name in ASKING_MODULES:
        module = importlib.import_module(name)
        for attr, answer in answers.items():
            if hasattr(module, attr):
                saved.append((module, attr, getattr(module, attr)))
                setattr(module, attr, answer)
    cuda_helpers = importlib.import_module("cutlass.base_dsl.runtime.cuda")
    saved.append((cuda_helpers, "get_device_attribute", cuda_helpers.get_device_attribute))
    cuda_helpers.get_device_attribute = _device_attribute(cuda_helpers, tuple(facts.capability))
    saved.append((torch.cuda, "current_stream", torch.cuda.current_stream))
    torch.cuda.current_stream = lambda device=None: types.SimpleNamespace(cuda_stream=0)  # type: ignore[assignment]
    saved.append((torch, "empty", torch.empty))
    torch.empty = _aligned_empty(torch.empty)  # type: ignore[assignment]
    tvm_ffi = importlib.import_module("tvm_ffi")  # CuTeDSL's _Tensor calls tvm_ffi.from_dlpack by this name
    saved.append((tvm_ffi, "from_dlpack", tvm_ffi.from_dlpack))
    tvm_ffi.from_dlpack = _cuda_from_dlpack(tvm_ffi.from_dlpack)
    try:
        yield
    finally:
        for module, attr, value in reversed(saved):
            setattr(module, attr, value)


class _Lookups(dict):
    """Stands in for `_in_mem_compile_cache`: each lookup is handed to `on_get`, which answers it."""

    def __init__(self, on_get: Any, on_set: Any) -> None:
        super().__init__()
        self._on_get, self._on_set = on_get, on_set

    def get(self, key: Any, default: Any = None) -> Any:
        return self._on_get(key)

    def __setitem__(self, key: Any, value: Any) -> None:
        self._on_set(key, value)


def no_launch(*args: Any, **kwargs: Any) -> None:
    """What a planned lookup returns: the wrapper 'launches' nothing and goes on to its next kernel."""


@contextlib.contextmanager
def cache_answered(on_get: Any, on_set: Any = None) -> Iterator[None]:
    """FlashInfer's compile cache replaced for the with block (its own lookups then go to on_get/on_set)."""
    import importlib

    module = importlib.import_module(CACHE_MODULE)
    original = module._in_mem_compile_cache
    module._in_mem_compile_cache = _Lookups(on_get, on_set or (lambda k, v: None))
    try:
        yield
    finally:
        module._in_mem_compile_cache = original



