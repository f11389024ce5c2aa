"""Generic (universal) entries: laid out like the exact key, assuming nothing about values.

A reduction's result depends on which thread holds which elements, and Triton picks that
layout from divisibility. A generic entry compiled from the key's layout spec must keep the
exact key's layouts (same reduction order, so bit-identical on the GPU) while its code has
no divisibility in its signature and no vector memory access (correct for any alignment).
The GPU side of this is tests/gpu/checks/check_triton.py --variant generic.
"""

from __future__ import annotations

import re

import pytest

from nojit.loader.bundle.triton_key import generic_spec, hint_agreement, layout_spec

triton = pytest.importorskip("triton")

LAYOUT = re.compile(r"#\w+ = #ttg\.\w+<[^>]*>")
SIGNATURE = re.compile(r"tt\.func public @\w+\((.*?)\) attributes", re.S)


def test_layout_spec_keeps_divisibility_marks_and_drops_values():
    spec = (("*fp32", "D"), ("*bf16", ""), ("i32", "D"), ("constexpr", ("int", 1)), ("i64", ("int", 1)),
            ("i32", None), ("constexpr", ("int", 64)))
    runtime = (True, True, True, True, True, True, False)
    assert layout_spec(spec, runtime) == (("*fp32", "D"), ("*bf16", ""), ("i32", "D"), ("i32", ""), ("i64", ""),
                                          ("i32", None), ("constexpr", ("int", 64)))
    assert generic_spec(layout_spec(spec, runtime), runtime) == generic_spec(spec, runtime)
    assert hint_agreement(layout_spec(spec, runtime), generic_spec(spec, runtime)) == len(spec) - 2


def _compile(key, divisibility_assumed):
    from nojit.aot.runtimes.triton.compiler import compile_key, offline_driver
    from tests.support.triton_test_kernels import row_logsumexp

    with offline_driver():
        return compile_key(row_logsumexp, key, divisibility_assumed=divisibility_assumed)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_generic_entry_keeps_the_exact_layouts_and_assumes_no_alignment(dtype):
    runtime = (True, True, True, True, False)
    exact_spec = (("*fp32", "D"), (f"*{dtype}", "D"), ("i32", "D"), ("i32", "D"), ("constexpr", ("int", 1024)))
    exact = _compile((exact_spec, ()), True)
    hinted = _compile((layout_spec(exact_spec, runtime), ()), False)
    plain = _compile((generic_spec(exact_spec, runtime), ()), False)

    assert LAYOUT.findall(hinted.ttgir) == LAYOUT.findall(exact.ttgir)
    # More than the layouts: the same operations in the same order, once names, source
    # locations and the signature's divisibility are set aside.
    assert _normalized(hinted.ttgir) == _normalized(exact.ttgir)
    assert LAYOUT.findall(plain.ttgir) != LAYOUT.findall(exact.ttgir)  # what a plain generic compile would do
    assert "tt.divisibility" in SIGNATURE.search(exact.ttgir).group(1)
    assert "tt.divisibility" not in SIGNATURE.search(hinted.ttgir).group(1)
    # The launch ABI is the generic one: every runtime parameter passed, nothing folded.
    assert [i for i, _ in hinted.launch.args] == [i for i, _ in plain.launch.args] == [0, 1, 2, 3]
    assert hinted.launch.num_warps == exact.launch.num_warps and hinted.launch.shared == exact.launch.shared
    # The cubins: the exact one loads vectors, the generic ones only scalars.
    assert _vector_loads(exact.cubin) > 0
    assert _vector_loads(hinted.cubin) == 0 == _vector_loads(plain.cubin)


def _normalized(ttgir: str) -> list[str]:
    t = re.sub(r"\s*loc\((?:[^()]|\([^()]*\))*\)", "", ttgir)
    t = re.sub(r"^#loc.*$", "", t, flags=re.M)
    t = re.sub(r" \{tt\.divisibility = \d+ : i32\}", "", t)
    t = re.sub(r"%[\w.]+", "%v", t)
    return [line.strip() for line in t.splitlines() if line.strip()]


def _vector_loads(cubin: bytes) -> int:
    """Vector global loads (LDG.E.64/.128) in the SASS, from cuobjdump (CUDA's own disassembler)."""
    import shutil
    import subprocess
    import tempfile

    import os

    bundled = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    tool = bundled if os.path.exists(bundled) else shutil.which("cuobjdump")
    if tool is None:
        pytest.skip("no cuobjdump (Triton's NVIDIA backend or the CUDA toolkit)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        sass = subprocess.run([tool, "-sass", f.name], capture_output=True, text=True, check=True).stdout
    return len(re.findall(r"LDG\.E\.(?:64|128)", sass))


def test_kernels_with_asynchronous_copies_get_the_plain_generic_compile():
    """Async copies into shared memory fix their width before lowering: hints cannot be kept safely."""
    from nojit.aot.runtimes.triton.compiler import _WIDTH_FIXED_OPS, compile_key, offline_driver
    from tests.support.triton_test_kernels import tile_matmul

    runtime = (True, True, True, True, False)
    spec = (("*fp32", "D"), ("*bf16", "D"), ("*bf16", "D"), ("i32", "D"), ("constexpr", ("int", 64)))
    with offline_driver():
        exact = compile_key(tile_matmul, (spec, ()), True)
        hinted = compile_key(tile_matmul, (layout_spec(spec, runtime), ()), False)
        plain = compile_key(tile_matmul, (generic_spec(spec, runtime), ()), False)
    assert _WIDTH_FIXED_OPS.search(exact.ttgir)
    assert not _WIDTH_FIXED_OPS.search(hinted.ttgir)
    assert _normalized(hinted.ttgir) == _normalized(plain.ttgir) and hinted.cubin == plain.cubin


def test_a_plan_emitted_with_generic_entries_built_with_no_generic_compiles_exact_keys_only(tmp_path):
    """`nojit build --from-plan P --no-generic` must not take the plan's generic requests along (the
    replace-under-load check builds its second, different bundle this way)."""
    from nojit.aot.build import BuildOptions, _read_plan
    from nojit.aot.plan import Plan, PlanKernel, PlanRequest

    plan = Plan("d", None, {"m:k": PlanKernel("triton", "0" * 64, ["a"], {})},
                [PlanRequest(kernel="m:k", key={"a": 1}, variant="exact", origin="t"),
                 PlanRequest(kernel="m:k", key={"a": 1}, variant="generic", origin="t")])
    path = str(tmp_path / "plan.json")
    plan.write(path)
    for generic, want in ((True, {"exact", "generic"}), (False, {"exact"})):
        got = _read_plan(BuildOptions(output="x", plan_in=path, generic=generic))
        assert {r.variant for r in got.requests} == want
