"""Run in a subprocess by tests/loader/runtimes/flashinfer_cute/test_serving.py: install a bundle's FlashInfer CuTeDSL
entries (mode from argv), then run vLLM's fi_chunk_gated_delta_rule -> FlashInfer's own chunk_gated_delta_rule, as the
Qwen room's GDN prefill site calls it, on the stand-in GPU (CPU tensors, the device's answers).

FlashInfer's own lookups (get_cached_compile / cached_compile -> _in_mem_compile_cache.get) reach the loader; only
the GPU launch is mocked: the function nojit loads from the bundle (cute.runtime.load_module, real) is wrapped so
that calling it records the call instead of launching. `cutlass.cute.compile` is counted (and, outside strict mode,
stopped with a sentinel: the positive control shows FlashInfer would compile). Prints one JSON line.

usage: probe_fi_cute_loader.py BUNDLE MODE CALLS_JSON
"""

from __future__ import annotations

import json
import os
import sys

bundle_path, mode, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import cutlass.cute as cute  # noqa: E402
import torch  # noqa: E402

from nojit.aot.deployment import load_deployment  # noqa: E402
from nojit.aot.vllm_env import install_deployment_platform  # noqa: E402

d = load_deployment("builtin:qwen3.5-35b-a3b-fp8-h200.toml")
install_deployment_platform(d.platform)

from nojit.aot.models.qwen3_5 import gdn_prefill  # noqa: E402
from nojit.aot.runtimes.flashinfer_cute.stand_in import flashinfer_on_stand_in  # noqa: E402
from nojit.loader.errors import NoJitError  # noqa: E402
from nojit.loader.install import install  # noqa: E402
from nojit.loader.runtimes.flashinfer_cute import serving  # noqa: E402
from nojit.loader.strict import guards  # noqa: E402

compiles: list[str] = []


class WouldCompile(Exception):
    pass


real_compile = cute.compile


class CountingCompile:
    """cute.compile as FlashInfer calls it (`cute.compile[options](kernel, *args)`), counted; stopped here."""

    def __getitem__(self, options):
        return self

    def __call__(self, fn, *args, **kwargs):
        compiles.append(type(fn).__name__)
        raise WouldCompile(type(fn).__name__)


cute.compile = CountingCompile()  # strict mode's guard replaces it again at install (then any call raises)
inst = install(bundle_path, mode=mode)

launched: list[dict] = []
loaded_types: list[str] = []
real_load = serving.BundledCompileCache._load


def load_then_mock_launch(self, entry):
    fn = real_load(self, entry)  # the real load: cute.runtime.load_module of the bundled object
    loaded_types.append(f"{type(fn).__module__}.{type(fn).__qualname__}")

    def launch(*args, **kwargs):  # the GPU launch only
        launched.append({"kernel": entry.kernel.rpartition(":")[2], "args": len(args),
                         "tensors": sum(isinstance(a, torch.Tensor) for a in args)})
    return launch


serving.BundledCompileCache._load = load_then_mock_launch
preloaded = inst.handles["flashinfer_cute"].preload(0) if mode == "permissive" else None  # the server's preload
results = []
for call in calls:
    launched.clear()
    out = {"call": call}
    try:
        with flashinfer_on_stand_in(d.platform), torch.inference_mode():
            gdn_prefill.prefill(call, torch.device("cpu"))
        out["launched"] = list(launched)
    except NoJitError as exc:
        out["raised"] = type(exc).__name__
        out["message"], out["fix"] = exc.message, exc.fix
    except WouldCompile as exc:
        out["raised"] = "WouldCompile"
        out["message"] = str(exc)
    results.append(out)

from flashinfer.gdn_kernels.delta_rule_dsl import custom_compile_cache as ccc  # noqa: E402

print(json.dumps({"results": results, "compiles": compiles, "preloaded": preloaded, "compile_attempts": list(guards.compile_attempts),
                  "loaded_types": loaded_types, "cache_is_nojit": isinstance(ccc._in_mem_compile_cache,
                                                                            serving.BundledCompileCache),
                  "counts": {f"{k[0].rpartition(':')[2]}/{k[1]}": v for k, v in inst.policy.counts.items()}}))
