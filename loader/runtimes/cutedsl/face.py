"""CuTeDSL's serving face: each bundled owner's `compile` answered from the bundle's exported objects."""

from __future__ import annotations

from nojit.loader.faces import Handle, InstallContext, ProcessJit, Runtime


def install(ctx: InstallContext) -> Handle:
    from nojit.loader.runtimes.cutedsl import serving

    servers = serving.install(ctx.bundle, ctx.kernel_ids, ctx.policy, ctx.allow, ctx.resolve)

    def undo() -> None:
        for server in servers.values():
            server.uninstall()

    return Handle(servers, undo=undo)


RUNTIME = Runtime(
    name="cutedsl",
    display="CuTeDSL",
    install=install,
    jits=(ProcessJit("CuTeDSL", "cutlass", "cutedsl", "head-512 compressor, indexer-q, dequant-gather-K, router GEMM ll_bf16"),),
    guards=("cutlass.cute",),
)
