"""Triton's serving face: a bundle server on each bundled `JITFunction` (its `run`, this kernel only)."""

from __future__ import annotations

import sys

from nojit.loader.errors import BundleMismatchError
from nojit.loader.faces import Handle, InstallContext, ProcessJit, Runtime
from nojit.loader.resolve import jit_function_of
from nojit.loader.settings import settings


def install(ctx: InstallContext) -> Handle:
    import triton
    from triton._utils import canonicalize_ptr_dtype

    from nojit.loader.bundle.triton_key import ArgSpecializer
    from nojit.loader.runtimes.triton.serving import TritonKernelServer

    try:
        import torch

        tensor_cls: type | None = torch.Tensor
    except ImportError:  # pragma: no cover
        tensor_cls = None
    specializer = ArgSpecializer(canonicalize_ptr_dtype, tensor_cls)
    knobs = triton.knobs
    debug = bool(knobs.runtime.debug)
    instrumentation_mode = knobs.compilation.instrumentation_mode
    bundle = ctx.bundle
    servers: dict[str, TritonKernelServer] = {}
    for kid in ctx.kernel_ids:
        fn = jit_function_of(ctx.resolve(kid))
        if fn is None:
            raise BundleMismatchError(
                f"kernel {kid} is not a Triton JITFunction in this process",
                fix="vLLM replaced Triton with a placeholder (no GPU driver?) or the kernel changed; "
                "rebuild the bundle against the installed vLLM",
            )
        # Source check, section and tables: at the kernel's first use (TritonKernelServer.prepare); in a vLLM
        # worker that is the warmup registry's preflight, then preload() for every kernel, before serving.
        server = TritonKernelServer(fn, bundle.index.kernels[kid], bundle, ctx.policy, specializer, debug,
                                    instrumentation_mode, fast_path=settings.fast_path, allow=ctx.allow,
                                    differences=ctx.differences)
        fn.run = server.entry_point  # instance attribute: shadows JITFunction.run for this kernel only
        servers[kid] = server
    return Handle(servers, undo=lambda: _uninstall(servers), checked_at_first_use=True)


def _uninstall(servers: dict) -> None:
    from nojit.loader.runtimes.triton.fast import restore_getitem

    for server in servers.values():
        server.fn.__dict__.pop("run", None)
        restore_getitem(server.fn)  # its own class back (kernel[grid] bound in C)


def restore() -> None:
    """vLLM's Triton driver hook back (vllm_registry puts it on, outside install)."""
    if "triton" in sys.modules:
        from nojit.loader.runtimes.triton import driver

        driver.restore()


RUNTIME = Runtime(
    name="triton",
    display="Triton",
    install=install,
    jits=(ProcessJit("Triton (vLLM's kernels)", "triton", "triton",
                     "attention metadata, compressor, indexer, sampling, spec decode"),),
    guards=("triton",),
    restore=restore,
)
