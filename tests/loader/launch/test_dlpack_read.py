"""Tensors read through torch's DLPack C exchange API (csrc/nojit_dlpack.h) against torch's own accessors.

The C launch path reads each tensor argument's data pointer, device and dtype (and, for TileLang, shape and
strides) through `type(t).__dlpack_c_exchange_api__` instead of torch's Python API. Here, on real CPU tensors:
the read equals `data_ptr()`, `dtype`, `shape`, `stride()` and `is_contiguous()` (views with a storage offset,
non-contiguous, empty, Parameter, subclasses, every registered dtype); the Triton key codes, the entry found
and the packed bytes are the same with the DLPack read on and off for drawn calls; a capsule that is missing,
of another name or of another major version leaves the torch read; and a tensor not on the launch's device
is not launched by C (the Python path decides, as for any call C declines).
"""

from __future__ import annotations

import ctypes

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.loader.runtimes.tilelang.test_fast_path as tlf
from tests.loader.runtimes.triton.test_fast import _runner_for, bound_of, variant_for
from tests.loader.bundle.test_triton_key_parity import DTYPES, call_args, specializer, tensor, theirs
from tests.support.triton_test_kernels import every_kind
from nojit.loader.launch import fast_module as launch_fast
from nojit.loader.runtimes.triton import fast as triton_fast
from nojit.loader.runtimes.triton.fast import TritonFastPath, fast_module

m = fast_module()
pytestmark = [
    pytest.mark.skipif(m is None, reason="the C fast path is not built"),
    pytest.mark.skipif(not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"),
                       reason="this torch has no DLPack C exchange API"),
]

KDL_CPU, KDL_CUDA = 1, 2


class Sub(torch.Tensor):
    """A tensor subclass as libraries define them (no capsule of its own: torch.Tensor's is inherited)."""


@pytest.fixture
def dlpack_off():
    prev = m.dlpack_enable(False)
    try:
        yield
    finally:
        m.dlpack_enable(prev)


def test_torch_api_is_used():
    assert triton_fast.dlpack_status().startswith("on 1.")


def _views() -> list[torch.Tensor]:
    base = torch.arange(4 * 6 * 5, dtype=torch.float32).reshape(4, 6, 5)
    return [
        base, base[1:], base[:, 2:, 1:], base[..., ::2], base.transpose(0, 2), base[2, 3], base[1:, 4:5, :1],
        base.reshape(-1)[7:], base[:0], torch.empty(0, 3), torch.empty(3, 0, 2)[:, :, 1:], base.expand(2, 4, 6, 5),
        torch.empty(1, 1, 7)[:, :, 2:], torch.zeros(5, 1, 3).as_strided((5, 1, 3), (3, 99, 1)),
        torch.tensor(3.0), torch.nn.Parameter(torch.zeros(8)[3:]), torch.zeros(16)[5:].as_subclass(Sub),
        torch.zeros(2, 3).t().contiguous(), torch.zeros(10, dtype=torch.bfloat16)[3:],
    ]


@pytest.mark.parametrize("t", _views(), ids=range(len(_views())))
def test_read_equals_torch(t):
    r = m.dlpack_read(t)
    assert r is not None
    ptr, device, _dl, index, shape, strides = r
    assert ptr == t.data_ptr()
    assert device == (KDL_CPU, 0)
    assert m.dtypes[index] is t.dtype
    assert shape == tuple(t.shape)
    if t.numel():  # an empty tensor's strides are torch's to normalise
        assert tuple(s for s, n in zip(strides, t.shape) if n != 1) == tuple(
            s for s, n in zip(t.stride(), t.shape) if n != 1)


