"""Humming's serving face: Humming's cache seeded from the bundle under the key this process's Humming computes."""

from __future__ import annotations

from nojit.loader.faces import Handle, InstallContext, ProcessJit, Runtime


def install(ctx: InstallContext) -> Handle:
    from nojit.loader.runtimes.humming import serving

    state = serving.install(ctx.bundle, ctx.kernel_ids, ctx.policy)
    return Handle(state=state, undo=serving.uninstall if state is not None else (lambda: None))  # None: not installed


RUNTIME = Runtime(
    name="humming",
    display="Humming",
    install=install,
    jits=(ProcessJit("Humming (NVRTC)", "humming", "humming", "MXFP4 MoE experts"),),
    guards=("humming.jit.compiler",),
)
