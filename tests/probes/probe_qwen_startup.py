"""A Qwen3.5 worker's startup on a CPU box, as `tests/loader/test_qwen_strict_startup.py` runs it (in a subprocess,
under strace when available).

    python tests/probes/probe_qwen_startup.py --plan PLAN --out REPORT.json [--compilation-mode N] [--no-nojit]

Order, as in a vLLM worker (model_executor/warmup/kernel_warmup.py:176-199): the deployment's GPU facts are
installed (vLLM sees an H200), the dry-run launcher stands for the C launcher, vLLM's plugin loader runs
(nojit's real entry point, NOJIT_BUNDLE set by the caller), the model runner's `JitWarmupRegistry(vllm_config)`
is built (where strict mode checks the compilation config for Inductor), filled with the runners' owners the
bundle's plan names, vLLM's JIT monitor is switched on in error mode, `registry.warmup()` runs, then vLLM's own
`qwen_triton_warmup(runner, model_config)` and `_warm_batch_memcpy_kernel` (mamba_triton_warmup's launch) with
a runner whose GDN layer is bound to a cache laid out as vLLM's runner lays it out (CPU tensors: the dry-run
launcher reads pointers, never memory). Compiles are counted at Triton's post-compile hook.

--compilation-mode N puts vLLM's CompilationConfig(mode=N) on the registry's config (3: VLLM_COMPILE, the
default for this architecture). --no-nojit runs the same launches with the JIT (the counters' control).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository root: tests.support

DEPLOYMENT = "builtin:qwen3.5-35b-a3b-fp8-h200.toml"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--plan", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--compilation-mode", type=int, default=None)
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
    import torch

    from nojit.aot.deployment import load_deployment
    from nojit.aot.vllm_env import _neutral_platform, install_deployment_platform

    plan = json.load(open(args.plan))
    d = load_deployment(DEPLOYMENT)
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
    from vllm.plugins import load_general_plugins

    with _neutral_platform():
        load_general_plugins()  # nojit's entry point, as every vLLM process calls it

    from tests.probes.probe_vllm_startup import count_compiles, trace_served

    from nojit.aot.models.qwen3_5 import TRITON
    from nojit.aot.models.qwen3_5.config_view import make_vllm_config
    from nojit.aot.models.qwen3_5.stand_in import runner
    from nojit.aot.runtimes.triton.enumeration import resolve_owner
    from nojit.aot.vllm_env import import_kernel_module
    from nojit.loader.install import current

    compiles = report["compiles"] = count_compiles()
    served = trace_served(current())
    vllm_config = make_vllm_config(d)
    if args.compilation_mode is not None:
        from types import SimpleNamespace

        from vllm.config.compilation import CompilationConfig

        vllm_config = SimpleNamespace(**vars(vllm_config),
                                      compilation_config=CompilationConfig(mode=args.compilation_mode))
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    registry = JitWarmupRegistry(vllm_config)  # the model runner's constructor (strict mode: Inductor check)
    wanted = {r["origin"].removeprefix("registry:") for r in plan["requests"] if r["origin"].startswith("registry:")}
    with registry.activate():
        for row in TRITON.owners:
            if row.owner in wanted:
                owner = resolve_owner(row.owner)
                for registration in row.registrations(d):
                    owner.register_warmup(**registration)
    report["registered_owners"] = len(registry._registrations)
    report["env"] = {name: os.environ.get(name) for name in ("PATH", "CUDA_HOME", "CUDA_PATH", "NOJIT_FIREWALL_DIR")}
    from vllm.utils import jit_monitor

    if not args.no_nojit:
        jit_monitor.activate(mode="error")
    t0 = time.perf_counter()
    registry.warmup()
    qwen = import_kernel_module("vllm.model_executor.warmup.qwen_triton_warmup")
    mamba = import_kernel_module("vllm.model_executor.warmup.mamba_triton_warmup")
    device = torch.device("cpu")  # the dry-run launcher reads pointers; nothing touches memory
    r, model_config = runner(d, device)
    qwen.qwen_triton_warmup(r, model_config)  # kernel_warmup.py:197
    mamba._warm_batch_memcpy_kernel(device)  # what mamba_triton_warmup (kernel_warmup.py:199) launches on a GPU
    report["warmup_seconds"] = time.perf_counter() - t0
    report["served"] = sorted(served)
    from nojit.loader import vllm_registry

    rep = vllm_registry.last_report
    if rep is not None:
        report["nojit"] = {"keys": rep.keys, "unserved": [u.__dict__ for u in rep.unserved], "preloaded": rep.preloaded}
    if dry is not None:
        report["dry"] = {"loads": dry.loads, "launches": len(dry.launches)}
    from triton.runtime import driver

    report["triton_real_driver_created"] = driver._default is not None
    report["triton_cache_after"] = sorted(os.listdir(cache)) if cache and os.path.isdir(cache) else None
    report["compiles"] = compiles


if __name__ == "__main__":
    sys.exit(main())
