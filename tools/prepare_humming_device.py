"""Make `.device-hg/` (ignored, never committed): what tests/gpu/checks/check_humming_gemm.py and check_humming_jit.py need
on the device machine.

The device has Python 3.12, torch 2.11 and triton 3.6 but no Humming and no vLLM. Humming's GEMM kernels take
TMA descriptors and weights in Humming's repacked layout, so they are launched by Humming's own launcher, which
needs Humming itself there. This carries, verbatim:
  * site/humming and site/humming_kernels-<v>.dist-info: the installed humming-kernels package (pure Python,
    headers and its prebuilt native launcher; nojit's loader reads the version from the dist-info);
  * wheels/: cp312 manylinux wheels of Humming's missing dependencies (cuda-bindings matching the installed
    13.x, cuda-pathfinder, jinja2, markupsafe, safetensors, tabulate, tqdm, filelock, packaging), downloaded
    with `pip download --only-binary=:all: --python-version 3.12 --no-deps`; device_run.sh installs them with
    `pip install --no-index --no-deps --target`;
  * humming.nojit: the bundle whose Humming entries are served; it must hold the two weight-transform kernels vLLM's
    MXFP4 loading reaches (the build enumerates them: aot/runtimes/humming/enumerate.py `transform_kernels`), an
    older bundle is refused;
  * build_toolchain.json: this box's NVRTC library, options and CUDA headers as Humming uses them, so that the
    `humming-jit` step (tests/gpu/checks/check_humming_jit.py) can say what differs when its JIT's cubins do;
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


def build_toolchain() -> dict:
    """What Humming's NVRTC compile is made of on this box (tests/gpu/checks/check_humming_jit.py `describe_toolchain`, the
    one description the device step also makes): the device step names what differs when its JIT's cubins do."""
    import importlib.util

    from nojit.aot.runtimes.humming.planner import nvrtc_library_dir

    lib = nvrtc_library_dir()  # as the build's workers have it (planner.prepare_worker)
    if lib:
        os.environ["LD_LIBRARY_PATH"] = ":".join(filter(None, [lib, os.environ.get("LD_LIBRARY_PATH")]))
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "gpu", "checks", "check_humming_jit.py")
    spec = importlib.util.spec_from_file_location("check_humming_jit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.describe_toolchain()


def bundle_has_transform_kernels(path: str) -> bool:
    from nojit.loader.bundle.file import Bundle

    ids = set(Bundle.open(path).kernel_ids())
    return {"humming.kernel.process_mxfp4:ProcessMxfp4W4A8Kernel", "humming.kernel.repack_weight:RepackWeightKernel"} <= ids


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bundle", required=True, help="a bundle with the Humming entries (nojit build --runtime humming)")
    ap.add_argument("--out", default=".device-hg")
    ap.add_argument("--no-download", action="store_true", help="keep the wheels already in OUT/wheels")
    opts = ap.parse_args()
    os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")  # no background helper build when Humming loads
    if not bundle_has_transform_kernels(opts.bundle):
        raise SystemExit(f"{opts.bundle} lacks Humming's weight-transform kernels (ProcessMxfp4W4A8Kernel, "
                         "RepackWeightKernel): it was built before the build enumerated them; rebuild it with "
                         "`nojit build --runtime humming`")
    version = copy_humming(os.path.join(opts.out, "site"))
    pins = [] if opts.no_download else download_wheels(os.path.join(opts.out, "wheels"))
    shutil.copyfile(opts.bundle, os.path.join(opts.out, "humming.nojit"))
    calls = calls_json()
    with open(os.path.join(opts.out, "humming_calls.json"), "w") as f:
        json.dump(calls, f, indent=1)
    shutil.rmtree(os.path.join(opts.out, "transform"), ignore_errors=True)  # what older versions carried
    with open(os.path.join(opts.out, "build_toolchain.json"), "w") as f:
        json.dump(build_toolchain(), f, indent=1)
    total = sum(os.path.getsize(os.path.join(r, n)) for r, _, ns in os.walk(opts.out) for n in ns)
    print(f"{opts.out}: humming-kernels {version}, wheels {pins}, bundle {opts.bundle}, "
          f"{sum(len(layer['gemms']) for layer in calls['layers'])} GEMM calls, build toolchain recorded; "
          f"{total / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
