"""Run in a subprocess by tests/loader/runtimes/cutedsl/test_serving.py (optionally under strace): install a bundle's CuTeDSL
entries in strict mode, firewall on, and let vLLM's own `_get_or_compile` find every bundled key.

Prints one JSON line: per kernel the keys found and the executor type, the compile attempts the strict
guards counted, cute.compile calls, processes the audit hook saw start, and what a missing key raised.
Between the markers (os.access on BEGIN/END paths, visible to `strace -e trace=execve,faccessat2,...`)
only nojit's load path runs.

usage: probe_cutedsl_loader.py BUNDLE MARKER_PREFIX
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import time

bundle_path, marker = sys.argv[1], sys.argv[2]
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
events: list[str] = []
watching = False


def audit(event: str, args: tuple) -> None:
    if watching and event in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.spawn", "os.system", "os.fork"):
        events.append(f"{event} {str(args[:2])[:200]}")


sys.addaudithook(audit)

import cutlass.cute as cute  # noqa: E402  (imports cuda-python, which runs `ldconfig -p` once, before the markers)

from nojit.loader.bundle.file import Bundle  # noqa: E402

# This box has no libcuda: vllm.vllm_flash_attn's __init__ (CUDA extensions) cannot load, and the indexer-q
# module needs only its pure-Python cute.utils. The build uses the same stand-in (aot/runtimes/cutedsl/planner.py).
from nojit.aot.runtimes.cutedsl.planner import _FLASH_ATTN  # noqa: E402

if _FLASH_ATTN not in sys.modules:
    import importlib.machinery
    import importlib.util
    import types

    spec = importlib.util.find_spec(_FLASH_ATTN)
    shell = types.ModuleType(_FLASH_ATTN)
    shell.__path__ = list(spec.submodule_search_locations)
    shell.__spec__ = importlib.machinery.ModuleSpec(_FLASH_ATTN, None, is_package=True)
    shell.__spec__.submodule_search_locations = shell.__path__
    sys.modules[_FLASH_ATTN] = shell

# As in tests/probes/probe_vllm_startup.py: vLLM sees the deployment's H200 (it cannot reach it), and vLLM's modules
# are imported the way the build imports them (vllm._C, absent here, under vLLM's neutral platform).
from nojit.aot.deployment import load_deployment  # noqa: E402
from nojit.aot.vllm_env import import_kernel_module, install_deployment_platform  # noqa: E402

install_deployment_platform(load_deployment().platform)
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root: tests.support
from tests.support.dry_launcher import install_dry_run  # noqa: E402  (device 0 stands for the GPU: CuTeDSL entries use no launcher)

install_dry_run()
b = Bundle.open(bundle_path)
ids = [k for k, r in b.manifest.kernels.items() if r.runtime == "cutedsl"]
for kid in ids:  # the vLLM modules (imports only; nothing is compiled at import)
    import_kernel_module(kid.partition(":")[0])
b.close()

os.access(f"{marker}-BEGIN", os.F_OK)
watching = True
t0 = time.perf_counter()
from nojit.loader.strict import guards  # noqa: E402
from nojit.loader.errors import KernelNotInBundleError, NoJitError  # noqa: E402
from nojit.loader.install import install  # noqa: E402

inst = install(bundle_path, mode="strict")
t_install = time.perf_counter() - t0
found: dict[str, list] = {}
t1 = time.perf_counter()
from nojit.loader.bundle.cutedsl_key import cache_slot  # noqa: E402

for kid, server in inst.servers("cutedsl").items():
    for key in server.entries:
        cache, slot = cache_slot(server.owner, key)
        if hasattr(server.owner, "_get_or_compile"):
            executor = server.owner._get_or_compile(key)  # vLLM's own run-time lookup (VllmJitKernel)
        else:
            server.owner.compile(key)  # the router GEMM: what its __call__ and warmup() call on a cache miss
            executor = cache[slot]
        found.setdefault(kid, []).append([repr(key)[:160], type(executor).__module__ + "." + type(executor).__name__,
                                          executor is cache[slot]])
t_load = time.perf_counter() - t1
missing: dict[str, str] = {}

def _int_field(key):
    return next((f.name for f in dataclasses.fields(key) if type(getattr(key, f.name)) is int), None)


some = next((s for s in inst.servers("cutedsl").values() if hasattr(s.owner, "_get_or_compile")
             and _int_field(next(iter(s.entries)))), None)
if some is not None:  # a key the bundle lacks: one int field of a bundled key plus one
    key = next(iter(some.entries))
    other = dataclasses.replace(key, **{_int_field(key): getattr(key, _int_field(key)) + 1})
    try:
        some.owner._get_or_compile(other)
        missing = {"raised": "nothing"}
    except KernelNotInBundleError as exc:
        missing = {"raised": type(exc).__name__, "message": exc.message, "fix": exc.fix}
    except NoJitError as exc:
        missing = {"raised": type(exc).__name__, "message": exc.message}
# vLLM's real JIT warmup registry, through nojit's hook (the plugin installs it in a vLLM process): a fresh
# server on each bundled registry owner, which vLLM's own model code registers, then registry.warmup().
registry_report: dict = {}
registry_owners = [s for s in inst.servers("cutedsl").values() if hasattr(s.owner, "register_warmup")
                   and "NORM_ROPE_STORE_KERNEL" not in s.kernel_id]  # that one registers with a layer prefix
if registry_owners:
    from nojit.aot.models.deepseek_v4.cutedsl_owners import make_cutedsl_vllm_config
    from nojit.loader import vllm_registry
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    for s in registry_owners:  # forget what the loop above loaded: the registry must load it again
        s.owner._compiled_cache.clear()
    vllm_registry.hook()
    registry = JitWarmupRegistry(make_cutedsl_vllm_config(load_deployment()))
    with registry.activate():
        for s in registry_owners:
            s.owner.register_warmup()
    registry.warmup()
    r = vllm_registry.last_report
    registry_report = {"keys": r.keys, "unserved": [u.__dict__ for u in r.unserved], "preloaded": r.preloaded,
                       "cached": {s.kernel_id: len(s.owner._compiled_cache) for s in registry_owners},
                       "server_still_on": all(s.owner.__dict__.get("compile") == s.compile for s in registry_owners)}
watching = False
os.access(f"{marker}-END", os.F_OK)
print(json.dumps({
    "kernels": found, "entries": sum(len(v) for v in found.values()), "install_s": round(t_install, 3),
    "load_s": round(t_load, 3), "compile_attempts": list(guards.compile_attempts),
    "cute_compile_guarded": type(cute.compile).__name__ == "_NoCuteCompile",  # strict mode's guard (guards.py)
    "processes": events, "missing": missing, "registry": registry_report, "firewall": os.environ.get("NOJIT_FIREWALL_DIR"),
}))
