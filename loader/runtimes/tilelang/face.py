"""TileLang's serving face: vLLM's `tilelang_jit` for the mHC kernels, served from the bundle."""

from __future__ import annotations

from nojit.loader.faces import Handle, InstallContext, ProcessJit, Runtime


def install(ctx: InstallContext) -> Handle:
    from nojit.loader.runtimes.tilelang import serving

    servers = serving.install(ctx.bundle, ctx.kernel_ids, ctx.policy, ctx.allow)  # filled as vLLM decorates
    return Handle(servers, undo=lambda: serving.uninstall(servers), checked_at_first_use=True)


RUNTIME = Runtime(
    name="tilelang",
    display="TileLang",
    install=install,
    jits=(ProcessJit("TileLang (mHC)", "tilelang", "tilelang", "mHC pre/post/fused/head kernels"),),
    guards=("tilelang",),
)