def test_every_registered_dtype_maps_to_itself_or_asks_torch():
    """Each allocatable dtype reads as itself; the DLDataTypes torch gives several dtypes (int8 and int1..int7,
    uint8 and uint1..uint7) are marked shared (-2): their tensors' dtype is asked of torch, so the key sees the
    same dtype as the Python path."""
    seen = 0
    for dtype in m.dtypes:
        try:
            t = torch.empty(3, dtype=dtype)
        except Exception:  # noqa: BLE001 - quantized / bits dtypes: torch cannot allocate them
            continue
        r = m.dlpack_read(t)
        if r is None:  # DLPack has no code for it (complex32 as bcomplex32, bits): read through torch
            continue
        seen += 1
        assert r[0] == t.data_ptr()
        assert r[3] == -2 or m.dtypes[r[3]] is dtype, dtype
    assert seen >= 20
    assert m.dlpack_read(torch.empty(2, dtype=torch.int8))[3] == -2
    assert m.dtypes[m.dlpack_read(torch.empty(2, dtype=torch.float8_e4m3fn))[3]] is torch.float8_e4m3fn


def _table_for(fn, kwargs, options):
    key = theirs(fn, kwargs, options)

    fast = TritonFastPath(fn, specializer, {key: variant_for(key)})
    return key, fast.tables.get(key[1])


def _both_reads(table, bound):
    on = (m.lookup(table, bound), m.pack(table, 0, bound))
    prev = m.dlpack_enable(False)
    try:
        off = (m.lookup(table, bound), m.pack(table, 0, bound))
    finally:
        m.dlpack_enable(prev)
    return on, off


def _odd_tensor(draw, dtype):
    """Tensors as call sites pass them: views with storage offsets, non-contiguous, empty, Parameter, subclass."""
    base = tensor(dtype, draw(st.booleans()))
    form = draw(st.sampled_from(["plain", "strided", "empty", "parameter", "subclass", "view"]))
    if form == "strided":
        return base[::2]
    if form == "empty":
        return base[:0]
    if form == "parameter":
        return torch.nn.Parameter(base, requires_grad=False)
    if form == "subclass":
        return base.as_subclass(Sub)
    if form == "view":
        return base.reshape(-1)[draw(st.integers(0, 8)):]
    return base


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_key_codes_entry_and_bytes_are_the_same_with_either_read(data):

    kwargs, options = data.draw(call_args(every_kind))
    for name in ("p", "p_noalign", "q"):  # tensor parameters: every dtype and form the key rules distinguish
        if isinstance(kwargs.get(name), torch.Tensor):
            kwargs[name] = _odd_tensor(data.draw, data.draw(st.sampled_from(DTYPES)))
    try:
        key, table = _table_for(every_kind, kwargs, options)
    except (OverflowError, TypeError):
        return
    if table is None:
        return
    bound = bound_of(every_kind, kwargs, options)
    on, off = _both_reads(table, bound)
    assert on == off
    assert on[0][0] == 0  # the entry of this very key, by either read


def _capsule(buf) -> object:
    """A PyCapsule named "dlpack_exchange_api" around a ctypes buffer (a stand-in producer table)."""
    new = ctypes.pythonapi.PyCapsule_New
    new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
    return new(ctypes.addressof(buf), b"dlpack_exchange_api", None)


class _Header(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("prev_api", ctypes.c_void_p)]


def _torch_api_address() -> int:
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    return get(torch.Tensor.__dlpack_c_exchange_api__, b"dlpack_exchange_api")


