"""Compile one Triton key to an sm_90 cubin on a machine with no GPU, the way the JIT would.

Triton's JIT goes binder -> `_pack_args` -> `ASTSource` -> `triton.compile`. The build
uses those same functions of the installed Triton (3.6 and 3.8 differ in `_pack_args`
details that change the compile hash), with the target stated instead of read from a
driver. The result carries everything the loader's launcher needs, and the parameter
layout is checked against the PTX prototype the compiler itself emitted.

Generic entries are compiled from a spec whose 'D' marks are layout hints
only (see `layout_spec` in nojit.loader.bundle.triton_key): Triton chooses its layouts with them,
as the JIT does for a call with that divisibility, and they are then removed from the
kernel's signature before lowering, so the code assumes no alignment or divisibility.
Same layouts mean each thread holds the same elements and reduces them in the same order,
which is what makes a generic entry bit-identical to the JIT on such a call.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from nojit.aot.errors import BuildError
from nojit.aot.target import TARGET
from nojit.loader.bundle.manifest import TRITON_TYPE_CODES, TritonLaunch
from nojit.loader.bundle.key_values import untag
from nojit.loader.bundle.triton_key import Key, from_triton_specialization, options_key, with_implicit_options


_TYPE_CODES = TRITON_TYPE_CODES  # one table: the manifest's schema checks launches against the same codes
_CODE_BYTES = {"p": 8, "l": 8, "L": 8, "d": 8, "i": 4, "u": 4, "f": 4, "h": 2, "H": 2, "e": 2, "b": 2, "c": 1}
_PTX_BYTES = {"64": 8, "32": 4, "16": 2, "8": 1}


def gpu_target() -> Any:
    from triton.backends.compiler import GPUTarget

    return GPUTarget(TARGET.backend, TARGET.capability, TARGET.warp_size)


class OfflineDriver:
    """Answers the device questions Triton's JIT front end asks, for a build with no GPU.

    Only `get_current_device`/`get_current_target` are consulted while deriving keys
    (vLLM's own key deriver and `JITFunction.device_caches`); anything that would need a
    real device raises.
    """

    def __init__(self) -> None:
        self.target = gpu_target()

    def is_active(self) -> bool:
        return True

    def get_current_target(self) -> Any:
        return self.target

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_active_torch_device(self) -> Any:
        import torch

        return torch.device("cpu")

    def __getattr__(self, name: str) -> Any:
        raise BuildError(
            f"the build touched Triton's driver ({name}); compiling must not need a GPU",
            fix="this is a nojit bug: report the kernel being enumerated",
        )


def install_offline_driver() -> None:
    """For a build worker process: the offline driver stays until the process ends."""
    from triton.runtime import driver

    driver.set_active(OfflineDriver())


@contextlib.contextmanager
def offline_driver() -> Iterator[None]:
    """The offline driver for one in-process planning step; Triton's previous driver is put back after it, so a
    process that plans and then serves (tests, `nojit tune`) never meets the build's driver at serving time."""
    from triton.runtime import driver

    previous = driver._active
    driver.set_active(OfflineDriver())
    try:
        yield
    finally:
        driver._active = previous


def ptx_param_bytes(ptx: str, symbol: str) -> list[int]:
    """Byte size of each parameter of `.entry symbol(...)` in the PTX Triton produced."""
    m = re.search(r"\.entry\s+" + re.escape(symbol) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise BuildError(f"no .entry {symbol} in the PTX", fix="this is a nojit bug: report the kernel")
    sizes = []
    for decl in re.findall(r"\.param\s+([^,]*?)(?:,|$)", m.group(1), re.S):
        t = re.search(r"\.[usbf](64|32|16|8)\b", decl)
        if t is None:
            raise BuildError(f"unparsed PTX parameter {decl!r} of {symbol}", fix="this is a nojit bug")
        array = re.search(r"\[(\d+)\]", decl)
        sizes.append(_PTX_BYTES[t.group(1)] * (int(array.group(1)) if array else 1))
    return sizes


def to_triton_specialization(spec: tuple) -> list[tuple[Any, Any]]:
    """Our key's spec -> the specialization list Triton's `_pack_args` takes."""
    out = []
    for ty, attr in spec:
        if ty == "constexpr":
            out.append(("constexpr", untag(attr)))
        elif attr is None or isinstance(attr, str):
            out.append((ty, attr))
        else:
            out.append((ty, attr[1]))
    return out


@dataclass(frozen=True)
class CompiledTriton:
    cubin: bytes
    launch: TritonLaunch
    ptxas_version: str
    ttgir: str = ""  # the TTGIR lowered (for inspection and tests; not bundled)


# Ops whose lowering fixes a memory access width chosen before lowering (asynchronous copies
# into shared memory, TMA): a layout-hinted generic compile is not safe for these.
_WIDTH_FIXED_OPS = re.compile(r"\b(ttg\.async_copy\w*|ttng\.async_tma\w*|ttng\.tensormap\w*|tt\.descriptor\w*|"
                              r"tt\.make_tensor_descriptor|ttng\.tma\w*)\b")
_ARG_DIVISIBILITY = re.compile(r" \{tt\.divisibility = \d+ : i32\}")


def strip_signature_divisibility(ttgir: str) -> str:
    """The kernel's TTGIR with the divisibility assumptions on its parameters removed.

    Only the `tt.func` signature is touched: `tl.multiple_of` hints inside the body are the
    kernel author's promise and stay.
    """
    lines = ttgir.splitlines(keepends=True)
    for i, line in enumerate(lines):
        if line.lstrip().startswith("tt.func public"):
            lines[i] = _ARG_DIVISIBILITY.sub("", line)
            if "tt.divisibility" in lines[i]:
                raise BuildError("a TTGIR kernel signature kept a divisibility assumption",
                                 fix="this Triton prints signatures differently: report the Triton version")
            return "".join(lines)
    raise BuildError("no public tt.func in the TTGIR", fix="report the kernel and Triton version to nojit")


def _ast_compile(fn: Any, specialization: list, options_items: Any, target: Any, backend: Any) -> tuple[Any, dict]:
    """What the JIT does for a call with this specialization: `_pack_args`, ASTSource, compile.
    Returns the compiled kernel and the options it was compiled with."""
    import triton
    from triton.compiler import ASTSource

    kwargs = {name: untag(tagged) for name, tagged in options_items}
    bound_args = {p.name: (v if t == "constexpr" else None) for p, (t, v) in zip(fn.params, specialization)}
    packed, signature, constexprs, attrs = fn._pack_args(backend, dict(kwargs), bound_args, specialization, kwargs)
    options = packed.__dict__
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=target, options=options), options


def compile_key(fn: Any, key: Key, divisibility_assumed: bool = True) -> CompiledTriton:
    """Compile `fn` for exactly this key, for sm_90, through the installed Triton.

    With divisibility_assumed=False (generic entries) the key's 'D' marks steer layouts only
    and the cubin is correct for any alignment (see the module docstring).
    """
    from triton.compiler import make_backend

    target = gpu_target()
    backend = make_backend(target)
    spec, options_items = key
    if len(spec) != len(fn.params):
        raise BuildError(
            f"key for {fn.__module__}:{fn.__qualname__} has {len(spec)} parameters, the kernel has {len(fn.params)}",
            fix="the recorded key is from another version of this kernel: record it again",
        )
    specialization = to_triton_specialization(spec)
    compiled, options = _ast_compile(fn, specialization, options_items, target, backend)
    if not divisibility_assumed and any(attr == "D" for _ty, attr in specialization):
        if _WIDTH_FIXED_OPS.search(compiled.asm["ttgir"]):
            # Access widths get fixed before lowering: keep nothing of the hints (Triton's plain compile).
            plain = [(ty, "" if attr == "D" else attr) for ty, attr in specialization]
            compiled, _ = _ast_compile(fn, plain, options_items, target, backend)
        else:
            compiled = _lower_without_divisibility(compiled, target, options)
    md = compiled.metadata
    if getattr(md, "tensordesc_meta", None):
        raise BuildError(f"{fn.__qualname__}: tensor-descriptor (TMA) arguments are not supported yet",
                         fix="leave this kernel out of the bundle")
    args = []
    for index, (ty, _attr) in enumerate(specialization):
        if ty == "constexpr":
            continue
        if ty.startswith("*"):
            args.append((index, "p"))
        elif ty in _TYPE_CODES:
            args.append((index, _TYPE_CODES[ty]))
        else:
            raise BuildError(f"{fn.__qualname__}: parameter type {ty!r} is not supported by the launcher",
                             fix="leave this kernel out of the bundle")
    symbol = md.name
    expected = [_CODE_BYTES[c] for _, c in args] + [8, 8]  # + global and profile scratch pointers
    found = ptx_param_bytes(compiled.asm["ptx"], symbol)
    if found != expected:
        raise BuildError(
            f"{fn.__qualname__}: parameter layout {expected} does not match the compiled PTX {found}",
            fix="this Triton's launch ABI differs from what nojit supports: report the Triton version",
        )
    cluster = tuple(getattr(md, "cluster_dims", None) or (1, 1, 1))
    launch = TritonLaunch(
        symbol=symbol,
        num_warps=int(md.num_warps),
        num_ctas=int(md.num_ctas),
        cluster_dims=(int(cluster[0]), int(cluster[1]), int(cluster[2])) if len(cluster) == 3 else (1, 1, 1),
        shared=int(md.shared),
        global_scratch_size=int(md.global_scratch_size),
        global_scratch_align=max(1, int(md.global_scratch_align)),
        profile_scratch_size=int(getattr(md, "profile_scratch_size", 0)),
        profile_scratch_align=max(1, int(getattr(md, "profile_scratch_align", 1))),
        launch_pdl=bool(getattr(md, "launch_pdl", False)),
        launch_cooperative_grid=bool(getattr(md, "launch_cooperative_grid", False)),
        args=tuple(args),
        compile_hash=str(compiled.hash),
    )
    return CompiledTriton(bytes(compiled.asm["cubin"]), launch, ptxas_version(), str(compiled.asm.get("ttgir", "")))


def _lower_without_divisibility(hinted: Any, target: Any, options: dict[str, Any]) -> Any:
    """Lower the hinted compile's TTGIR again, its signature's divisibility removed."""
    import os
    import tempfile

    import triton

    with tempfile.TemporaryDirectory(prefix="nojit-ttgir-") as tmp:
        path = os.path.join(tmp, f"{hinted.metadata.name}.ttgir")
        with open(path, "w") as f:
            f.write(strip_signature_divisibility(hinted.asm["ttgir"]))
        return triton.compile(path, target=target, options=options)


_ptxas: str | None = None


def ptxas_version() -> str:
    """The ptxas Triton compiles with (part of its cache hash and of the bundle's provenance)."""
    global _ptxas
    if _ptxas is None:
        from triton.backends.nvidia.compiler import get_ptxas_version

        text = str(get_ptxas_version(TARGET.capability))
        m = re.search(r"V(\d+\.\d+\.\d+)", text) or re.search(r"release (\d+\.\d+)", text)
        _ptxas = m.group(1) if m else text.strip().splitlines()[-1]
    return _ptxas


def key_for_call(fn: Any, args: tuple, kwargs: dict, backend: Any = None) -> Key:
    """The key Triton's own binder computes for a call (ground truth for the build and tests)."""
    import triton
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature

    backend = backend or make_backend(gpu_target())
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = with_implicit_options(kwargs, fn.debug, triton.knobs.runtime.debug, triton.knobs.compilation.instrumentation_mode)
    _bound, specialization, options = binder(*args, **kwargs)
    return (from_triton_specialization(specialization), options_key(options))
