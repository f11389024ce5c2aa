"""Run in a fresh process by tests/loader/runtimes/tilelang/test_serving.py: serve vLLM's mHC kernels with TileLang unimportable.

    python probe_tilelang_loader.py BUNDLE PLAN OUT.json [--launch]

The process answers vLLM's device questions as an H200 would (nojit's build-side platform
stand-in, since this machine has no GPU), blocks every import of tilelang, installs nojit in
strict mode, imports vLLM's mHC module and then resolves every planned variant twice: by
TileLang's compile(**scalars) form and through vLLM's own warmup owner path. With --launch
(and a stand-in libcuda on LD_LIBRARY_PATH) it also launches real cubins for several token
counts so the test can read what reached the driver.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys


class BlockTileLang(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Every import of tilelang / tvm fails, as in an image where they are broken or absent."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("tilelang", "tvm", "tvm_ffi"):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        raise ImportError(f"{module.__name__} is blocked in this test process")


def main() -> int:
    bundle, plan_path, out = sys.argv[1:4]
    launch = "--launch" in sys.argv
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    sys.meta_path.insert(0, BlockTileLang())
    from nojit.aot.vllm_env import PlatformFacts, install_deployment_platform

    install_deployment_platform(PlatformFacts())
    from nojit.loader.install import install
    from nojit.loader.runtimes.tilelang.serving import TileLangKernelServer

    inst = install(bundle, mode="strict")
    import vllm.model_executor.kernels.mhc.tilelang_kernels as tk

    result: dict = {"servers": sorted(inst.servers("tilelang")), "tilelang_imported": "tilelang" in sys.modules,
                    "is_server": {n: isinstance(getattr(tk, n), TileLangKernelServer) for n in
                                  ("mhc_post_tilelang", "mhc_fused_tilelang", "hc_head_fuse_tilelang",
                                   "mhc_pre_big_fuse_with_norm_tilelang",
                                   "mhc_pre_big_fuse_broadcast_with_norm_tilelang")}}
    with open(plan_path) as f:
        plan = json.load(f)
    by_kwargs, by_owner, owner_errors = 0, 0, []
    resolved: list = []
    for r in plan["requests"]:
        if plan["kernels"][r["kernel"]]["runtime"] != "tilelang":
            continue
        v = r["extra"]["variant"]
        server = inst.servers("tilelang")[r["kernel"]]
        variant = server.compile(**dict(v["compile_kwargs"]))
        by_kwargs += variant.entry.key == r["key"]
        # vLLM's own warmup path: owner.compile(CompileKey) -> __call__ -> compile_tilelang(server, ...)
        module, _, attr = v["owner"].partition(":")
        owner = getattr(sys.modules[module], attr)
        seen = []
        original = server.compile
        server.compile = lambda *a, _o=original, _s=seen, **k: _s.append(_o(*a, **k)) or _s[-1]
        try:
            owner.compile(owner.CompileKey(**dict(v["compile_key"])))
        except Exception as exc:  # reported, the test asserts there are none
            owner_errors.append(f"{r['kernel']}: {type(exc).__name__}: {exc}")
        finally:
            server.compile = original
        by_owner += len(seen) == 1 and seen[0].entry.key == r["key"]
        resolved.append(r["key"])
    result.update(by_kwargs=by_kwargs, by_owner=by_owner, owner_errors=owner_errors, planned=len(resolved),
                  tilelang_imported_after=("tilelang" in sys.modules))
    if launch:
        result["launches"] = launch_post_and_fused(tk)
    with open(out, "w") as f:
        json.dump(result, f)
    return 0


def launch_post_and_fused(tk) -> list:
    """Launch mhc_post and mhc_fused on CPU tensors through the stand-in driver."""
    import torch

    import nojit.loader.runtimes.tilelang.serving as ts

    ts.current_device = lambda: 0
    ts.current_stream = lambda device: 99
    done = []
    for n in (1, 7, 64, 513, 8192):
        a = torch.empty(n, 4, 4)
        b = torch.empty(n, 4, 4096, dtype=torch.bfloat16)
        c = torch.empty(n, 4)
        d = torch.empty(n, 4096, dtype=torch.bfloat16)
        x = torch.empty(n, 4, 4096, dtype=torch.bfloat16)
        os.environ["FAKE_CUDA_PARAM_SIZES"] = "8,8,8,8,8,4"
        tk.mhc_post_tilelang(a, b, c, d, x, 4, 4096)
        done.append(("mhc_post", n, [a.data_ptr(), b.data_ptr(), c.data_ptr(), d.data_ptr(), x.data_ptr()]))
    for n, split_k in ((7, 8), (32, 4)):
        comb = torch.empty(n, 4, 4)
        res_in = torch.empty(n, 4, 4096, dtype=torch.bfloat16)
        post = torch.empty(n, 4)
        x_in = torch.empty(n, 4096, dtype=torch.bfloat16)
        weight_t = torch.empty(24, 4, 4096)
        yp = torch.empty(split_k, n, 24)
        rp = torch.empty(split_k, n)
        res_out = torch.empty(n, 4, 4096, dtype=torch.bfloat16)
        os.environ["FAKE_CUDA_PARAM_SIZES"] = "8,8,8,8,8,8,8,8,4,4"
        tk.mhc_fused_tilelang(comb, res_in, post, x_in, weight_t, yp, rp, res_out, 4, 4096, 24, n_thr=128, tile_n=2)
        done.append(("mhc_fused", n, split_k))
    return done


if __name__ == "__main__":
    sys.exit(main())
