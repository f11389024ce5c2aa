"""FlashInfer's CuTeDSL serving face: FlashInfer's in-process compile cache answered from the bundle."""

from __future__ import annotations

from nojit.loader.faces import Handle, InstallContext, ProcessJit, Runtime, Switch

SWITCHES = (
    Switch("--gdn-prefill-backend triton", "FlashInfer's CuTeDSL GDN prefill (the sm_90 default)",
           "FLA's Triton chunk kernels (9 autotuned kernels: each bundled config, or a tuned winner)"),
)


class _Server:
    """The Handle's one server: preload loads every bundled object."""

    def __init__(self, cache: object) -> None:
        self.cache = cache

    def preload(self, device: int) -> int:
        return self.cache.preload(device)  # type: ignore[attr-defined]


def install(ctx: InstallContext) -> Handle:
    from nojit.loader.runtimes.flashinfer_cute import serving

    cache = serving.install(ctx.bundle, ctx.kernel_ids, ctx.policy, ctx.allow)
    return Handle({"flashinfer_cute": _Server(cache)}, state=cache, undo=lambda: serving.uninstall(cache))


RUNTIME = Runtime(
    name="flashinfer_cute",
    display="FlashInfer CuTeDSL",
    install=install,
    jits=(ProcessJit("FlashInfer CuTeDSL cache", "flashinfer", "flashinfer_cute",
                     "Qwen3.5 / Qwen3-Next GDN prefill (cached_compile of delta_rule_sm90 / delta_rule_cp_sm90)",
                     SWITCHES),),
    guards=("cutlass.cute",),
)
