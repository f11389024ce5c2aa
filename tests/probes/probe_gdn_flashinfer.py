"""Run in a fresh process by tests/checks/test_check_gdn_flashinfer.py: the serving side of
tests/gpu/checks/check_gdn_flashinfer.py on the CPU box, up to the GPU launch.

  serve BUNDLE VLLM_SRC   the check's own start() (vLLM's copy mounted, nojit strict, vLLM's fi_chunk_gated_delta_rule
                          imported), then that call on the stand-in GPU (aot/runtimes/flashinfer_cute/stand_in.py: CPU
                          tensors, the deployment's device answers): FlashInfer's lookup reaches nojit's cache through
                          the check's counter, the bundled object is loaded by cute.runtime.load_module (real); only
                          the launch of the loaded function is recorded instead of run
  arguments VLLM_SRC      vLLM's fi_chunk_gated_delta_rule (the mounted copy, verbatim) with FlashInfer's entry replaced
                          by a recorder, against the check's fallback `vllm_call_kwargs`, and both bound to FlashInfer's
                          own signature
Prints one JSON line.
"""

from __future__ import annotations

import inspect
import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests", "gpu", "checks")]

import torch  # noqa: E402

import check_gdn_flashinfer as check  # noqa: E402
from check_gdn_prefill import inputs  # noqa: E402

mode = sys.argv[1]
x = inputs([200, 64, 17], 1, "cpu")
args = {"q": x["q"][None], "k": x["k"][None], "v": x["v"][None], "g": torch.log(x["alpha"])[None],
        "beta": x["beta"][None], "initial_state": x["init"], "output_final_state": True,
        "cu_seqlens": torch.tensor(x["cu"], dtype=torch.int32), "use_qk_l2norm_in_kernel": False}


def serve(bundle: str, vllm_src: str) -> dict:
    from nojit.loader.errors import NoJitError
    from nojit.loader.runtimes.flashinfer_cute import serving
    from nojit.loader.strict import guards

    launched: list[int] = []
    real_load = serving.BundledCompileCache._load

    def load_then_record(self, entry):  # the real load; the returned function records its call instead of launching
        real_load(self, entry)
        return lambda *a, **k: launched.append(len(a))

    serving.BundledCompileCache._load = load_then_record
    s = check.start(bundle, vllm_src)
    from nojit.aot.deployment import load_deployment  # after the mount: it must not import the installed vLLM first
    from nojit.aot.runtimes.flashinfer_cute.stand_in import flashinfer_on_stand_in

    d = load_deployment("builtin:qwen3.5-35b-a3b-fp8-h200.toml")
    out = {"via": s["via"], "sm90_kernel_module": s["sm90_kernel_module"], "cache_is_nojit": s["cache_is_nojit"]}
    try:
        with flashinfer_on_stand_in(d.platform), torch.inference_mode():
            s["call"](**args)
    except NoJitError as exc:
        out.update(raised=type(exc).__name__, message=exc.message, fix=exc.fix)
    lookups = s["lookups"]
    out.update(lookups=lookups.calls, answered=lookups.answered, loaded=len(lookups.cache.loaded), launched=launched,
               compile_attempts=list(guards.compile_attempts),
               vllm_module=getattr(sys.modules.get("vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn"),
                                   "__file__", None))
    return out


def arguments(vllm_src: str) -> dict:
    from qwen_call_site_steps import GDN, mount_qwen

    mount_qwen(vllm_src)
    import importlib

    import flashinfer.gdn_prefill as gp

    real = gp.chunk_gated_delta_rule
    seen: dict = {}

    def record(**kw):
        seen.update(kw)
        return kw["v"], kw["initial_state"]

    gp.chunk_gated_delta_rule = record
    importlib.import_module(GDN).fi_chunk_gated_delta_rule(**args)
    ours = check.vllm_call_kwargs(**{k: v for k, v in args.items()
                                     if k not in ("output_final_state", "use_qk_l2norm_in_kernel")})

    def same(a, b) -> bool:
        if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
            return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                    and a.shape == b.shape and a.is_contiguous() == b.is_contiguous() and bool(torch.equal(a, b)))
        return a == b

    sig = inspect.signature(real)
    return {"vllm_keys": sorted(seen), "ours_keys": sorted(ours),
            "differ": sorted(k for k in set(seen) | set(ours) if not same(seen.get(k), ours.get(k))),
            "binds": bool(sig.bind(**ours)) and bool(sig.bind(**seen))}


print(json.dumps(serve(sys.argv[2], sys.argv[3]) if mode == "serve" else arguments(sys.argv[2]), default=str))
