"""Key parity: the loader's key for a call equals the key Triton's own binder computes.

For every bundled vLLM kernel and for a kernel that exercises every parameter kind, random
argument sets (ints around the class boundaries, aligned and unaligned tensors of many
dtypes, None for pointers, bools, floats, launch options) are keyed both ways.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from triton._utils import canonicalize_ptr_dtype

from tests.support.common import have, needs_vllm
from nojit.loader.resolve import jit_function_of
from nojit.aot.models.deepseek_v4.owners import REPORT_KERNELS
from nojit.aot.runtimes.triton.compiler import key_for_call
from nojit.loader.bundle.key_values import UnsupportedArgument
from nojit.loader.bundle.triton_key import ArgSpecializer, generic_spec, key_from_json, key_to_json, make_binder, options_key, with_implicit_options

INTS = [0, 1, 2, 15, 16, 17, -1, -16, -17, 1024, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 1, 2**32,
        2**63 - 16, 2**63, 2**63 + 1, 2**64 - 16]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.int8, torch.uint8, torch.bool,
          torch.float8_e4m3fn, torch.float8_e5m2]

specializer = ArgSpecializer(canonicalize_ptr_dtype, torch.Tensor)


def tensor(dtype: torch.dtype, aligned: bool) -> torch.Tensor:
    base = torch.zeros(64, dtype=dtype)
    return base if aligned else base[1:]


@st.composite
def call_args(draw, fn):
    """Keyword arguments for every parameter of fn, drawn by what the parameter looks like."""
    kwargs = {}
    for p in fn.params:
        name = p.name
        if p.is_constexpr:
            kwargs[name] = draw(st.sampled_from([1, 16, 128, 512, 1024, 0, True, False, None, float("-inf"), float("nan")]))
        elif name.endswith("_ptr") or name in ("p", "q", "p_noalign", "maybe_ptr"):
            kind = draw(st.sampled_from(["aligned", "unaligned", "none"] if name == "maybe_ptr" else ["aligned", "unaligned"]))
            kwargs[name] = None if kind == "none" else tensor(draw(st.sampled_from(DTYPES)), kind == "aligned")
        else:
            kwargs[name] = draw(st.sampled_from(INTS) | st.integers(-(2**40), 2**40) | st.booleans()
                                | st.floats(allow_nan=False, allow_infinity=False))
    options = draw(st.sampled_from([{}, {"num_warps": 8}, {"num_warps": 4, "num_stages": 2}, {"launch_pdl": True}]))
    return kwargs, options


def ours(fn, kwargs, options):
    full = {**kwargs, **options}
    _bound, spec, opts = make_binder(fn, specializer)(**full)
    return (spec, options_key(with_implicit_options(opts, fn.debug, False, "")))


def theirs(fn, kwargs, options):
    return key_for_call(fn, (), {**kwargs, **options})


def check(fn, kwargs, options):
    try:
        expected = theirs(fn, kwargs, options)
    except (OverflowError, TypeError) as exc:  # Triton refuses the call: so must nojit (as a miss)
        with pytest.raises(UnsupportedArgument):  # the exact error the server reads as "not bundled"
            ours(fn, kwargs, options)
        return str(exc)
    got = ours(fn, kwargs, options)
    assert got == expected, f"\nours:   {got}\ntriton: {expected}"
    # the JSON form written into bundles round-trips to the same hashable key
    assert key_from_json(key_to_json(got)) == got
    return None


def report_kernels():
    import importlib

    out = []
    for row in REPORT_KERNELS:
        module, _, qual = row.kernel.partition(":")
        obj = importlib.import_module(module)
        for part in qual.split("."):
            obj = getattr(obj, part)
        out.append(pytest.param(jit_function_of(obj), id=qual))
    return out


@needs_vllm
@pytest.mark.parametrize("fn", report_kernels() if have("vllm") else [])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_vllm_kernel_keys_match_triton(fn, data):
    kwargs, options = data.draw(call_args(fn))
    check(fn, kwargs, options)


@settings(max_examples=400, deadline=None)
@given(data=st.data())
def test_every_parameter_kind_matches_triton(data):
    from tests.support.triton_test_kernels import every_kind

    kwargs, options = data.draw(call_args(every_kind))
    check(every_kind, kwargs, options)


def test_boundary_values_explicitly():
    """The classes the issue names, one by one: 0, 1, 16, -16, large; aligned/unaligned; None."""
    from tests.support.triton_test_kernels import every_kind

    base = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, False), q=tensor(torch.bfloat16, False),
                n=16, n_dns=1, n_noalign=32, n64=1, scale=1.0, flag=True, x=2.5, maybe_ptr=None, BLOCK=64)
    for field, values in [("n", [0, 1, 16, -16, 17, 2**31, 2**63]), ("n_dns", [0, 1, 16]), ("n_noalign", [1, 16, 17]),
                          ("n64", [1, 16, 17]), ("maybe_ptr", [None, tensor(torch.float32, True), tensor(torch.int32, False)])]:
        for v in values:
            check(every_kind, {**base, field: v}, {})


def test_generic_spec_drops_value_assumptions():
    spec = (("*fp32", "D"), ("i32", "D"), ("constexpr", ("int", 1)), ("constexpr", ("NoneType", None)),
            ("i64", ("int", 1)), ("i32", None), ("constexpr", ("int", 1)))
    runtime = (True, True, True, True, True, True, False)
    assert generic_spec(spec, runtime) == (("*fp32", ""), ("i32", ""), ("i32", ""), ("constexpr", ("NoneType", None)),
                                           ("i64", ""), ("i32", None), ("constexpr", ("int", 1)))
