"""Issue 8, Must show 1: a vLLM worker's JIT warmup in strict mode, with an empty TRITON_CACHE_DIR, on a CPU box.

nojit is loaded through vLLM's own plugin loader; vLLM's real `JitWarmupRegistry` holds vLLM's
real DeepSeek-V4 and V2-runner warmup owners with the registrations the model and runner make
for the default deployment (restricted to the owners a small bundle, built here with the CLI,
was built for); `registry.warmup()` runs with a dry-run launcher standing for the GPU. Checked:
every key vLLM declares resolves to its bundle entry (the set equals the build's plan, which
came from vLLM's own declarations), nothing compiles (Triton's post-compile hook, TileLang's
JITImpl.compile and CuTeDSL's cute.compile counted, vLLM's JIT monitor on in error mode), no
compiler process starts (strace -f, execve/execveat), Triton's cache stays empty and Triton's
real driver is never created, and every bundled module is loaded before capture would begin.
The preflight test adds owners the bundle lacks: one message lists every missing key.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.support.common import ROOT, have, run_cli

# DeepSeek-V4 owners (3 report kernels), one V2-runner owner (top-p statistics) and one TileLang
# mHC owner: 21 Triton keys and 1 TileLang key, about 2 minutes to build on 2 cores. The whole
# registry of the default deployment (292 Triton + 40 TileLang keys) works the same way; pass
# NOJIT_TEST_REGISTRY_KERNELS=all to build and check it (about 15 minutes).
REGISTRY_SUBSET = ("BuildC128ATopkMetadataKernel,MTPSharedHeadRMSNormKernel,ComputePrefillMetadataKernel,"
                   "_topp_sb_stats_kernel,mhc_post")
CUTEDSL_OWNER = "vllm.models.deepseek_v4.nvidia.ops.dequant_gather_k_cutedsl:_DEQUANT_GATHER_K_CACHE_CUTEDSL_KERNEL"
SCENARIO = os.path.join(ROOT, "tests", "probes", "probe_vllm_startup.py")
COMPILER = re.compile(r"^(?:[a-z0-9_]+-linux-gnu-)?(?:gcc|g\+\+|cc|c\+\+|cpp|clang|clang\+\+|nvcc|ptxas|cicc|nvlink|"
                      r"fatbinary|ld|ld\.gold|ld\.bfd|ld\.lld|as|ninja|cc1|cc1plus|collect2|nvrtc)(?:-[0-9.]+)?$")

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed")]


@pytest.fixture(scope="module")
def registry_bundle(tmp_path_factory):
    prebuilt = os.environ.get("NOJIT_TEST_REGISTRY_BUNDLE")  # BUNDLE, with its plan at BUNDLE.plan.json
    if prebuilt:
        return {"bundle": prebuilt, "plan": prebuilt + ".plan.json"}
    d = tmp_path_factory.mktemp("registry")
    bundle, plan = str(d / "registry.nojit"), str(d / "registry.plan.json")
    kernels = os.environ.get("NOJIT_TEST_REGISTRY_KERNELS", REGISTRY_SUBSET)
    args = ["build", "--no-generic", "-o", bundle, "--emit-plan", plan, "--cache-dir", str(d / "cache"), "--quiet"]
    if kernels != "all":
        args += ["--kernels", kernels]
    run_cli(*args)
    return {"bundle": bundle, "plan": plan}


def run_scenario(tmp_path, registry_bundle, *extra: str, nojit: bool = True) -> tuple[dict, list[str] | None]:
    """Run the scenario in a fresh process (under strace when installed); its report and exec'd programs."""
    cache = tmp_path / "triton-cache"
    cache.mkdir()
    out = tmp_path / "report.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_CACHE_DIR": str(cache), "NOJIT_MODE": "strict",
           "TILELANG_CACHE_DIR": str(tmp_path / "tilelang-cache"), "VLLM_PLUGINS": "nojit"}
    if nojit:
        env["NOJIT_BUNDLE"] = registry_bundle["bundle"]
    else:
        env.pop("NOJIT_BUNDLE", None)
    cmd = [sys.executable, SCENARIO, "--plan", registry_bundle["plan"], "--out", str(out), *extra,
           *([] if nojit else ["--no-nojit"])]
    trace = tmp_path / "exec.trace"
    strace = shutil.which("strace")
    if strace:
        cmd = [strace, "-f", "-qq", "-e", "trace=execve,execveat", "-o", str(trace), *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1800)
    assert out.exists(), f"the scenario wrote no report (exit {p.returncode})\n{p.stderr[-4000:]}"
    report = json.loads(out.read_text())
    report["stderr"] = p.stderr
    programs = None
    if strace:
        # an exec the kernel's allow-list refused (loader/strict/landlock.py): nothing legitimate may be among them
        report["exec_refused"] = [line for line in trace.read_text().splitlines() if "exec" in line and "EACCES" in line]
        programs = [(path, re.findall(r'"((?:[^"\\]|\\.)*)"', argv)) for path, argv in
                    re.findall(r'exec(?:ve|veat)\((?:\d+, )?"([^"]*)", \[(.*?)\]', trace.read_text())]
    return report, programs


