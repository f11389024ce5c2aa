"""Compile one TileLang variant for sm_90a without a GPU and capture everything a loader needs.

The compile is TileLang's own: ``jit_impl.compile(**kwargs)`` on vLLM's ``JITImpl`` (so vLLM's
pass configs and TileLang's pipeline apply), under an explicit sm_90a target and with TileLang's
disk cache off (no host ``.so`` export, hence no g++ beyond nvcc's own host preprocessing). Two
observation points are added, both inside TileLang's module namespaces and restored afterwards:

* ``tilelang.contrib.nvcc.compile_cuda`` still runs TileLang's own nvcc command, in a
  content-addressed folder under ``workdir`` instead of a random temp dir. By default ``-lineinfo``
  is dropped from that command: its DWARF line table embeds the source folder, the working
  directory, the install paths of the included headers and the mtimes of every file (TileLang's
  headers carry the venv's install time), so with it a cubin is only reproducible inside one
  installed environment and workdir. Without it the cubin depends on (source, flags, nvcc) only;
  the SASS (``.text``) is identical either way and the cubin is about 3x smaller.
  ``lineinfo=True`` keeps TileLang's exact command and pins the source file's mtime instead.
* ``tilelang.engine.lower.host_codegen`` is wrapped to keep the lowered host IR: its packed call of
  the device kernel is where TVM's device parameter order, the dynamic-variable sources and the
  launch dimensions are decided, so the launch schema is read from there, not assumed.

Runs in a spawn worker: a top-level function, plain picklable data in and out. The worker must
have called ``install_deployment_platform(facts)`` first.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from nojit.aot.runtimes.tilelang.enumeration import TileLangCall, kernel_module, resolve
from nojit.aot.errors import BuildError
from nojit.aot.target import TARGET
from nojit.loader.bundle.manifest import TileLangLaunch
from nojit.loader.settings import scope

TILELANG_TARGET: dict[str, str] = {"kind": TARGET.backend, "arch": TARGET.arch}

Expr = Any  # int | {"var": str} | {"op": str, "args": [Expr, Expr]}

_OPS = {"Add": "+", "Sub": "-", "Mul": "*", "FloorDiv": "//", "FloorMod": "%", "Min": "min", "Max": "max",
        # Truncating forms: launch/shape values are non-negative, where they equal the floor forms.
        "Div": "//", "Mod": "%"}
_K_ARR_DATA, _K_ARR_SHAPE, _K_ARG_VALUE = 1, 2, 15  # TVM builtin::TVMStructFieldKind values used by host code


@dataclass(frozen=True)
class CompiledTileLangVariant:
    """A compiled variant: the sm_90a cubin, how to launch it (the bundle format's TileLangLaunch), and what the
    build recorded about the compile."""

    variant_id: str
    kernel: str
    key: tuple[Any, ...]
    cubin: bytes
    launch: TileLangLaunch
    cuda_source: str = field(repr=False)
    compile_record: dict[str, Any] = field(repr=False)


# ----------------------------------------------------------------------------- nvcc at a fixed path


class _FixedDir:
    """Stands in for TVM's random ``utils.tempdir()`` result inside ``compile_cuda``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def relpath(self, name: str) -> str:
        return os.path.join(self.path, name)


class _UtilsInDir:
    """``tvm.contrib.utils`` as seen by ``tilelang.contrib.nvcc``, with ``tempdir()`` fixed to one folder."""

    def __init__(self, utils: Any, path: str) -> None:
        self._utils, self._path = utils, path

    def tempdir(self, custom_path: str | None = None, keep_for_debug: bool | None = None) -> _FixedDir:
        return _FixedDir(self._path)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._utils, name)