def test_capsule_missing_or_of_another_major_is_refused():
    fake2 = _Header(2, 0, None)  # a future major: other layouts, nothing on its chain
    chained = _Header(2, 1, _torch_api_address())  # a future major whose prev_api is a 1.x table: that one is used
    keep = [fake2, chained]

    class Major2(torch.Tensor):
        __dlpack_c_exchange_api__ = _capsule(fake2)

    class Chained(torch.Tensor):
        __dlpack_c_exchange_api__ = _capsule(chained)

    class NotACapsule(torch.Tensor):
        __dlpack_c_exchange_api__ = 42

    assert m.dlpack_api_of(Major2).startswith("off: the DLPack exchange API's major version is not 1")
    assert m.dlpack_api_of(NotACapsule).startswith("off: __dlpack_c_exchange_api__ is not")
    assert m.dlpack_api_of(object).startswith("off: no __dlpack_c_exchange_api__")
    assert m.dlpack_api_of(Chained).startswith("on 1.")
    assert m.dlpack_api_of(torch.nn.Parameter).startswith("on 1.")
    # tensors of those types: read through torch, same key codes as a plain tensor

    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False),
                q=tensor(torch.bfloat16, False), n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5,
                maybe_ptr=None, BLOCK=64, MODE="relu")
    _key, table = _table_for(every_kind, base, {})
    plain = m.lookup(table, bound_of(every_kind, base, {}))
    for cls in (Major2, NotACapsule, Chained):
        t = tensor(torch.float32, True).as_subclass(cls)
        if cls is Chained:
            assert m.dlpack_read(t)[0] == t.data_ptr()
        else:
            assert m.dlpack_read(t) is None  # not read through DLPack
        bound = bound_of(every_kind, dict(base, p=t), {})
        assert m.lookup(table, bound) == plain
        on, off = _both_reads(table, bound)
        assert on == off and on[1][:8] == t.data_ptr().to_bytes(8, "little")
    del keep


def test_setup_falls_back_when_the_api_is_unusable(monkeypatch):
    """dlpack_setup on a type without a usable API (or NOJIT_DLPACK=0) turns the DLPack read off: the same
    keys through torch; setting it up again turns it back on."""
    fake2 = _Header(2, 0, None)

    class Major2(torch.Tensor):
        __dlpack_c_exchange_api__ = _capsule(fake2)

    try:
        status = m.dlpack_setup(Major2, (), None, True)
        assert status.startswith("off: the DLPack exchange API's major version is not 1")
        assert m.dlpack_read(torch.zeros(4)) is None
        with pytest.raises(RuntimeError):
            m.dlpack_enable(True)
        monkeypatch.setenv("NOJIT_DLPACK", "0")
        assert launch_fast._setup_dlpack(m, torch) == "off: disabled"
        assert m.dlpack_read(torch.zeros(4)) is None
    finally:
        monkeypatch.delenv("NOJIT_DLPACK", raising=False)
        m.dlpack_status = launch_fast._setup_dlpack(m, torch)
    assert m.dlpack_status.startswith("on 1.")
    assert m.dlpack_read(torch.zeros(4))[0] is not None


def test_a_tensor_off_the_launch_device_is_not_launched_by_c():
    """A CPU tensor (or one on another GPU) given to a CUDA launch: C declines it (None, the Python path
    decides, as for every call C declines); on the launch's own device type and id the entry is found."""

    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False),
                q=tensor(torch.bfloat16, False), n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5,
                maybe_ptr=None, BLOCK=64, MODE="relu")
    key = theirs(every_kind, base, {})
    fast, run, taken = _runner_for(every_kind, {key: variant_for(key)})
    table = fast.tables[key[1]]
    m.set_function(table, 0, 0, 1)
    m.set_function(table, 0, 1, 1)
    bound = bound_of(every_kind, base, {})
    assert m.launch(table, bound, (1,), 0, 0) is None  # launches are CUDA: these CPU tensors are declined
    prev = m.dlpack_launch_device_type(KDL_CPU)
    try:
        assert m.launch(table, bound, (1,), 0, 0) == 0  # found (no driver entry here: "load first")
        assert m.launch(table, bound, (1,), 1, 0) is None  # device 1: the tensors are on device 0
    finally:
        m.dlpack_launch_device_type(prev)
    # through the runner: handed to the server's Python run, with the call as it came
    every_kind.run = run
    try:
        every_kind[(1,)](**base)
    finally:
        del every_kind.run
    assert taken and taken[-1][0] == "slow" and taken[-1][2]["p"] is base["p"]
    # the torch read has no device: as before, C does not check it
    off = m.dlpack_enable(False)
    try:
        assert m.launch(table, bound, (1,), 0, 0) == 0
    finally:
        m.dlpack_enable(off)