VERSION_PROBES = frozenset({"--version", "-V", "-v", "-dumpversion", "-dumpfullversion", "--help"})


def compiler_runs(programs: list[tuple[str, list[str]]], report: dict) -> tuple[list, list]:
    """(compiles, probes): compiler programs started other than nojit's firewall stand-ins, split into
    version probes (argv is only a version flag: nothing is compiled) and everything else."""
    env = report.get("env") or {}
    standins = [d for d in [env.get("NOJIT_FIREWALL_DIR") or ""] if d]  # the firewall's stand-in folder
    compiles, probes = [], []
    for path, argv in programs:
        if not COMPILER.match(os.path.basename(path)) or any(path.startswith(d + os.sep) for d in standins):
            continue
        (probes if argv[1:] and set(argv[1:]) <= VERSION_PROBES else compiles).append((path, argv))
    return compiles, probes


def plan_registry_keys(plan_path: str) -> set[tuple[str, str]]:
    """(kernel, key) of every key vLLM's own warmup declarations gave the build."""
    plan = json.load(open(plan_path))
    return {(r["kernel"], json.dumps(r["key"], sort_keys=True)) for r in plan["requests"]
            if r["origin"].startswith("registry:")}


def test_strict_warmup_with_empty_triton_cache_compiles_nothing(tmp_path, registry_bundle):
    report, programs = run_scenario(tmp_path, registry_bundle)
    assert "error" not in report, report["error"]["trace"] + report["stderr"][-3000:]
    expected = plan_registry_keys(registry_bundle["plan"])
    assert expected, "the plan declares no registry keys: the check would prove nothing"
    served = {tuple(x) for x in report["served"]}
    assert served == expected, (sorted(expected - served), sorted(served - expected))
    assert report["compiles"]["triton"] == 0 and report["compiles"]["tilelang"] == 0
    assert report["compiles"]["cutedsl"] == 0
    assert report["nojit"]["unserved"] == []
    assert report["nojit"]["keys"].get("Triton", 0) > 0 and report["nojit"]["keys"].get("TileLang", 0) > 0
    entries = sum(1 for _ in json.load(open(registry_bundle["plan"]))["requests"])
    from nojit.loader.bundle.file import Bundle

    blobs = len({e.blob for e in Bundle.open(registry_bundle["bundle"]).manifest.entries})
    assert report["nojit"]["preloaded"] == entries and report["dry"]["loads"] == blobs  # a cubin loads once
    assert report["dry"]["launches"] == 0  # warmup resolves keys; nothing of the registry is autotuned here
    assert report["triton_cache_before"] == [] and report["triton_cache_after"] == []
    assert report["triton_real_driver_created"] is False
    assert "nojit[pid" in report["stderr"] and "mode strict" in report["stderr"]
    from nojit.loader.strict import landlock

    if landlock.abi_version() is not None:  # the real startup path runs under the exec allow-list
        assert "exec allow-list on (Landlock ABI" in report["stderr"], report["stderr"][-3000:]
        # and with every compiler unreadable to the tree (loader/strict/unreadable.py): the start still passes
        assert re.search(r"; [1-9][0-9]* compilers unreadable", report["stderr"]), report["stderr"][-3000:]
        print(*[line for line in report["stderr"].splitlines() if line.startswith("nojit[pid")], sep="\n")
    # strict mode's JIT block (loader/unserved.py): the registry bundle holds some runtimes, not all
    assert "JITs this process can reach that the bundle does not serve" in report["stderr"], report["stderr"][-3000:]
    if programs is None:
        pytest.skip("strace is not installed (apt-get install -y strace): the exec trace was not checked")
    compiles, probes = compiler_runs(programs, report)
    assert programs and compiles == [], compiles
    assert report["exec_refused"] == [], report["exec_refused"]  # nothing legitimate refused by the kernel
    # Version probes of the real toolkit (Humming asks `$CUDA_HOME/bin/nvcc -V` at import) are not compiles;
    # with the compiler firewall they are answered by its stand-ins instead.
    print("version probes:", probes)


