"""Run by tests/loader/runtimes/humming/test_serving.py in a subprocess (under `strace -f -e trace=execve` where available).

The serving process of a bundle with Humming entries: nojit installed (strict mode: firewall on, Humming's
compile step guarded), then Humming's own kernel creation for every bundled key, as its prepare_kernels does it
(`KernelRuntime.compile_many([(kernel class, arguments)])`: the object is constructed, renders its source and
asks `Compiler.compile`, which must find the cubin in its cache). No GPU here: a stand-in H200 answers Humming's
device questions and the launcher registration (`register_kernel`, a GPU call) is replaced by a counter; the
path from kernel object to cubin file is Humming's own. Then one key the bundle lacks.

Prints one JSON line. usage: probe_humming_serving.py BUNDLE MODE
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import sys
import time

bundle_path, mode = sys.argv[1], sys.argv[2]
order = sys.argv[3] if len(sys.argv) > 3 else "early"
late = order in ("late", "vllm", "transform")  # Humming imported after install, as in a vLLM worker
import traceback  # noqa: E402

processes: list[str] = []


def _audit(event, args):
    if event in ("subprocess.Popen", "os.exec", "os.posix_spawn", "os.system", "os.fork"):
        where = [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.lineno}" for f in traceback.extract_stack()[-12:-1]]
        processes.append(f"{event} {str(args)[:160]} at {' < '.join(reversed(where[-6:]))}")


sys.addaudithook(_audit)

from nojit.aot.runtimes.humming import standin  # noqa: E402  (a stand-in for the GPU: device facts only)
from nojit.loader.bundle.file import Bundle  # noqa: E402
from nojit.loader.errors import KernelNotInBundleError  # noqa: E402
from nojit.loader.install import install  # noqa: E402

if order in ("vllm", "transform"):  # vLLM's code computes Humming's configs below: the deployment's platform first
    from nojit.aot.vllm_env import install_deployment_platform  # noqa: E402
    from nojit.aot.deployment import load_deployment  # noqa: E402

    deployment = load_deployment()
    install_deployment_platform(deployment.platform)
if late:  # the stand-in goes in as soon as humming.device loads, before Humming's runtime (and nojit's seeding)
    from nojit.loader.strict.guards import RunAfterImport  # noqa: E402

    sys.meta_path.insert(0, RunAfterImport(lambda name: name == "humming.device",
                                           lambda: standin.install("NVIDIA H200", (9, 0), 132)))
else:
    standin.install("NVIDIA H200", (9, 0), 132)  # imports Humming (its runtime too): nojit seeds at install
before_install = list(processes)
t0 = time.perf_counter()
inst = install(bundle_path=bundle_path, mode=mode)
at_install = processes[len(before_install):]
del processes[:]
seeded_at_install = len(inst.state("humming").seeded)
import humming.jit.compiler  # noqa: E402,F401  (strict mode: guarded as it loads)
from humming.jit.runtime import KernelRuntime  # noqa: E402  (late: nojit seeds as this finishes loading)

at_import = list(processes)
del processes[:]

seed_s = time.perf_counter() - t0
out: dict = {"mode": mode, "late": late, "seeded_at_install": seeded_at_install,
             "processes_importing_humming": before_install + at_import, "processes_at_install": at_install, "seeded": len(inst.state("humming").seeded), "seed_s": round(seed_s, 3),
             "cache_dir": inst.state("humming").cache_dir}
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu", "checks"))
from check_humming_gemm import compile_step_guarded, count_compiles  # noqa: E402  (the Humming checks' one counter)

out["compile_step_guarded"] = compile_step_guarded()
compiles = count_compiles()  # every arrival at Humming's compile step; strict mode's guard behind it refuses

registered: list[str] = []
bundle = Bundle.open(bundle_path)
if order == "vllm":
    # The calls a vLLM worker makes at the first forward (HummingIndexedExperts.apply -> humming_forward ->
    # HummingKernel.prepare_kernels with vLLM's tuning table; may_process_input -> ProcessInputKernel.prepare_kernels),
    # with vLLM's own configuration code (aot/runtimes/humming/enumerate.py prepare_calls).
    from humming.kernel.humming import HummingKernel  # noqa: E402
    from humming.kernel.process_input import ProcessInputKernel  # noqa: E402

    from nojit.aot.models.deepseek_v4.humming_moe import routed_experts  # noqa: E402
    from nojit.aot.runtimes.humming.enumerate import prepare_calls  # noqa: E402

    def register(self):  # the launcher registration is a GPU call: counted, with the id Humming would get
        registered.append(self.kernel_filename)
        self.kernel_id = len(registered)

    HummingKernel.register_kernel = ProcessInputKernel.register_kernel = register
    served = collections.Counter()
    calls = [c for moe in routed_experts(deployment) for c in prepare_calls(deployment, moe)]
    out["processes_computing_configs"] = list(processes)  # importing vLLM's modules (platform.architecture: `file`)
    del processes[:]
    t1 = time.perf_counter()
    for call in calls:
        configs = call.run()
        served[call.op] += len(configs) // 4  # (min M, max M, kernel id, ...) per tuning interval
    out.update(load_s=round(time.perf_counter() - t1, 3), intervals_per_op=dict(served), registered=len(registered),
               compiles=list(compiles), processes=list(processes))
    print(json.dumps(out))
    sys.exit(0)
if order == "transform":
    # vLLM's weight loading of one MoE layer (quantization/utils/humming/moe.py `_prepare_and_transform_sublayer`
    # -> Humming's prepare_and_transform_humming_tensors) for w13 and w2, with vLLM's arguments
    # (aot/runtimes/humming/enumerate.py transform_calls), on CPU tensors of one expert that pass Humming's
    # `is_cuda` asserts. Humming's ops construct their kernels directly (found in Humming's cache, seeded from the
    # bundle); only the launch (a GPU call) is replaced by a counter that checks the cubin is the bundle's.
    from nojit.aot.models.deepseek_v4.humming_moe import routed_experts  # noqa: E402
    from nojit.aot.runtimes.humming.enumerate import _looks_cuda, transform_calls  # noqa: E402

    blobs = {e.blob for k in bundle.kernel_ids() for e in bundle.entries(k)}
    launched: collections.Counter = collections.Counter()
    import humming.ops.weight as weight_ops  # noqa: E402

    for cls in (weight_ops.ProcessMxfp4W4A8Kernel, weight_ops.RepackWeightKernel):
        def launch(self, *a, **k):
            with open(self.kernel_filename, "rb") as f:
                bundled = hashlib.sha256(f.read()).hexdigest() in blobs
            launched[f"{type(self).__name__}{'' if bundled else ' (cubin not bundled)'}"] += 1

        cls.__call__ = launch
    looks_cuda = _looks_cuda()
    calls = [c for moe in routed_experts(deployment) for c in transform_calls(deployment, moe)]
    out["processes_computing_configs"] = list(processes)
    del processes[:]
    t1 = time.perf_counter()
    per_op = {}
    for call in calls:
        before = sum(launched.values())
        config, tensors = call.run({k: v.as_subclass(looks_cuda) for k, v in call.tensors(1).items()}, num_experts=1)
        per_op[call.op] = sum(launched.values()) - before
        assert tensors["weight"].dtype.is_floating_point is False
    out.update(load_s=round(time.perf_counter() - t1, 3), launches_per_op=per_op, launched=dict(launched),
               hits=inst.state("humming").hits, compiles=list(compiles), processes=list(processes))
    # a transform kernel the bundle lacks, constructed directly as Humming's ops do
    try:
        weight_ops.RepackWeightKernel(weight_bits=4, activation_bits=8, is_weight_packed=True,
                                      should_preprocess_for_int2fp=False, should_preprocess_with_zp=False,
                                      use_fused_e8m0_scale=False, group_size_zp=0, use_packed_k_layout=True,
                                      use_native_dequant=False)
        out["miss"] = "compiled"
    except KernelNotInBundleError as exc:
        out["miss"] = f"{exc.message} | fix: {exc.fix}"
    except Exception as exc:  # record mode lets Humming compile: its compile step is refused by the test's guard
        out["miss"] = f"{type(exc).__name__}: {str(exc)[:500]}"
    out["miss_kernel"] = "humming.kernel.repack_weight:RepackWeightKernel"
    out["compiles_after_miss"] = list(compiles)
    print(json.dumps(out))
    sys.exit(0)
served = collections.Counter()
mismatched = []
t1 = time.perf_counter()
for kid in bundle.kernel_ids():
    if bundle.index.kernels[kid].runtime != "humming":
        continue
    module, _, name = kid.partition(":")
    cls = getattr(sys.modules.get(module) or __import__(module, fromlist=[name]), name)
    cls.register_kernel = lambda self: registered.append(self.kernel_filename)  # GPU call: counted instead
    for e in bundle.entries(kid):
        args = dict(e.key["args"])
        [kernel] = KernelRuntime.compile_many([(cls, args)], 0)  # Humming's own creation path (prepare_kernels)
        with open(kernel.kernel_filename, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != e.blob:
                mismatched.append(kernel.kernel_filename)
        served[e.origin] += 1
out["load_s"] = round(time.perf_counter() - t1, 3)
out["served_per_op"] = dict(served)
out["registered"] = len(registered)
out["cubin_not_bundled"] = mismatched
out["compiles"] = list(compiles)
out["processes"] = list(processes)

# a configuration the bundle lacks: the first bundled key with one tuning value changed
first_id = next(k for k in bundle.kernel_ids() if bundle.index.kernels[k].runtime == "humming")
first = bundle.entries(first_id)[0]
args = dict(first.key["args"])
if "num_stages" in args:
    args["num_stages"] += 1
else:
    args["values_per_thread"] *= 2
miss_module, _, miss_name = first_id.partition(":")
miss_cls = getattr(sys.modules[miss_module], miss_name)
try:
    KernelRuntime.compile_many([(miss_cls, args)], 0)
    out["miss"] = "compiled"
except KernelNotInBundleError as exc:
    out["miss"] = f"{exc.message} | fix: {exc.fix}"
except Exception as exc:  # record mode lets Humming compile: its compile step is refused by the test's guard
    out["miss"] = f"{type(exc).__name__}: {str(exc)[:500]}"
out["miss_kernel"] = first_id
out["compiles_after_miss"] = list(compiles)
print(json.dumps(out))
