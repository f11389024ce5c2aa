"""Run in a fresh process by tests/loader/runtimes/flashinfer/test_serving.py: install a bundle, then let FlashInfer's own code load
every bundled module (and ask for one the bundle lacks), counting FlashInfer's compile entry points and
every process this process tries to start.

usage: python tests/probes/probe_flashinfer.py BUNDLE OUT.json MISSING_GEN   (NOJIT_MODE from the environment)
"""

from __future__ import annotations

import json
import os
import sys

started: list[list[str]] = []  # [phase, what]
phase = ["install"]


def _audit(event: str, args: tuple) -> None:
    if event in ("subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn", "os.fork"):
        import traceback

        where = [f"{f.filename.rsplit('/site-packages/', 1)[-1]}:{f.lineno}" for f in traceback.extract_stack()[-14:-3]]
        started.append([phase[0], f"{event} {str(args[:2])[:300]} from {where}"])


sys.addaudithook(_audit)

bundle, out, missing_gen = sys.argv[1:4]
from nojit.loader.install import install  # noqa: E402

inst = install(bundle)
served = inst.state("flashinfer")
phase[0] = "import"
import flashinfer  # noqa: E402,F401  (FlashInfer discovers its providers here, with its own find_spec)
import flashinfer.jit.core as core  # noqa: E402
import flashinfer.jit.cpp_ext as cpp_ext  # noqa: E402

compiles: dict[str, int] = {"JitSpecNvcc.build": 0, "run_ninja": 0, "build_jit_specs": 0}


def _count(owner: object, name: str, label: str) -> None:
    original = getattr(owner, name)

    def counted(*args: object, **kwargs: object) -> object:
        compiles[label] += 1
        return original(*args, **kwargs)

    setattr(owner, name, counted)


_count(core.JitSpecNvcc, "build", "JitSpecNvcc.build")  # outside nojit's own patch: every call is seen
_count(cpp_ext, "run_ninja", "run_ninja")
_count(core, "run_ninja", "run_ninja")
_count(core, "build_jit_specs", "build_jit_specs")

from flashinfer.jit import env as jit_env  # noqa: E402

result: dict[str, object] = {
    "providers": [[p.provider_id, str(p.jit_cache_dir), sorted(p.cuda_architectures), sorted(p.modules)]
                  for p in jit_env.FLASHINFER_AOT_PROVIDERS],
    "root": served.root if served else None,
    "modules": {},
}
phase[0] = "load"
for name, kernel_id in sorted((served.modules if served else {}).items()):
    module_name, _, qualname = kernel_id.partition(":")
    spec = getattr(__import__(module_name, fromlist=[qualname]), qualname)()
    before = dict(compiles)
    loaded = spec.build_and_load()  # FlashInfer's own path: try_load -> its AOT artifact
    result["modules"][name] = {
        "library": str(spec.get_library_path()),
        "is_aot": spec.is_aot,
        "loaded": type(loaded).__name__,
        "compiles": {k: compiles[k] - before[k] for k in compiles},
    }
if served and "sampling" in served.modules:
    from flashinfer.sampling import get_sampling_module  # the function vLLM's sampler reaches

    result["get_sampling_module"] = type(get_sampling_module()).__name__

phase[0] = "missing"
module_name, _, qualname = missing_gen.partition(":")
spec = getattr(__import__(module_name, fromlist=[qualname]), qualname)()
try:
    spec.build_and_load()
    result["missing"] = {"name": spec.name, "raised": None}
except Exception as exc:  # noqa: BLE001 - the probe reports what FlashInfer's path raised
    result["missing"] = {"name": spec.name, "raised": type(exc).__name__, "message": str(exc)}
result["compiles"] = compiles
result["trtllm_cache_dir"] = os.environ.get("TRTLLM_DG_CACHE_DIR")
result["trtllm"] = sorted(served.trtllm) if served else []
result["started"] = started
result["builds_seen_by_nojit"] = list(served.builds) if served else []
with open(out, "w") as f:
    json.dump(result, f, indent=1)
os._exit(0)  # skip interpreter teardown (tvm_ffi modules)