def test_strict_preflight_names_every_missing_key_in_one_message(tmp_path, registry_bundle):
    # Two more V2-runner owners that the bundle was not built for (16 + 8 keys vLLM declares) and the CuTeDSL
    # dequant-gather-K owner DeepSeek-V4's attention registers (attention.py:463; 3 keys): none is compiled.
    report, programs = run_scenario(tmp_path, registry_bundle, "--extra-owner", "_topp_sb_step_kernel",
                                    "--extra-owner", "_topp_sb_mask_kernel", "--extra-cutedsl", CUTEDSL_OWNER)
    assert report.get("error", {}).get("type") == "PreflightError", report
    message = report["error"]["message"]
    listed = [line for line in message.splitlines() if line.startswith("  Triton")]
    assert len([x for x in listed if "_topp_split_step" in x]) == 16, message
    assert len([x for x in listed if "_topp_split_mask" in x]) == 8, message
    cutedsl = [line for line in message.splitlines() if line.startswith("  CuTeDSL")]
    assert len(cutedsl) == 3 and all("not in the bundle" in x for x in cutedsl), message
    assert f"{len(listed) + len(cutedsl)} of them are not served" in message
    assert "fix:" in message and "--add-keys" in message
    assert report["compiles"]["cutedsl"] == 0
    assert report["compiles"]["triton"] == 0 and report["compiles"]["tilelang"] == 0
    if programs is not None:
        assert compiler_runs(programs, report)[0] == []


def test_the_counters_see_compiles_without_nojit(tmp_path, registry_bundle):
    """The control: the same registry without nojit compiles (so zero above means nothing compiled), and
    its time is the baseline the closing note compares with."""
    report, _ = run_scenario(tmp_path, registry_bundle, nojit=False)
    assert "error" not in report, report["error"]["trace"]
    assert report["compiles"]["triton"] > 0
    print(f"registry warmup without nojit: {report['warmup_seconds']:.1f} s")


PROCESS_MODEL = '''
import json, multiprocessing as mp, os, sys

def state():
    from nojit.loader.install import current
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry
    c = current()
    utils = sys.modules.get("vllm.tilelang_utils")
    return {"pid": os.getpid(), "kernels": None if c is None else sorted(c.servers("triton")),
            "tilelang_routed": bool(getattr(utils, "__nojit__", False)),  # mHC kernels get servers at decoration
            "registry_hooked": getattr(JitWarmupRegistry.warmup, "__nojit__", False)}

def child(q):
    from vllm.plugins import load_general_plugins
    load_general_plugins()  # what vLLM's engine core and worker_base.init_worker do
    q.put(state())

if __name__ == "__main__":
    from vllm.plugins import load_general_plugins
    load_general_plugins()  # the API server
    out = {"parent": state()}
    for method in ("fork", "spawn"):
        ctx = mp.get_context(method)
        q = ctx.Queue()
        p = ctx.Process(target=child, args=(q,))
        p.start()
        out[method] = q.get(timeout=900)
        p.join()
    print("RESULT " + json.dumps(out))
'''


def test_plugin_in_vllms_process_model_fork_and_spawn(tmp_path, registry_bundle):
    """vLLM's plugin loader in a parent (the API server), a forked child and a spawned child (engine core,
    workers): each ends up serving the bundle with the registry hooked; a forked one inherits it, a spawned
    one installs it itself and says so on its own line."""
    script = tmp_path / "process_model.py"
    script.write_text(PROCESS_MODEL)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "NOJIT_BUNDLE": registry_bundle["bundle"], "NOJIT_MODE": "strict",
           "VLLM_PLUGINS": "nojit"}
    p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=1800)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, p.stderr[-4000:]
    out = json.loads(line[0].removeprefix("RESULT "))
    plan = json.load(open(registry_bundle["plan"]))["kernels"]
    kernels = sorted(k for k, v in plan.items() if v["runtime"] == "triton")
    for role in ("parent", "fork", "spawn"):
        assert out[role]["kernels"] == kernels, (role, out)
        assert out[role]["tilelang_routed"] and out[role]["registry_hooked"], (role, out)
    pids = {out[r]["pid"] for r in ("parent", "fork", "spawn")}
    assert len(pids) == 3
    announced = set(re.findall(r"nojit\[pid (\d+)\]: \S+ \(vLLM", p.stderr))
    assert announced == {str(out["parent"]["pid"]), str(out["spawn"]["pid"])}, p.stderr[-3000:]


def test_without_a_bundle_the_plugin_does_nothing(tmp_path):
    code = ("from vllm.plugins import load_general_plugins; load_general_plugins(); "
            "from nojit.loader.install import current; import sys; "
            "print('installed', current(), 'triton' in sys.modules and 'hooked' or '', flush=True); "
            "from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry; "
            "print('hooked', getattr(JitWarmupRegistry.warmup, '__nojit__', False))")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "VLLM_PLUGINS": "nojit"}
    env.pop("NOJIT_BUNDLE", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=900)
    assert "installed None" in p.stdout and "hooked False" in p.stdout, p.stderr[-3000:]
    assert "nojit[" not in p.stderr