def test_tilelang_plan_reads_the_same_either_way(dlpack_off):
    """tl_pack with the torch read (fixture: DLPack off) equals tl_pack with the DLPack read, for contiguous,
    non-contiguous, wrong-dtype and empty tensors."""

    v = tlf.variant_for(tlf.post_launch())
    cases = [tlf.post_tensors(n) for n in (0, 1, 7, 513)] + [
        tlf.post_tensors(3, a=torch.empty(3, 4, 8)[:, :, ::2]),
        tlf.post_tensors(3, b=torch.empty(3, 4, 8)),
        tlf.post_tensors(3, c=torch.empty(3, 4, 4)),
        tlf.post_tensors(3, d=torch.nn.Parameter(torch.empty(3, 8, dtype=torch.bfloat16), requires_grad=False)),
        tlf.post_tensors(3, x=torch.empty(3, 4, 8, dtype=torch.bfloat16).as_subclass(Sub)),
        tlf.post_tensors(3, a=torch.empty(1, 4, 4).expand(3, 4, 4)),
        tlf.post_tensors(5, a=torch.empty(6, 4, 4)[1:]),
    ]
    off = [tlf.c_outcome(v, t) for t in cases]
    m.dlpack_enable(True)
    on = [tlf.c_outcome(v, t) for t in cases]
    assert on == off
    assert sum(o is not None for o in on) >= 6


def test_tilelang_launch_declines_a_tensor_off_the_launch_device():

    v = tlf.variant_for(tlf.post_launch())
    tensors = tlf.post_tensors(4)
    assert m.tl_launch(v._plan, tensors, 0, 77) == 1  # CUDA launch, CPU tensors: declined
    prev = m.dlpack_launch_device_type(KDL_CPU)
    try:
        assert m.tl_launch(v._plan, tensors, 0, 77) == 2  # accepted: the module is not loaded here
        assert m.tl_launch(v._plan, tensors, 1, 77) == 1
    finally:
        m.dlpack_launch_device_type(prev)


def test_runners_read_torchs_stream_through_dlpack_only_for_torchs_accessor():
    """A runner made with torch's raw stream accessor launches on current_work_stream's stream (the same one:
    checked on the GPU, tests/gpu/test_dlpack_gpu.py); one given any other accessor (the tests' stand-ins)
    calls that accessor, as before."""
    from types import SimpleNamespace

    from nojit.loader.runtimes.triton.fast import make_run
    from nojit.loader.runtimes.triton.serving import TritonKernelServer

    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False),
                q=tensor(torch.bfloat16, False), n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5,
                maybe_ptr=None, BLOCK=64, MODE="relu")
    key = theirs(every_kind, base, {})
    fast, _run, _taken = _runner_for(every_kind, {key: variant_for(key)})  # stand-in accessors
    assert m.runner_reads_stream_through_dlpack(fast.runner) is False
    real = TritonFastPath(every_kind, specializer, {key: variant_for(key)})
    server = SimpleNamespace(fn=every_kind, names=tuple(p.name for p in every_kind.params),
                             record=SimpleNamespace(id="t"), _options={}, _debug=False, _instrumentation_mode="",
                             run=lambda *a, **k: None)
    server.options_key = lambda o: TritonKernelServer.options_key(server, o)
    make_run(server, real)  # torch's own accessors (nojit.loader.launch.torch_cuda)
    assert m.runner_reads_stream_through_dlpack(real.runner) is True
    prev = m.dlpack_enable(False)
    try:
        assert m.runner_reads_stream_through_dlpack(real.runner) is False
    finally:
        m.dlpack_enable(prev)
