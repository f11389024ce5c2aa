"""One vLLM worker's JIT warmup on a CPU box, as `tests/loader/test_vllm_strict_startup.py` runs it (in a
subprocess, under strace when available).

    python tests/probes/probe_vllm_startup.py --plan PLAN --out REPORT.json [--extra-owner SUBSTR] [--no-nojit]

Order, as in a vLLM worker: the deployment's GPU facts are installed (nojit.aot.vllm_env: vLLM
sees an H200 it cannot reach), the dry-run launcher stands for the C launcher, vLLM's plugin
loader runs (`vllm.plugins.load_general_plugins`, nojit's real entry point) with NOJIT_BUNDLE
set by the caller, vLLM's mHC module is imported (the model import), a real `JitWarmupRegistry`
is filled with vLLM's real warmup owners and the registrations the DeepSeek-V4 model and the V2
runner make for the default deployment (nojit's build tables), restricted to the owners the
bundle's plan names, vLLM's JIT monitor is switched on in error mode, and
`JitWarmupRegistry.warmup()` runs. Compiles are counted at Triton's post-compile hook,
TileLang's JITImpl.compile and CuTeDSL's cute.compile. The report is JSON.

--no-nojit runs the same warmup's Triton owners with the JIT (Triton answered by nojit's offline
build driver, real compiles): the baseline for the warmup time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root: tests.support


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True, help="the bundle's plan (nojit build --emit-plan): which owners to register")
    ap.add_argument("--out", required=True)
    ap.add_argument("--extra-owner", action="append", default=[], help="also register these owner rows (not bundled)")
    ap.add_argument("--extra-cutedsl", action="append", default=[], metavar="MODULE:ATTR",
                    help="also register this CuTeDSL owner with no arguments (as attention.py:463 does)")
    ap.add_argument("--no-nojit", action="store_true")
    args = ap.parse_args()
    report: dict = {"pid": os.getpid()}
    try:
        run(args, report)
    except BaseException as exc:  # the report says what failed; the test decides
        report["error"] = {"type": type(exc).__name__, "message": str(exc), "trace": traceback.format_exc()[-3000:]}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    return 0


def run(args: argparse.Namespace, report: dict) -> None:
    from nojit.aot.deployment import load_deployment
    from nojit.aot.vllm_env import install_deployment_platform

    plan = json.load(open(args.plan))
    d = load_deployment()
    install_deployment_platform(d.platform)
    cache = os.environ.get("TRITON_CACHE_DIR", "")
    report["triton_cache_before"] = sorted(os.listdir(cache)) if cache and os.path.isdir(cache) else None

    dry = None
    if args.no_nojit:
        from nojit.aot.runtimes.triton.compiler import install_offline_driver

        install_offline_driver()
    else:
        from tests.support.dry_launcher import install_dry_run

        dry = install_dry_run()
    t0 = time.perf_counter()
    from nojit.aot.vllm_env import CUDA_ONLY_KERNEL_MODULES, _neutral_platform, import_kernel_module
    from vllm.plugins import load_general_plugins

    # On a GPU vLLM defines these modules' kernels at import (`if current_platform.is_cuda()`); on this CPU box
    # they are imported as the build imports them, under the deployment platform, before the plugin resolves them.
    for name in sorted(CUDA_ONLY_KERNEL_MODULES):
        import_kernel_module(name)

    # nojit's entry point, as every vLLM process calls it. vLLM's kernel modules run CUDA-only
    # setup at import (vllm._C, absent on a CPU box): they are imported under vLLM's neutral
    # platform, as nojit's build imports them; the deployment's answers apply again at call time.
    with _neutral_platform():
        load_general_plugins()
    report["plugin_seconds"] = time.perf_counter() - t0

    from nojit.aot.models.deepseek_v4 import TRITON
    from nojit.aot.models.deepseek_v4.config_view import make_vllm_config
    from nojit.aot.models.deepseek_v4.mhc import MhcModelParams, register_like_deepseek_v4
    from nojit.aot.runtimes.tilelang.enumeration import kernel_module
    from nojit.aot.runtimes.triton.enumeration import resolve_owner
    from nojit.loader.install import current

    tk = kernel_module()  # vLLM's mHC module: imported after the plugin, as the model import is
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    wanted = {r["origin"].removeprefix("registry:") for r in plan["requests"] if r["origin"].startswith("registry:")}
    vllm_config = make_vllm_config(d)
    registry = JitWarmupRegistry(vllm_config)
    rows = [row for row in TRITON.owners
            if row.owner in wanted or any(s in row.kernel for s in args.extra_owner)]
    with registry.activate():
        for row in rows:
            owner = resolve_owner(row.owner)
            for registration in row.registrations(d):
                owner.register_warmup(**registration)
        for name in args.extra_cutedsl:
            with _neutral_platform():
                resolve_owner(name).register_warmup()
        register_like_deepseek_v4(tk, vllm_config, MhcModelParams.from_hf_config(d.hf_config), d.platform.deep_gemm,
                                  True, True)
    module = tk.__name__
    for kernel in list(registry._registrations):  # keep the owners the bundle was built for (plus the extras)
        names = [n for n, v in vars(tk).items() if v is kernel]
        # Without nojit TileLang would compile for this CPU box's target, not the deployment's (nojit's build
        # compiles it for sm_90a its own way): the baseline times the Triton owners only.
        if names and (f"{module}:{names[0]}" not in wanted or args.no_nojit):
            del registry._registrations[kernel]
    report["registered_owners"] = len(registry._registrations)
    report["env"] = {name: os.environ.get(name) for name in ("PATH", "CUDA_HOME", "CUDA_PATH", "NOJIT_FIREWALL_DIR")}

    compiles = report["compiles"] = count_compiles()
    served = trace_served(current())
    from vllm.utils import jit_monitor

    if not args.no_nojit:  # without nojit the warmup compiles, which is what the monitor would refuse
        jit_monitor.activate(mode="error")
    t0 = time.perf_counter()
    try:
        registry.warmup()
    finally:
        report["warmup_seconds"] = time.perf_counter() - t0
    report["served"] = sorted(served)
    from nojit.loader import vllm_registry

    r = vllm_registry.last_report
    if r is not None:
        report["nojit"] = {"keys": r.keys, "unserved": [u.__dict__ for u in r.unserved], "preloaded": r.preloaded}
    if dry is not None:
        report["dry"] = {"loads": dry.loads, "launches": len(dry.launches)}
    from triton.runtime import driver

    report["triton_real_driver_created"] = driver._default is not None
    report["triton_cache_after"] = sorted(os.listdir(cache)) if cache and os.path.isdir(cache) else None


def count_compiles() -> dict:
    """Counters at each JIT's compile entry point (chained, so vLLM's monitor still sees them)."""
    counts = {"triton": 0, "tilelang": 0, "cutedsl": 0}
    from triton import knobs

    previous = knobs.runtime.jit_post_compile_hook

    def triton_hook(*a, **kw):
        counts["triton"] += 1
        return previous(*a, **kw) if previous else None

    knobs.runtime.jit_post_compile_hook = triton_hook
    try:
        import importlib

        tj = importlib.import_module("tilelang.jit")  # the package re-exports a function named jit
        original_tl = tj.JITImpl.compile

        def tl_compile(self, *a, **kw):
            counts["tilelang"] += 1
            return original_tl(self, *a, **kw)

        tj.JITImpl.compile = tl_compile
    except Exception as exc:  # TileLang not importable: nothing of it can compile either
        counts["tilelang_import"] = f"{type(exc).__name__}: {exc}"
    try:
        import cutlass.cute as cute

        original_cute = cute.compile

        class Counted:
            def __getitem__(self, options):
                counts["cutedsl"] += 1
                return original_cute[options]

            def __call__(self, *a, **kw):
                counts["cutedsl"] += 1
                return original_cute(*a, **kw)

        cute.compile = Counted()
    except Exception as exc:
        counts["cutedsl_import"] = f"{type(exc).__name__}: {exc}"
    return counts


def trace_served(inst) -> set:
    """(kernel, entry key) of every bundle entry the warmup resolved to."""
    served: set = set()
    if inst is None:
        return served
    for kid, server in inst.servers("triton").items():
        run = server.fn.run

        def counted_run(*a, _run=run, _kid=kid, **kw):
            variant = _run(*a, **kw)
            if variant is not None and hasattr(variant, "entry"):
                served.add((_kid, json.dumps(variant.entry.key, sort_keys=True)))
            return variant

        server.fn.run = counted_run
    for kid, server in inst.servers("tilelang").items():
        compile_ = server.compile

        def counted_compile(*a, _c=compile_, _kid=kid, **kw):
            variant = _c(*a, **kw)
            served.add((_kid, json.dumps(variant.entry.key, sort_keys=True)))
            return variant

        server.compile = counted_compile
    return served


if __name__ == "__main__":
    sys.exit(main())
