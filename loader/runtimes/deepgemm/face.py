"""DeepGEMM's serving face: its own cache lookup, seeded read-only from the bundle, and vLLM's entry points
wrapped to refuse a shape the bundle lacks. Installed after the firewall: DeepGEMM's compiler ends at the
stand-in and its `nvcc --version` probe is answered in process."""

from __future__ import annotations

from nojit.loader.faces import Handle, InstallContext, ProcessJit, Runtime


def install(ctx: InstallContext) -> Handle:
    from nojit.loader.runtimes.deepgemm.serving import install_from_bundle

    serving = install_from_bundle(ctx.bundle, ctx.bundle.index.kernels, ctx.kernel_ids, ctx.policy.mode,
                                  ctx.policy.recorder, ctx.allow)

    def undo() -> None:  # vLLM's DeepGEMM entry points back (the probe answer stays in place)
        import vllm.utils.deep_gemm as vllm_dg

        for op, original in serving.originals.items():
            setattr(vllm_dg, op, original)

    return Handle(state=serving, undo=undo)


RUNTIME = Runtime(
    name="deepgemm",
    display="DeepGEMM",
    install=install,
    jits=(ProcessJit("DeepGEMM (vendored 2.8.1)", "vllm.third_party.deep_gemm", "deepgemm",
                     "fp8_gemm_nt, fp8_einsum (o_proj), tf32_hc_prenorm_gemm (mHC), the indexer's MQA logits",
                     unavoidable="fp8_einsum and the sparse-attention indexer have no non-DeepGEMM path on CUDA"),),
)
