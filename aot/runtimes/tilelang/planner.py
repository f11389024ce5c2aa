"""TileLang in the build: vLLM's mHC variants into the plan, and one variant's compile in a worker.

Enumeration (tilelang_enumerate) and compilation (tilelang_compile) are TileLang's own
machinery driven the way vLLM drives it; this module translates between them and the
bundle: the key in tilelang_key's JSON form, the launch plan as a TileLangLaunch, the
kernel's source digest, and the nvcc record (with install paths replaced by placeholders,
so the same environment always yields the same manifest bytes).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from nojit.aot.deployment import Deployment
from nojit.loader.tilelang_key import key_to_json, source_hash


def add_to_plan(plan: Any, d: Deployment) -> None:
    from nojit.aot.tilelang_enumerate import MhcModelParams, enumerate_mhc_variants, kernel_module, resolve

    kernel_module()
    model = MhcModelParams.from_hf_config(d.hf_config)
    for v in enumerate_mhc_variants(model, d.max_num_batched_tokens, d.platform.deep_gemm):
        phase1, phase2 = v.key
        if phase2 != ():
            from nojit.loader.errors import BuildError

            raise BuildError(f"{v.kernel}: TileLang phase-2 key {phase2!r} is not empty; nojit cannot key it without "
                             "TileLang", fix="report this kernel to nojit")
        names = tuple(name for name, _ in v.compile_kwargs)
        if v.kernel not in plan.kernels:
            jit_impl = resolve(v.kernel)
            fn = jit_impl.func.orig_func
            plan.kernels[v.kernel] = {
                "runtime": "tilelang",
                "source_hash": source_hash(fn),
                "params": list(jit_impl.signature.parameters),
                "info": {"owner": v.owner, "tensor_args": sorted(jit_impl.func.tensor_args),
                         "file": os.path.basename(fn.__code__.co_filename)},
            }
        request = {
            "kernel": v.kernel, "key": key_to_json(names, phase1), "variant": "exact",
            "origin": f"registry:{v.owner}",
            "extra": {"variant": _variant_to_json(v)},
        }
        if not any(r["kernel"] == v.kernel and r["key"] == request["key"] for r in plan.requests):
            plan.requests.append(request)


def _variant_to_json(v: Any) -> dict[str, Any]:
    return {"kernel": v.kernel, "key": [list(v.key[0]), list(v.key[1])], "compile_kwargs": [list(kv) for kv in v.compile_kwargs],
            "owner": v.owner, "compile_key": [list(kv) for kv in v.compile_key], "call_args": list(v.call_args),
            "call_kwargs": list(v.call_kwargs), "defaults": [list(kv) for kv in v.defaults]}


def _variant_from_json(obj: dict[str, Any]) -> Any:
    from nojit.aot.tilelang_enumerate import TileLangVariant

    pairs = lambda items: tuple((k, v) for k, v in items)  # noqa: E731
    return TileLangVariant(
        kernel=obj["kernel"], key=(tuple(obj["key"][0]), tuple(obj["key"][1])),
        compile_kwargs=pairs(obj["compile_kwargs"]), owner=obj["owner"], compile_key=pairs(obj["compile_key"]),
        call_args=tuple(obj["call_args"]), call_kwargs=tuple(obj["call_kwargs"]), defaults=pairs(obj["defaults"]),
    )


def _portable_flags(flags: list[str]) -> list[str]:
    """nvcc flags with this machine's install paths replaced by placeholders."""
    import tilelang

    roots = {os.path.dirname(os.path.abspath(tilelang.__file__)): "<tilelang>"}
    out = []
    for f in flags:
        for root, name in roots.items():
            f = f.replace(root, name)
        out.append(f)
    return out


def compile_request(kernel: str, key: Any, extra: dict[str, Any], cache_dir: str) -> dict[str, Any]:
    """Runs in a build worker: compile one mHC variant, return the bundle pieces."""
    from nojit.aot.tilelang_compile import compile_variant
    from nojit.aot.tilelang_enumerate import resolve

    variant = _variant_from_json(extra["variant"])
    compiled = compile_variant(variant, os.path.join(cache_dir, "tilelang"))
    launch = {
        "symbol": compiled.symbol,
        "params": [{k: p[k] for k in ("kind", "name", "dtype", "ctype") if k in p} for p in compiled.params],
        "tensor_params": [{k: t[k] for k in ("name", "position", "dtype", "shape", "strides", "used_by_kernel")}
                          for t in compiled.tensor_params],
        "dynamic_vars": compiled.dynamic_vars,
        "grid": list(compiled.grid),
        "block": list(compiled.block),
        "dynamic_smem": compiled.dynamic_smem_bytes,
        "pdl": compiled.pdl,
        "cluster_dims": list(compiled.cluster_dims) if compiled.cluster_dims else None,
        "cooperative": compiled.cooperative,
    }
    record = compiled.compile_record
    fn = resolve(kernel).func.orig_func
    return {
        "cubin": compiled.cubin,
        "sha": hashlib.sha256(compiled.cubin).hexdigest(),
        "launch": launch,
        "source_hash": source_hash(fn),
        "tool": {"nvcc": record["nvcc_version"], "tilelang": record["tilelang_version"]},
        "kernel_info": {"nvcc_flags": _portable_flags(record["flags"]), "nvcc_version": record["nvcc_version"],
                        "arch": record["arch"], "lineinfo": False, "pass_configs": record["pass_configs"]},
    }


def recorded_request(kernel: str, key_json: dict[str, Any]) -> dict[str, Any]:
    """The compile inputs of a TileLang key recorded at serve time (NOJIT_MODE=record)."""
    args = [(name, tagged[1]) for name, tagged in key_json["args"]]
    return {"variant": {"kernel": kernel, "key": [[v for _, v in args], []], "compile_kwargs": [list(a) for a in args],
                        "owner": "recorded", "compile_key": [], "call_args": [], "call_kwargs": [n for n, _ in args],
                        "defaults": []}}
