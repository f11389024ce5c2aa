"""On the GPU: what the C launch path reads through torch's DLPack C exchange API (csrc/nojit_dlpack.h) is what
torch's own accessors say: a CUDA tensor's data pointer, device and dtype, and the current stream (eager, under
a side stream, and inside CUDA-graph capture, where it must be the capture stream). The runner's launches under
capture are checked end to end in tests/gpu/checks/check_bound_grid_graph.py (device step `fastpath`)."""

from __future__ import annotations

import pytest
import torch

from nojit.loader.runtimes.triton import fast as triton_fast

pytestmark = pytest.mark.gpu

KDL_CUDA = 2


@pytest.fixture(scope="module")
def m():
    mod = triton_fast.fast_module()
    if mod is None or not triton_fast.dlpack_status().startswith("on"):
        pytest.skip(f"no DLPack read here: {triton_fast.dlpack_status()}")
    return mod


def test_cuda_tensor_read_equals_torch(m):
    dev = torch.cuda.current_device()
    base = torch.zeros(64, 33, dtype=torch.bfloat16, device="cuda")
    for t in (base, base[3:], base[:, 1::2], base.t(), base[:0], torch.nn.Parameter(base[5:], requires_grad=False),
              torch.zeros(16, dtype=torch.float8_e4m3fn, device="cuda")[1:]):
        ptr, device, _dl, index, shape, _strides = m.dlpack_read(t)
        assert ptr == t.data_ptr()
        assert device == (KDL_CUDA, dev)
        assert m.dtypes[index] is t.dtype
        assert shape == tuple(t.shape)


def test_current_stream_is_torchs_eager_side_and_capture(m):
    dev = torch.cuda.current_device()
    assert m.dlpack_current_stream(dev) == torch.cuda.current_stream().cuda_stream
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert m.dlpack_current_stream(dev) == side.cuda_stream
    seen = {}
    x = torch.zeros(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seen["api"] = m.dlpack_current_stream(dev)
        seen["torch"] = torch.cuda.current_stream().cuda_stream
        x.add_(1)
    assert seen["api"] == seen["torch"] != torch.cuda.current_stream().cuda_stream
    graph.replay()
    torch.cuda.synchronize()
    assert x.tolist() == [1.0] * 8
