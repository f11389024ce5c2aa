"""The stand-in's example tensors as CuTeDSL's TVM-FFI argument spec sees them: what a tensor on the serving GPU gives.

`cuda_dlpack` rewrites only the device of a CPU tensor's DLPack (CuTeDSL's `_Tensor` with enable_tvm_ffi calls
`tvm_ffi.from_dlpack`, cute/runtime.py); the spec converter (cute/_tvm_ffi_args_spec_converter.py) then takes
device type "cuda" and a device_id *variable* (bound at each call from the argument's own device and made current
around the launch), as from a CUDA example tensor: no device ordinal is compiled in. The memory space becomes gmem,
as a GPU compile's (a CPU example gives 'generic' pointers), and a view keeps its own data pointer, shape and
strides. A CPU example (the control) compiles a function that takes CPU tensors only."""

from __future__ import annotations

import pytest
import torch

from tests.support.common import have

pytestmark = pytest.mark.skipif(not (have("cutlass") and have("tvm_ffi")), reason="needs nvidia-cutlass-dsl and tvm_ffi")


def _spec(rewrite: bool):
    import cutlass.cute as cute
    import tvm_ffi
    from cutlass.base_dsl.tvm_ffi_builder import spec
    from cutlass.cute import _tvm_ffi_args_spec_converter as conv

    from nojit.aot.runtimes.flashinfer_cute.stand_in import _cuda_from_dlpack

    storage = torch.empty(512, dtype=torch.float32)
    view = storage[64:64 + 8 * 24].view(8, 24)  # a view with a storage offset, as _aligned_empty hands out
    original = tvm_ffi.from_dlpack
    if rewrite:
        tvm_ffi.from_dlpack = _cuda_from_dlpack(original)
    try:
        t = cute.runtime.from_dlpack(view, assumed_align=16, enable_tvm_ffi=True).mark_layout_dynamic()
    finally:
        tvm_ffi.from_dlpack = original
    del storage
    param = conv._convert_single_arg(t, "x", cute.Tensor, conv.ConverterContext())
    assert isinstance(param, spec.Tensor)
    return view, t, param, spec


def test_example_tensor_specs_a_cuda_argument_with_a_device_variable():
    from nojit.aot.runtimes.flashinfer_cute import stand_in

    view, t, param, spec = _spec(rewrite=True)
    assert str(t.memspace).endswith("gmem")
    # a GPU compile's spec: device type cuda, device id the converter's shared variable (never a constant)
    assert param.device_type_name == "cuda" and isinstance(param.device_id, spec.Var)
    assert param.device_id.name == "device_id0"
    dl = t._tvm_ffi_tensor
    assert str(dl.device) == "cuda:0" and tuple(dl.shape) == (8, 24) and tuple(dl.strides) == (24, 1)
    capsule = dl.__dlpack__()  # the view's own bytes (its offset kept), the storage alive through DLPack's deleter
    head = stand_in._DLTensorHead.from_address(stand_in._capsule_pointer(capsule, stand_in._capsule_name(capsule)))
    assert head.data == view.data_ptr() and (head.device.device_type, head.device.device_id) == (stand_in.KDL_CUDA, 0)


def test_control_a_cpu_example_specs_a_cpu_argument():
    _, t, param, _ = _spec(rewrite=False)
    assert str(t.memspace).endswith("generic") and param.device_type_name == "cpu"
