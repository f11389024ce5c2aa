"""Make `.device-hg/` (ignored, never committed): what tests/gpu/check_humming_gemm.py needs on the device machine.

The device has Python 3.12, torch 2.11 and triton 3.6 but no Humming and no vLLM. Humming's GEMM kernels take
TMA descriptors and weights in Humming's repacked layout, so they are launched by Humming's own launcher, which
needs Humming itself there. This carries, verbatim:
  * site/humming and site/humming_kernels-<v>.dist-info: the installed humming-kernels package (pure Python,
    headers and its prebuilt native launcher; nojit's loader reads the version from the dist-info);
  * wheels/: cp312 manylinux wheels of Humming's missing dependencies (cuda-bindings matching the installed
    13.x, cuda-pathfinder, jinja2, markupsafe, safetensors, tabulate, tqdm, filelock, packaging), downloaded
    with `pip download --only-binary=:all: --python-version 3.12 --no-deps`; device_run.sh installs them with
    `pip install --no-index --no-deps --target`;
  * humming.nojit: the bundle whose Humming entries are served;
  * transform/: the two kernels of Humming's weight transform that the MXFP4 layers reach
    (`ProcessMxfp4W4A8Kernel` from process_fused_e8m0_scale, `RepackWeightKernel` from transform_humming_weight):
    vLLM runs them at weight loading, constructing them directly (not through compile_many), and the bundle
    does not hold them (a gap of the build: see the report of issue 12). They are compiled here by Humming's own
    compiler and seeded on the device by nojit's loader function (loader/humming_cache.py `seed`), as the
    bundle's kernels are;
  * humming_calls.json: the arguments of the first-forward calls vLLM makes into Humming for the deployment
    (layer config, compute config, tuning table per GEMM and the input schema), computed here with vLLM's and
    Humming's own configuration code (aot/runtimes/humming/enumerate.py `prepare_calls`), since vLLM is not there.

    python tools/prepare_humming_device.py --bundle .device/humming.nojit [--out .device-hg]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

WHEELS = ("cuda-bindings", "cuda-pathfinder", "jinja2", "markupsafe", "safetensors", "tabulate", "tqdm", "filelock",
          "packaging")
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64", "manylinux_2_28_x86_64")


def copy_humming(site: str) -> str:
    """The installed humming-kernels package and its dist-info, copied verbatim (no __pycache__)."""
    dist = importlib.metadata.distribution("humming-kernels")
    src_root = str(dist.locate_file(""))
    pkg = os.path.join(src_root, "humming")
    info = os.path.join(src_root, f"humming_kernels-{dist.version}.dist-info")
    os.makedirs(site, exist_ok=True)
    for src in (pkg, info):
        dst = os.path.join(site, os.path.basename(src))
        shutil.rmtree(dst, ignore_errors=True)
        shutil.copytree(src, dst, symlinks=False, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return dist.version


def download_wheels(dest: str) -> list[str]:
    os.makedirs(dest, exist_ok=True)
    pins = [f"{name}=={importlib.metadata.version(name)}" for name in WHEELS]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--python-version", "3.12",
           "--implementation", "cp", "--no-deps", "-d", dest]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + pins, check=True)
    return pins


def calls_json() -> dict:
    """The Humming calls of the deployment's routed experts, from vLLM's and Humming's own code (stand-in H200)."""
    from nojit.aot.deployment import load_deployment
    from nojit.aot.models.deepseek_v4.humming_moe import routed_experts
    from nojit.aot.runtimes.humming import standin
    from nojit.aot.runtimes.humming.enumerate import layer_schemas, prepare_calls
    from nojit.aot.vllm_env import install_deployment_platform

    d = load_deployment()
    install_deployment_platform(d.platform)
    standin.install(d.platform.device_name, d.platform.capability, d.platform.sm_count)
    out: dict = {"deployment": {"tensor_parallel_size": d.tensor_parallel_size, "dtype": d.dtype}, "layers": []}
    for moe in routed_experts(d):
        layer: dict = {"moe": dataclasses.asdict(moe), "gemms": {}}
        for call in prepare_calls(d, moe):
            if call.kernel_class.__name__ != "HummingKernel":
                continue
            layer_config, compute_config, tuning_config, _device = call.args
            layer["gemms"][call.op] = {"layer_config": layer_config, "compute_config": compute_config,
                                       "tuning_config": tuning_config}
        # the activations' schema vLLM gives Humming (oracle/mxfp4.py _humming_input_schema, then the fallback)
        _param_dtype, _weight_schema, input_schema = layer_schemas(d, moe)
        layer["input_schema"] = {"a_dtype": str(input_schema.a_dtype),
                                 "input_scale_group_size": input_schema.input_scale_group_size,
                                 "input_scale_dtype": str(input_schema.input_scale_dtype),
                                 "input_quant_mode": getattr(input_schema.input_quant_mode, "value",
                                                             input_schema.input_quant_mode)}
        out["layers"].append(layer)
    return out