class _SubprocessInDir:
    """``subprocess`` as seen by ``tilelang.contrib.nvcc``: records argv, runs it in a fixed cwd."""

    def __init__(self, cwd: str, lineinfo: bool, commands: list[tuple[list[str], list[str]]]) -> None:
        self._cwd, self._lineinfo, self._commands = cwd, lineinfo, commands

    def Popen(self, cmd: list[str], *args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:  # noqa: N802
        run = list(cmd) if self._lineinfo else [a for a in cmd if a != "-lineinfo"]
        self._commands.append((list(cmd), run))
        if cmd[-1].endswith(".cu"):
            os.utime(cmd[-1], (0, 0))  # the source; its mtime lands in the line table with -lineinfo
        return subprocess.Popen(run, *args, cwd=self._cwd, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


@dataclass
class _NvccRun:
    code: str
    tilelang_command: list[str]
    command: list[str]
    cwd: str
    cubin: bytes


@contextlib.contextmanager
def _nvcc_at_fixed_path(workdir: str, lineinfo: bool) -> Iterator[list[_NvccRun]]:
    """Route TileLang's ``nvcc.compile_cuda`` through a content-addressed folder under ``workdir``."""
    from tilelang.contrib import nvcc

    runs: list[_NvccRun] = []
    original = nvcc.compile_cuda

    def compile_cuda(code: str, target_format: str = "ptx", arch: Any = None, options: Any = None,
                     path_target: str | None = None, verbose: bool = False) -> bytearray:
        content = json.dumps([code, target_format, arch, options, lineinfo]).encode()
        digest = hashlib.sha256(content).hexdigest()[:32]
        folder = os.path.join(os.path.abspath(workdir), "tilelang-nvcc", digest)
        os.makedirs(folder, exist_ok=True)
        commands: list[tuple[list[str], list[str]]] = []
        with open(os.path.join(folder, ".lock"), "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            saved = nvcc.utils, nvcc.subprocess
            nvcc.utils = _UtilsInDir(saved[0], folder)
            nvcc.subprocess = _SubprocessInDir(folder, lineinfo, commands)
            try:
                data = original(code, target_format, arch, options=options, path_target=path_target,
                                verbose=verbose)
            finally:
                nvcc.utils, nvcc.subprocess = saved
        if len(commands) != 1:
            raise BuildError(f"expected one nvcc invocation, saw {commands}")
        runs.append(_NvccRun(code, commands[0][0], commands[0][1], folder, bytes(data)))
        return data

    nvcc.compile_cuda = compile_cuda
    try:
        yield runs
    finally:
        nvcc.compile_cuda = original


def nvcc_version() -> str:
    """The version of the nvcc TileLang compiles with (what the compile record says), found as TileLang finds it."""
    from tilelang.contrib.nvcc import get_nvcc_compiler

    return _nvcc_version(get_nvcc_compiler())


@functools.cache
def _nvcc_version(nvcc_path: str) -> str:
    out = subprocess.run([nvcc_path, "--version"], capture_output=True, text=True, check=True).stdout
    release = re.search(r"release [\d.]+, (V[\d.]+)", out)
    build = re.search(r"^Build (\S+)", out, re.M)
    if release is None:
        raise BuildError(f"cannot read the nvcc version from: {out!r}")
    return f"{release.group(1)} ({build.group(1) if build else 'unknown build'})"


def _flags(command: list[str], folder: str) -> list[str]:
    """TileLang's nvcc argv without the compiler path, the output option and the source file."""
    flags, skip = [], False
    for i, arg in enumerate(command[1:], start=1):
        if skip:
            skip = False
        elif arg == "-o":
            skip = True
        elif not (i == len(command) - 1 and arg.startswith(folder)):
            flags.append(arg)
    return flags


def _check_cubin(cubin: bytes) -> None:
    """An sm_90 CUDA ELF (EM_CUDA = 190), i.e. SASS, not PTX or a fatbin."""
    if cubin[:4] != b"\x7fELF" or int.from_bytes(cubin[18:20], "little") != 190:
        raise BuildError("nvcc output is not a CUDA ELF cubin")
    e_flags = int.from_bytes(cubin[48:52], "little")
    if (e_flags >> 8) & 0xFF != 90:
        raise BuildError(f"cubin is not for sm_90 (e_flags {e_flags:#x})")


# ----------------------------------------------------------------------------- host IR capture


@contextlib.contextmanager
def _capturing_host_ir() -> Iterator[list[Any]]:
    """Keep the lowered host IRModule that TileLang hands to host code generation."""
    import tilelang.engine.lower  # noqa: F401  (the package re-exports a function of the same name)

    lower_mod = sys.modules["tilelang.engine.lower"]
    captured: list[Any] = []
    original = lower_mod.host_codegen

    def host_codegen(host_mod: Any, target_host: Any, target: Any = None) -> Any:
        captured.append(host_mod)
        return original(host_mod, target_host, target=target)

    lower_mod.host_codegen = host_codegen
    try:
        yield captured
    finally:
        lower_mod.host_codegen = original


# ----------------------------------------------------------------------------- launch schema


def _expr(e: Any) -> Expr:
    from tvm import tirx

    if isinstance(e, int):
        return e
    if isinstance(e, tirx.IntImm):
        return int(e.value)
    if isinstance(e, tirx.Var):
        return {"var": e.name}
    if isinstance(e, tirx.Cast) and str(e.dtype) in ("int32", "int64"):
        return _expr(e.value)
    op = _OPS.get(type(e).__name__)
    if op is None:
        raise BuildError(f"launch/shape expression {e} ({type(e).__name__}) is not supported by the plan format")
    return {"op": op, "args": [_expr(e.a), _expr(e.b)]}


class _HostIR:
    """The bindings and the kernel call of the lowered host function."""

    def __init__(self, host_mod: Any, symbol: str) -> None:
        from tvm import tirx

        funcs = list(host_mod.functions.values())
        if len(funcs) != 1:
            raise BuildError(f"expected one host function, found {len(funcs)}")
        self.func = funcs[0]
        self.binds: dict[Any, Any] = {}
        calls: list[Any] = []

        def visit(node: Any) -> None:
            if isinstance(node, tirx.Bind):
                self.binds[node.var] = node.value
            elif isinstance(node, tirx.Call) and node.op.name == "tirx.tvm_call_packed":
                if isinstance(node.args[0], tirx.StringImm) and node.args[0].value == symbol:
                    calls.append(node)

        tirx.stmt_functor.post_order_visit(self.func.body, visit)
        if len(calls) != 1:
            raise BuildError(f"expected one host launch of {symbol}, found {len(calls)}")
        self.call_args = list(calls[0].args[1:])
        self.packed_args = self.func.params[1]  # (self_handle, args, num_args, result)

    def _struct_get(self, value: Any, field_kind: int) -> Any:
        """``tvm_struct_get(x, 0, field_kind, ...)`` -> x, else None."""
        from tvm import tirx

        if isinstance(value, tirx.Call) and value.op.name == "tirx.tvm_struct_get":
            if int(value.args[2].value) == field_kind:
                return value.args[0]
        return None

    def packed_index(self, handle: Any) -> int:
        """Which packed argument a tensor handle var was read from (``tvm_struct_get(args, i, kTVMValue)``)."""
        from tvm import tirx

        found: list[int] = []

        def visit(node: Any) -> None:
            if isinstance(node, tirx.Call) and node.op.name == "tirx.tvm_struct_get":
                if node.args[0].same_as(self.packed_args) and int(node.args[2].value) == _K_ARG_VALUE:
                    found.append(int(node.args[1].value))

        tirx.stmt_functor.post_order_visit(self.binds[handle], visit)
        if len(set(found)) != 1:
            raise BuildError(f"cannot tell which packed argument {handle} comes from")
        return found[0]

    def tensor_of_data(self, arg: Any) -> int:
        handle = self._struct_get(self.binds.get(arg), _K_ARR_DATA)
        if handle is None:
            raise BuildError(f"device argument {arg} is not a tensor data pointer: {self.binds.get(arg)}")
        return self.packed_index(handle)

    def shape_source(self, var: Any) -> tuple[int, int]:
        """A dynamic var bound as ``Cast(int32, <tensor>.shape[dim])`` -> (packed index, dim)."""
        from tvm import tirx

        value = self.binds.get(var)
        load = value.value if isinstance(value, tirx.Cast) else value
        if not isinstance(load, tirx.BufferLoad) or len(load.indices) != 1:
            raise BuildError(f"dynamic var {var} is not read from a tensor shape: {value}")
        handle = self._struct_get(self.binds.get(load.buffer.data), _K_ARR_SHAPE)
        if handle is None:
            raise BuildError(f"dynamic var {var} is not read from a tensor shape: {value}")
        return self.packed_index(handle), int(load.indices[0])


def _vars_in(e: Any) -> list[Any]:
    from tvm import tirx

    found: list[Any] = []
    tirx.stmt_functor.post_order_visit(e, lambda n: found.append(n) if isinstance(n, tirx.Var) else None)
    return found


def _launch_schema(prim_func: Any, host_mod: Any, device_mod: Any) -> dict[str, Any]:
    """Read parameters, dynamic vars and launch configuration from the lowered program: TileLangLaunch's fields
    but its tensor parameters (`_tensor_params`)."""
    devices = list(device_mod.functions.items())
    if len(devices) != 1:
        raise BuildError(f"expected one device kernel, found {len(devices)}")
    gvar, dev = devices[0]
    attrs = dev.attrs
    if str(attrs["target"].attrs.get("arch")) != TILELANG_TARGET["arch"]:
        raise BuildError(f"device kernel lowered for {attrs['target']}, not {TARGET}")
    symbol = str(attrs.get("global_symbol", gvar.name_hint))
    host = _HostIR(host_mod, symbol)
    n_dev = len(dev.params)
    launch_names = [str(n) for n in attrs["tirx.kernel_launch_params"]]
    if len(host.call_args) != n_dev + len(launch_names):
        raise BuildError(f"host launch of {symbol} has {len(host.call_args)} args, "
                         f"expected {n_dev} + {len(launch_names)}")
    tensor_names = [prim_func.buffer_map[p].name if p in prim_func.buffer_map else None for p in prim_func.params]

    dynamic_vars: dict[str, dict[str, Any]] = {}

    def dynamic(var: Any) -> dict[str, Any]:
        if var.name not in dynamic_vars:
            index, dim = host.shape_source(var)
            if tensor_names[index] is None:
                raise BuildError(f"dynamic var {var.name} read from non-tensor argument {index}")
            dynamic_vars[var.name] = {"param": tensor_names[index], "dim": dim}
        return dynamic_vars[var.name]

    params: list[dict[str, Any]] = []
    for dev_param, arg in zip(dev.params, host.call_args[:n_dev]):
        if str(dev_param.dtype) == "handle":
            index = host.tensor_of_data(arg)
            buf = prim_func.buffer_map[prim_func.params[index]]
            if not buf.data.same_as(arg):
                raise BuildError(f"device arg {arg} resolved to {buf.name} but is not that buffer's data")
            params.append({"kind": "tensor", "name": buf.name, "dtype": str(buf.dtype)})
        else:
            from tvm import tirx

            if not isinstance(arg, tirx.Var):
                raise BuildError(f"scalar device argument {arg} is not a variable")
            dynamic(arg)  # where the launch reads it
            params.append({"kind": "scalar", "name": arg.name, "ctype": str(dev_param.dtype)})

    launch = dict(zip(launch_names, host.call_args[n_dev:]))
    for value in launch.values():
        for var in _vars_in(value):
            dynamic(var)
    grid = tuple(_expr(launch.get(f"blockIdx.{a}", 1)) for a in "xyz")
    block = tuple(_expr(launch.get(f"threadIdx.{a}", 1)) for a in "xyz")
    smem = _expr(launch.get("tirx.use_dyn_shared_memory", 0))
    if not isinstance(smem, int):
        raise BuildError(f"dynamic shared memory of {symbol} is not a constant: {smem}")

    # Cross-checks against the device function's own attributes.
    extent = {str(k): _expr(v) for k, v in attrs.get("thread_extent", {}).items()}
    for axis, value in zip("xyz", grid):
        if extent.get(f"blockIdx.{axis}", 1) != value:
            raise BuildError(f"{symbol}: host grid {grid} disagrees with thread_extent {extent}")
    for axis, value in zip("xyz", block):
        if extent.get(f"threadIdx.{axis}", 1) != value:
            raise BuildError(f"{symbol}: host block {block} disagrees with thread_extent {extent}")
    if smem != int(attrs.get("dyn_shared_memory_buf", 0)):
        raise BuildError(f"{symbol}: host smem {smem} disagrees with dyn_shared_memory_buf")
    cluster = attrs.get("cluster_dims")
    return {
        "symbol": symbol, "params": tuple(params), "dynamic_vars": dynamic_vars, "grid": grid, "block": block,
        "dynamic_smem": smem,
        "pdl": bool(int(attrs.get("has_cuda_pdl_sync", 0)) or int(attrs.get("has_cuda_pdl_trigger", 0))),
        "cluster_dims": tuple(int(c) for c in cluster) or None if cluster is not None else None,
        "cooperative": bool(attrs.get("use_cooperative_groups", False)),
    }


def _tensor_params(jit_impl: Any, prim_func: Any, used: set[str]) -> tuple[dict[str, Any], ...]:
    """All tensor parameters of the Python kernel function, in its signature order."""
    by_name = {prim_func.buffer_map[p].name: prim_func.buffer_map[p] for p in prim_func.params if p in prim_func.buffer_map}
    out = []
    for position, name in enumerate(jit_impl.signature.parameters):
        if name not in jit_impl.func.tensor_args:
            continue
        if name not in by_name:
            raise BuildError(f"tensor parameter {name} is missing from the lowered TileLang function")
        buf = by_name[name]
        out.append({"name": name, "position": position, "dtype": str(buf.dtype),
                    "shape": [_expr(d) for d in buf.shape],
                    # What TileLang's host code checks (it skips the stride of a size-1 dim); None = compact.
                    "strides": [_expr(d) for d in buf.strides] or None, "used_by_kernel": name in used})
    return tuple(out)


# ----------------------------------------------------------------------------- entry point


def compile_variant(variant: TileLangCall, workdir: str, *, lineinfo: bool = False) -> CompiledTileLangVariant:
    """Compile ``variant`` for sm_90a with vLLM's TileLang settings; see the module docstring for ``lineinfo``."""
    kernel_module()  # the platform is installed and vLLM's kernel module saw it
    import tilelang
    import tvm
    from vllm.tilelang_utils import _get_pass_configs

    jit_impl = resolve(variant.kernel)
    if jit_impl.pass_configs != _get_pass_configs():
        raise BuildError(f"{variant.kernel} carries pass configs {jit_impl.pass_configs}, "
                         f"vllm.tilelang_utils passes {_get_pass_configs()}")
    target_json = json.dumps(TILELANG_TARGET)
    with (
        scope(TILELANG_DISABLE_CACHE="1", TILELANG_DEFAULT_TARGET=target_json),
        tvm.target.Target(TILELANG_TARGET),
        _nvcc_at_fixed_path(workdir, lineinfo) as nvcc_runs,
        _capturing_host_ir() as host_mods,
    ):
        kernel = jit_impl.compile(**variant.kwargs)
    if jit_impl.func.parse_args(**variant.kwargs)[0] != variant.key:
        raise BuildError(f"{variant.variant_id}: TileLang now keys this call differently from the enumeration")
    if kernel.execution_backend != "tvm_ffi" or len(nvcc_runs) != 1 or len(host_mods) != 1:
        raise BuildError(f"{variant.variant_id}: unexpected compile path (backend {kernel.execution_backend}, "
                         f"{len(nvcc_runs)} nvcc runs, {len(host_mods)} host modules)")
    run = nvcc_runs[0]
    _check_cubin(run.cubin)
    schema = _launch_schema(kernel.prim_func, host_mods[0], kernel.artifact.device_mod)
    if 'extern "C" __global__' not in run.code or schema["symbol"] not in run.code:
        raise BuildError(f"{variant.variant_id}: {schema['symbol']} is not an extern C kernel of the source")
    used = {p["name"] for p in schema["params"] if p["kind"] == "tensor"}
    record = {
        "nvcc": run.command[0],
        "nvcc_version": _nvcc_version(run.command[0]),
        "flags": _flags(run.command, run.cwd),
        "tilelang_flags": _flags(run.tilelang_command, run.cwd),
        "arch": TILELANG_TARGET["arch"],
        "cwd": os.path.relpath(run.cwd, os.path.abspath(workdir)),  # relative: independent of workdir
        "source_sha256": hashlib.sha256(run.code.encode()).hexdigest(),
        "cubin_sha256": hashlib.sha256(run.cubin).hexdigest(),
        "target": str(kernel.target),
        "pass_configs": {str(getattr(k, "value", k)): v for k, v in jit_impl.pass_configs.items()},
        "execution_backend": kernel.execution_backend,
        "tilelang_version": tilelang.__version__,
    }
    launch = TileLangLaunch(tensor_params=_tensor_params(jit_impl, kernel.prim_func, used), **schema)
    return CompiledTileLangVariant(variant_id=variant.variant_id, kernel=variant.kernel, key=variant.key,
                                   cubin=run.cubin, launch=launch, cuda_source=run.code, compile_record=record)
