"""Triton's serving face: a bundle server on each bundled `JITFunction` (its `run`, this kernel only)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from nojit.loader.errors import BundleMismatchError
from nojit.loader.faces import Handle, InstallContext, ProcessJit, Runtime
from nojit.loader.resolve import jit_function_of
from nojit.loader.runtimes.triton.autotune import AutotunedKernel, find_autotuner
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
    autotuned: dict[str, AutotunedKernel] = {}
    for kid in ctx.kernel_ids:
        obj = ctx.resolve(kid)
        fn = jit_function_of(obj)
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
        record = bundle.index.kernels[kid].autotune
        if record is not None:  # Triton's Autotuner chooses among the bundle's configs (autotune.py)
            autotuner = find_autotuner(obj)
            if autotuner is None:
                _uninstall(servers, autotuned)
                raise BundleMismatchError(
                    f"{bundle.path}: kernel {kid} was autotuned when the bundle was built; in this process it has "
                    "no (single) Triton Autotuner", fix="rebuild the bundle against the installed vLLM")
            try:
                autotuned[kid] = AutotunedKernel(kid, autotuner, record, ctx.policy, bundle.index.kernels[kid].source_hash,
                                                 bundle.path)
            except BaseException:
                _uninstall(servers, autotuned)
                raise
    if servers:
        # Triton's driver questions answered without building Triton's `cuda_utils` with gcc: bundled kernels launch
        # through nojit's launcher, but their hosts still ask the driver (FLA's shared-memory size, an Autotuner's
        # benchmarker, vLLM's key deriver). Here, not only in the plugin, so that every way of installing serves
        # the same process (the Qwen3.5 call-site check called install() alone and saw gcc run on the H200)
        from nojit.loader.runtimes.triton.driver import answer_from_torch

        answer_from_torch()
    return Handle(servers, state=TritonServing(autotuned), undo=lambda: _uninstall(servers, autotuned),
                  checked_at_first_use=True)


@dataclass
class TritonServing:
    """The Triton room's own record: the autotuned kernels (kernel id -> AutotunedKernel)."""

    autotuned: dict[str, AutotunedKernel] = field(default_factory=dict)

    def startup_note(self) -> str:
        """How the bundle's tuning keys will be served (the startup line): pre-filled winners, benchmarked at
        first use; empty without autotuned kernels."""
        if not self.autotuned:
            return ""
        keys = sum(len(a.record.keys) for a in self.autotuned.values())
        winners = sum(a.winners for a in self.autotuned.values())
        return (f"{len(self.autotuned)} autotuned kernels, {keys} tuning keys: {winners} with the bundle's winner, "
                f"{keys - winners} benchmarked by Triton on first use")


def _uninstall(servers: dict, autotuned: dict | None = None) -> None:
    from nojit.loader.runtimes.triton.fast import restore_getitem

    for a in (autotuned or {}).values():
        a.undo()
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
