"""Key rules against the real JIT, fast and deterministic (issue 13's mutation run of loader/bundle/triton_key.py,
loader/bundle/tilelang_key.py and loader/bundle/key_values.py uses this file as its test command).

Expected keys come from Triton's own binder (`create_function_from_signature` + `native_specialize_impl`,
through aot's `key_for_call`) and from TileLang's own phase-1 key (`tilelang.jit`'s signature binding, when
TileLang is importable); never from nojit's output. No vLLM import: the whole file runs in a few seconds.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import triton
import triton.language as tl
from triton._utils import canonicalize_ptr_dtype

from nojit.aot.runtimes.triton.compiler import key_for_call
from nojit.loader.bundle.key_values import UnsupportedArgument, check_tagged, tag, untag
from nojit.loader.bundle.triton_key import (
    ArgSpecializer, from_triton_specialization, generic_spec, hint_agreement, key_from_json, key_text, key_to_json,
    layout_spec, make_binder, options_key, runtime_params, with_implicit_options,
)
from tests.support.triton_test_kernels import every_kind

specializer = ArgSpecializer(canonicalize_ptr_dtype, torch.Tensor)


@triton.jit
def const_kind(p: "tl.const", q: "*kfp32", flag: tl.int1, h: tl.float16, b: tl.bfloat16, u: tl.uint32, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(p + offs, tl.load(q + offs) + h + b + u + flag)


def tensor(dtype: torch.dtype, aligned: bool) -> torch.Tensor:
    base = torch.zeros(64, dtype=dtype)
    return base if aligned else base[1:]


class _SubTensor(torch.Tensor):
    """A tensor subclass (Triton specializes anything with data_ptr; the loader's slower branch)."""


def ours(fn, kwargs, options=None):
    _bound, spec, opts = make_binder(fn, specializer)(**kwargs, **(options or {}))
    return (spec, options_key(with_implicit_options(opts, fn.debug, triton.knobs.runtime.debug,
                                                    triton.knobs.compilation.instrumentation_mode)))


def same_as_triton(fn, kwargs, options=None):
    try:
        expected = key_for_call(fn, (), {**kwargs, **(options or {})})
    except (OverflowError, TypeError, ValueError):  # Triton refuses the call: so must nojit
        with pytest.raises((UnsupportedArgument, OverflowError, TypeError, ValueError)):
            ours(fn, kwargs, options)
        return None
    got = ours(fn, kwargs, options)
    assert got == expected, f"\nours:   {got}\ntriton: {expected}"
    assert key_from_json(key_to_json(got)) == got
    return got


BASE = dict(p=tensor(torch.float32, True), p_noalign=tensor(torch.float32, True), q=tensor(torch.bfloat16, True),
            n=16, n_dns=16, n_noalign=16, n64=16, scale=1.0, flag=True, x=2.5, maybe_ptr=None, BLOCK=64)
INTS = [0, 1, 2, 15, 16, 17, 32, -1, -16, -17, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16, -(2**31), -(2**31) - 1,
        -(2**31) - 16, 2**63 - 16, 2**63 - 1, 2**63, 2**63 + 16, -(2**63), -(2**63) - 1, 2**64 - 16, 2**64 - 1, 2**64]
VARIED = {
    "n": INTS + [True, False, 2.5, None, tl.constexpr(16)],
    "n_dns": [0, 1, 16, 17, 2**31, 2**63, 2**64 - 1, 2**64, True, None],
    "n_noalign": [1, 16, 17, 2**31 + 16, 2**63, 2**64],
    "n64": [0, 1, 16, 17, 2**31 + 16, 2**63],
    "scale": [1.0, 2, True],
    "flag": [True, False, 1, 16, None],
    "x": [2.5, 16, 1, None, float("-inf")],
    "maybe_ptr": [None, tensor(torch.float32, True), tensor(torch.int32, False), torch.nn.Parameter(torch.zeros(4)),
                  torch.nn.Parameter(torch.zeros(5))[1:], tensor(torch.float32, False).as_subclass(_SubTensor),
                  tensor(torch.int8, True).as_subclass(_SubTensor), tensor(torch.int8, False)[15:].as_subclass(_SubTensor)],
    "p": [tensor(d, a) for d in (torch.float32, torch.bfloat16, torch.float16, torch.int8, torch.int64, torch.uint8,
                                 torch.bool, torch.float8_e4m3fn, torch.float8_e5m2) for a in (True, False)],
    "p_noalign": [tensor(torch.float32, False), tensor(torch.int32, True)],
    "BLOCK": [64, 1, 16, True, False, None, 2.5, float("-inf"), float("nan"), "s", torch.float16, tl.float32,
              tl.constexpr(8), every_kind],
    # (a JITFunction passed to a parameter not declared constexpr is left out: Triton keys it as
    # ("constexpr", cache_key), which the build tags ("str", ...) and the loader ("jit", ...); see RESULTS-s5.md)
}


@pytest.mark.parametrize("name", sorted(VARIED))
def test_triton_each_parameter_kind_matches_the_binder(name):
    for v in VARIED[name]:
        same_as_triton(every_kind, {**BASE, name: v})


def test_triton_pairs_of_values_match_the_binder():
    for n, n64, ptr in itertools.product([0, 1, 16, 17, 2**31, 2**63], [1, 16, 17], [None, tensor(torch.int8, False)]):
        same_as_triton(every_kind, {**BASE, "n": n, "n64": n64, "maybe_ptr": ptr, "MODE": "gelu"})


@pytest.mark.parametrize("options", [{}, {"num_warps": 8}, {"num_warps": 4, "num_stages": 2}, {"launch_pdl": True},
                                     {"debug": True}, {"debug": False, "num_ctas": 1}])
def test_triton_options_match_the_binder(options):
    same_as_triton(every_kind, BASE, options)


def test_triton_const_and_annotated_parameters_match_the_binder():
    base = dict(p=tensor(torch.float32, True), q=tensor(torch.float32, False), flag=True, h=1.0, b=2, u=16, BLOCK=8)
    for name, values in [("p", [tensor(torch.float32, False), tensor(torch.bfloat16, True)]), ("flag", [True, 0, 1]),
                         ("h", [1.0, 16]), ("b", [1, 16.0]), ("u", [0, 1, 16, 17, 2**32 - 1]),
                         ("q", [tensor(torch.int32, True)])]:
        for v in values:
            same_as_triton(const_kind, {**base, name: v})


def test_triton_binder_binds_positional_keyword_and_default_arguments():
    bind = make_binder(every_kind, specializer)
    args = [BASE[k] for k in ("p", "p_noalign", "q", "n", "n_dns", "n_noalign", "n64", "scale", "flag", "x",
                              "maybe_ptr", "BLOCK")]
    bound, spec, opts = bind(*args, num_warps=4)
    assert bound[:12] == tuple(args) and bound[12] == "relu" and opts == {"num_warps": 4}
    expected = key_for_call(every_kind, tuple(args), {"num_warps": 4})
    assert spec == expected[0]
    with pytest.raises(TypeError):
        bind(*args[:3])


def test_triton_unsupported_arguments_are_refused():
    spec = specializer.make(False, True, True)
    for bad in [(1, 2), object(), b"x", 2**64]:
        with pytest.raises(UnsupportedArgument):
            spec(bad)
    with pytest.raises(UnsupportedArgument):
        from_triton_specialization([(("i32", "i32"), None)])


def test_triton_with_implicit_options_follows_jit_run():
    # JITFunction.run: kwargs["debug"] = kwargs.get("debug", self.debug) or knobs.runtime.debug
    assert with_implicit_options({}, None, False, "") == {"debug": False, "instrumentation_mode": ""}
    assert with_implicit_options({}, None, None, "") == {"debug": None, "instrumentation_mode": ""}
    assert with_implicit_options({}, True, False, "m") == {"debug": True, "instrumentation_mode": "m"}
    assert with_implicit_options({"debug": False}, True, True, "") == {"debug": True, "instrumentation_mode": ""}
    assert with_implicit_options({"debug": False, "num_warps": 2}, True, False, "") == {
        "debug": False, "num_warps": 2, "instrumentation_mode": ""}


def test_triton_key_json_refuses_what_key_to_json_never_writes():
    good = {"spec": [["*fp32", "D"], ["i32", ""], ["i64", None], ["constexpr", ["int", 1]], ["u64", ["int", 1]]],
            "options": [["num_warps", ["int", 4]]]}
    assert key_from_json(good) == ((("*fp32", "D"), ("i32", ""), ("i64", None), ("constexpr", ("int", 1)),
                                    ("u64", ("int", 1))), (("num_warps", ("int", 4)),))
    bad = [
        [], {"spec": []}, {"spec": [], "options": [], "x": 1}, {"spec": {}, "options": []}, {"spec": [], "options": {}},
        {"spec": [["*fp32"]], "options": []}, {"spec": [[1, "D"]], "options": []}, {"spec": [["", "D"]], "options": []},
        {"spec": [["*fp32", "E"]], "options": []}, {"spec": [["*fp32", 1]], "options": []},
        {"spec": [["i32", "X"]], "options": []}, {"spec": [["i32", ["int"]]], "options": []},
        {"spec": [["constexpr", 5]], "options": []}, {"spec": [["constexpr", ["bogus", 5]]], "options": []},
        {"spec": [], "options": [["a", ["int", 1]], ["a", ["int", 2]]]}, {"spec": [], "options": [["a"]]},
        {"spec": [], "options": [[1, ["int", 1]]]}, {"spec": [], "options": [["a", 1]]},
        {"spec": [["constexpr", ["tuple", [["int", 1], 2]]]], "options": []},
        {"spec": [["*fp32", "D"], ["i32", "D", 3]], "options": []},
    ]
    for obj in bad:
        with pytest.raises(ValueError):
            key_from_json(obj)
    for item in (["*fp32"], ["i32", "D", 3], "i32", ["", "D"]):
        with pytest.raises(ValueError, match=r"is not \[type, attribute\]"):
            key_from_json({"spec": [item], "options": []})


def test_triton_key_text():
    key = ((("*bf16", "D"), ("i32", ""), ("i64", None), ("u64", ("int", 1)), ("constexpr", ("int", 64))),
           (("num_warps", ("int", 4)), ("launch_pdl", ("bool", True))))
    assert key_text(key) == "(*bf16:D, i32:, i64:-, u64:1, 64) | num_warps=4, launch_pdl=True"
    assert key_text(((("constexpr", ("str", "a")),), ())) == "('a')"


def test_triton_generic_and_layout_specs():
    spec = (("*fp32", "D"), ("i32", "D"), ("constexpr", ("int", 1)), ("constexpr", ("NoneType", None)),
            ("i64", ("int", 1)), ("i32", None), ("constexpr", ("int", 1)), ("*bf16", ""), ("i32", ""))
    runtime = runtime_params({"constexpr": [6]}, len(spec))
    assert runtime == (True,) * 6 + (False,) + (True,) * 2
    assert runtime_params({}, 3) == (True, True, True)
    generic = (("*fp32", ""), ("i32", ""), ("i32", ""), ("constexpr", ("NoneType", None)), ("i64", ""),
               ("i32", None), ("constexpr", ("int", 1)), ("*bf16", ""), ("i32", ""))
    assert generic_spec(spec, runtime) == generic
    layout = (("*fp32", "D"), ("i32", "D")) + generic[2:]
    assert layout_spec(spec, runtime) == layout
    assert hint_agreement(layout, generic) == len(spec) - 2
    assert hint_agreement(layout, layout) == len(spec)


def test_key_values_tag_round_trip_and_distinctness():
    values = [1, True, 1.0, "1", None, float("inf"), float("-inf"), (1, (True, "a")), tl.constexpr(3), tl.float16]
    tags = [tag(v) for v in values]
    assert tags == [("int", 1), ("bool", True), ("float", 1.0), ("str", "1"), ("NoneType", None), ("float", "inf"),
                    ("float", "-inf"), ("tuple", (("int", 1), ("tuple", (("bool", True), ("str", "a"))))),
                    ("int", 3), ("dtype", "fp16")]
    assert tag(float("nan")) == ("float", "nan") and untag(("float", "nan")) != untag(("float", "nan"))
    assert [untag(t) for t in tags[:8]] == values[:8]
    assert untag(tags[9]) == tl.float16 and type(untag(tags[9])) is type(tl.float16)
    assert tag(every_kind) == ("jit", every_kind.cache_key)
    for bad in [object(), [1], b"x", {1: 2}]:
        with pytest.raises(UnsupportedArgument):
            tag(bad)
    with pytest.raises(UnsupportedArgument):
        untag(("jit", "abc"))


def test_key_values_check_tagged():
    for good in [["int", 1], ["bool", True], ["float", 1.5], ["float", 2], ["float", "inf"], ["float", "-inf"],
                 ["float", "nan"], ["str", "x"], ["NoneType", None], ["dtype", "fp16"], ["jit", "ab"],
                 ["tuple", [["int", 1], ["tuple", []]]], ("int", 1)]:
        check_tagged(good)
    nested = ["int", 1]
    for _ in range(8):
        nested = ["tuple", [nested]]
    check_tagged(nested)
    for bad in [["int"], ["int", 1, 2], [1, 1], "int", ["int", True], ["int", 1.5], ["bool", 1], ["float", "x"],
                ["float", True], ["str", 1], ["NoneType", 0], ["dtype", 1], ["tuple", 1], ["tuple", [1]],
                ["set", [1]], ["tuple", [["int", "1"]]], ["tuple", [nested]]]:
        with pytest.raises(ValueError):
            check_tagged(bad)


# ---------------------------------------------------------------------------- TileLang
def _tl_kernel(a, n, b, block=64, flag=True, scale=1.5, name="x", none=None):
    return a, n, b


def test_tilelang_binder_matches_python_signature_binding():
    """TileLang 0.1.12 binds a call to the kernel function's signature with defaults filled in and keys the
    non-tensor parameters in signature order; Python's own Signature.bind is that binding."""
    import inspect

    from nojit.loader.bundle.tilelang_key import MISSING
    from nojit.loader.bundle.tilelang_key import make_binder as tl_binder

    bind, tensors, scalars = tl_binder(_tl_kernel, {"a", "b"})
    assert tensors == ("a", "b") and scalars == ("n", "block", "flag", "scale", "name", "none")
    sig = inspect.signature(_tl_kernel)
    for args, kwargs in [((1, 2, 3), {}), ((1, 2, 3, 128), {"flag": False}), ((), {"a": 1, "b": 3, "n": 7, "none": 0}),
                         ((1, 2, 3, 4, 5, 6, 7, 8), {})]:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        want_t = tuple(bound.arguments[t] for t in tensors)
        want_s = tuple(bound.arguments[s] for s in scalars)
        assert bind(*args, **kwargs) == (want_t, want_s)
    assert bind(n=4) == ((MISSING, MISSING), (4, 64, True, 1.5, "x", None))
    assert bind() == ((MISSING, MISSING), (MISSING, 64, True, 1.5, "x", None))
    with pytest.raises(TypeError):
        bind(1, 2, 3, bogus=1)
    assert tl_binder(lambda: 0, set())[0]() == ((), ())


def test_tilelang_binder_refuses_parameters_it_cannot_key():
    from nojit.loader.bundle.tilelang_key import make_binder as tl_binder

    def star(a, *rest): ...
    def kwonly(a, *, n): ...
    def kwargs(a, **kw): ...
    def reserved(a, _nj_missing): ...
    for fn in (star, kwonly, kwargs, reserved):
        with pytest.raises(ValueError, match="not supported"):
            tl_binder(fn, {"a"})


def test_tilelang_key_json():
    from nojit.loader.bundle.tilelang_key import key_from_json as tl_from, key_names, key_text as tl_text, key_to_json as tl_to

    names, values = ("n", "flag", "scale", "name", "none", "inf"), (4, True, 1.5, "x", None, float("inf"))
    obj = tl_to(names, values)
    assert obj == {"args": [["n", ["int", 4]], ["flag", ["bool", True]], ["scale", ["float", 1.5]], ["name", ["str", "x"]],
                            ["none", ["NoneType", None]], ["inf", ["float", "inf"]]]}
    assert tl_from(obj) == (4, True, 1.5, "x", None, "inf")
    assert key_names(obj) == names
    assert tl_from({"args": []}) == ()
    assert tl_text(("n", "s"), (4, "a")) == "(n=4, s='a')"
    bad = [[], {"args": {}}, {"args": [], "x": 1}, {"arg": []}, {"args": [["n"]]}, {"args": [["n", ["int", 1], 2]]},
           {"args": [[1, ["int", 1]]]}, {"args": [["n", 1]]}, {"args": [["n", ["int"]]]}, {"args": [["n", ["int", 1, 2]]]},
           {"args": [["n", ["int", 1]], ["n", ["int", 2]]]}, {"args": [["n", ["int", "1"]]]},
           {"args": [["n", ["tuple", [["int", 1]]]]]}, {"args": [["n", ["bogus", 1]]]}, {"args": ["n"]}]
    for b in bad:
        with pytest.raises(ValueError):
            tl_from(b)
    with pytest.raises(ValueError, match=r"malformed TileLang key item \['n', \['int', 1, 2\]\]"):
        tl_from({"args": [["n", ["int", 1, 2]]]})
    with pytest.raises(ValueError, match="TileLang key item 'n' holds a list"):
        tl_from({"args": [["n", ["tuple", []]]]})


def test_tilelang_source_hash_follows_source_helpers_and_plain_globals(tmp_path, monkeypatch):
    import importlib
    import sys

    from nojit.loader.bundle.tilelang_key import source_hash

    def load(name, text):
        (tmp_path / f"{name}.py").write_text(text)
        monkeypatch.syspath_prepend(str(tmp_path))
        sys.modules.pop(name, None)
        return importlib.import_module(name)

    base = ("import os\nFLAG = True\nN = 4\nOTHER = 1\nOBJ = object()\n"
            "def helper(x):\n    return x + N\n"
            "def kernel(a):\n    return helper(a) if FLAG else os.sep, OBJ\n")
    m = load("nj_tl_a", base)
    h = source_hash(m.kernel)
    assert h == source_hash(m.kernel) and len(h) == 64
    for attr, value in [("FLAG", False), ("N", 5), ("N", 4.0)]:
        monkeypatch.setattr(m, attr, value)
        assert source_hash(m.kernel) != h, attr
        monkeypatch.undo()
    monkeypatch.setattr(m, "OTHER", 2)  # not read by the kernel
    monkeypatch.setattr(m, "OBJ", object())  # not a plain value
    assert source_hash(m.kernel) == h
    changed = load("nj_tl_b", base.replace("x + N", "x - N"))
    assert source_hash(changed.kernel) != h
    same = load("nj_tl_c", base)
    assert source_hash(same.kernel) == h
    # helpers are followed to a bounded depth; recursion terminates
    chain = "".join(f"def f{i}():\n    return f{i + 1}()\n" for i in range(7)) + "def f7():\n    return 7\n"
    deep = load("nj_tl_d", chain)
    deep2 = load("nj_tl_e", chain.replace("return 7", "return 8"))
    assert source_hash(deep.f3) != source_hash(deep2.f3)  # f7 is 4 calls below f3
    assert source_hash(deep.f2) == source_hash(deep2.f2)  # and 5 below f2: past the depth bound
    # names the module does not define (builtins, attributes) sort anywhere among the ones it does
    late = load("nj_tl_g", "zed = 1\ndef k(a):\n    return abs(a) + zed\n")
    h_late = source_hash(late.k)
    monkeypatch.setattr(late, "zed", 2)
    assert source_hash(late.k) != h_late
    rec = load("nj_tl_f", "def r(n):\n    return r(n - 1) if n else 0\n")
    assert len(source_hash(rec.r)) == 64
    # no source: the qualname stands in
    fn, other = eval("lambda: 0"), eval("lambda: 0")
    other.__qualname__ = "other"
    assert source_hash(fn) != source_hash(other)