def transform_kernel_specs(layer_configs: list[str]) -> list[tuple[str, dict]]:
    """(class, constructor arguments) of the weight-transform kernels transform_humming_tensors constructs for these
    layers (humming/transform.py: process_fused_e8m0_scale -> ops.process_mxfp4_w4a8_weight; transform_humming_weight
    -> ops.repack_weight with the arguments ops/weight.py `_repack_weight_op` passes)."""
    from humming import dtypes
    from humming.config import LayerConfig

    specs: dict[str, tuple[str, dict]] = {}
    for text in layer_configs:
        c = LayerConfig.from_str(text) if hasattr(LayerConfig, "from_str") else LayerConfig(**json.loads(text))
        if c.use_fused_e8m0_scale:
            specs["process"] = ("humming.kernel.process_mxfp4:ProcessMxfp4W4A8Kernel", {})
        raw = c.use_raw_weight or c.use_flat_weight or c.a_dtype.num_bits == c.b_dtype.num_bits
        if raw or c.use_ldmatrix_dequant or c.has_zero_point or c.b_dtype.is_integer_type:
            raise SystemExit(f"layer {text[:200]}: not the MXFP4 x FP8 transform this tool knows")
        args = {"weight_bits": c.b_dtype.num_bits, "activation_bits": c.a_dtype.num_bits, "is_weight_packed": True,
                "should_preprocess_for_int2fp": False, "should_preprocess_with_zp": False,
                "use_fused_e8m0_scale": bool(c.use_fused_e8m0_scale), "group_size_zp": 0,
                "use_packed_k_layout": bool(c.use_packed_k_layout), "use_native_dequant": bool(c.use_native_dequant)}
        assert c.a_dtype == dtypes.float8e4m3
        specs[json.dumps(args, sort_keys=True)] = ("humming.kernel.repack_weight:RepackWeightKernel", args)
    return list(specs.values())


def compile_transform_kernels(layer_configs: list[str], out: str) -> list[dict]:
    """Humming's own construction (and NVRTC compile) of each transform kernel, in a private cache; what nojit's
    seed needs (code, kernel_expr, sm, fast-math, post-process flag) beside the cubin."""
    import hashlib
    import importlib
    import tempfile

    os.environ["HUMMING_CACHE_DIR"] = tempfile.mkdtemp(prefix="nojit-hg-transform-")
    from nojit.aot.runtimes.humming.planner import nvrtc_library_dir

    lib = nvrtc_library_dir()  # the NVRTC child finds libnvrtc-builtins there, as in `nojit build`
    if lib:
        os.environ["LD_LIBRARY_PATH"] = ":".join(filter(None, [lib, os.environ.get("LD_LIBRARY_PATH")]))
    from humming.jit.runtime import KernelRuntime
    from humming.utils import jit as jit_utils

    jit_utils.get_humming_cache_dir.cache_clear()
    os.makedirs(out, exist_ok=True)
    entries = []
    for path, args in transform_kernel_specs(layer_configs):
        module, _, name = path.partition(":")
        cls = getattr(importlib.import_module(module), name)
        kernel = cls(**args)
        with open(kernel.kernel_filename, "rb") as f:
            cubin = f.read()
        digest = hashlib.sha256(cubin).hexdigest()
        with open(os.path.join(out, f"{digest}.cubin"), "wb") as f:
            f.write(cubin)
        entries.append({"class": path, "args": args, "compiler": KernelRuntime._get_compiler().__name__,
                        "sm_version": kernel.sm_version_str, "kernel_expr": getattr(kernel, "kernel_expr", None),
                        "code": kernel.code, "disable_fast_math": bool(cls.disable_fast_math), "postprocessed": True,
                        "cubin": f"{digest}.cubin", "sha256": digest})
    with open(os.path.join(out, "kernels.json"), "w") as f:
        json.dump(entries, f, indent=1)
    return entries


def bundle_has_transform_kernels(path: str) -> bool:
    from nojit.loader.bundle_file import Bundle

    ids = set(Bundle.open(path).kernel_ids())
    return {"humming.kernel.process_mxfp4:ProcessMxfp4W4A8Kernel", "humming.kernel.repack_weight:RepackWeightKernel"} <= ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, help="a bundle with the Humming entries (nojit build --runtime humming)")
    ap.add_argument("--out", default=".device-hg")
    ap.add_argument("--no-download", action="store_true", help="keep the wheels already in OUT/wheels")
    opts = ap.parse_args()
    version = copy_humming(os.path.join(opts.out, "site"))
    pins = [] if opts.no_download else download_wheels(os.path.join(opts.out, "wheels"))
    shutil.copyfile(opts.bundle, os.path.join(opts.out, "humming.nojit"))
    calls = calls_json()
    with open(os.path.join(opts.out, "humming_calls.json"), "w") as f:
        json.dump(calls, f, indent=1)
    configs = [g["layer_config"] for layer in calls["layers"] for g in layer["gemms"].values()]
    shutil.rmtree(os.path.join(opts.out, "transform"), ignore_errors=True)
    transform: list = []
    if not bundle_has_transform_kernels(opts.bundle):  # bundles built before the build enumerated them
        transform = compile_transform_kernels(configs, os.path.join(opts.out, "transform"))
    total = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(opts.out) for n in ns)
    print(f"{opts.out}: humming-kernels {version}, wheels {pins}, bundle {opts.bundle}, "
          f"{sum(len(layer['gemms']) for layer in calls['layers'])} GEMM calls, "
          f"{len(transform)} weight-transform kernels compiled here (0: the bundle holds them); {total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
