"""H200 check (issue 23): one strict serving process runs every runtime of one bundle, a composed step, one CUDA graph.

Run from the repository root on the device with the payload of tools/prepare_one_device.py (tests/gpu/device_run.sh,
step `one`, does the setup: the Triton entries built there from the plan and merged with the rest of the bundle, the
JIT reference run of vLLM's call sites, CuTeDSL's link step, the process guard preloaded, no compiler on PATH):
    LD_PRELOAD=libnojit_exec_guard.so CUDA_DISABLE_PTX_JIT=1 \
        python3 tests/gpu/checks/check_one_process.py --bundle B.nojit --plan P.json --jit-json J.json --json OUT
    python3 tests/gpu/checks/check_one_process.py --role negative --bundle B-minus-one.nojit --plan P.json
    python3 tests/gpu/checks/check_one_process.py --role without --bundle B.nojit --out B2.nojit --drop-runtime triton
    python3 tests/gpu/checks/check_one_process.py --role cutedsl-link --bundle B.nojit --work DIR   (harness, before)
    python3 tests/gpu/checks/check_one_process.py --role deepgemm-jit --plan P --sample 4 --seed S --json OUT (JIT side)
    python3 tests/gpu/checks/check_one_process.py --role deepgemm-build     (harness: DeepGEMM's carried sources, nvcc here)
    python3 tests/gpu/checks/check_one_process.py --role table --json OUT --jit-json J.json --plan P  (time to ready)

One process (role `one`), in this order, each stage timed (wall ms, host RSS and GPU memory added):
  * start: the C guard (tests/gpu/checks/exec_guard.c) counts every fork/exec/spawn/popen/system and nvrtcCompileProgram, an
    audit hook every Python process start, TileLang's import is refused; vLLM's files carried verbatim are mounted
    (tests/gpu/checks/vllm_mount.py) and the call-site modules imported, so that install() finds vLLM's kernels;
  * install: `nojit.loader.install.install()` once, strict, the one bundle: Triton, TileLang, FlashInfer, Humming
    through install() itself; DeepGEMM from the same bundle's section through DeepGEMM's own cache lookup
    (loader/runtimes/deepgemm/cache.py seed + the popen firewall, as check_deepgemm.py: vLLM's `vllm.utils.deep_gemm` wrapper is
    not on the device; for a bundle without DeepGEMM, the section in .device-dg/section, said in the output);
    CuTeDSL's objects of the same bundle through CuTeDSL's C runtime (its MLIR library, which
    `cute.runtime.load_module` needs, is not carried: the objects were linked by the harness before this process);
  * preflight: every exact key of the plan (what vLLM's registry and nojit's derived call sites declare for the
    deployment) must be an entry of the bundle, then every kernel is prepared (source, section, tables); a key the
    bundle lacks fails the start with one PreflightError listing every such key (loader/vllm_registry.py's message);
  * preload: every Triton and TileLang module loaded on the GPU; CuTeDSL's linked objects loaded by TVM-FFI;
    FlashInfer, Humming and DeepGEMM load their modules at first use (said in the table);
  * the composed step, each library's real calls with the per-library checks' own code, outputs poisoned and checked
    against their independent references: vLLM's Triton call sites (prefill, decode, mixed, MTP, sampling) against
    Triton's JIT run in another process on the same seeded inputs (check_call_sites.py), the mHC kernels against
    float64 (check_tilelang.py), DeepGEMM's ops against float32 (check_deepgemm.py), FlashInfer's sampling and
    block-FP8 GEMM against torch (check_flashinfer_launch.py), CuTeDSL's objects against that check's torch/float64
    references (vLLM's Triton paths of those ops are not bundled: vLLM takes CuTeDSL on sm_90, and strict mode
    compiles nothing), Humming's MoE GEMM against float64 (check_humming_gemm.py). install() is called
    once: each check's own install() returns that installation here;
  * one CUDA graph: a decode-sized call of each library captured together, replayed from poisoned outputs, compared
    byte for byte with the eager call (CuTeDSL: its output spoiled, replay must pass the reference check again);
  * counters over the whole process after imports: 0 compiles, 0 processes, 0 NVRTC calls, 0 in-process compiles
    refused by strict mode's patched entries (PTX or IR given to libcuda's image loaders or linker, NVRTC, nvJitLink:
    counted, since CUDA_DISABLE_PTX_JIT=1 alone does not stop a raw PTX load on driver 580).
Prints the per-library table, the time-to-ready table, and `RESULT: PASS` only if all six runtimes ran and passed.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import random
import sys
import tempfile
import time
import traceback
import types
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
RUNTIMES = ("triton", "tilelang", "deepgemm", "flashinfer", "cutedsl", "humming")
DECODE_TOKENS = 64  # the composed step's decode batch (requests x 1 token)
PROCESS_EVENTS = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty")
_python_processes: list[str] = []


def _audit(event: str, args: tuple) -> None:
    if event.startswith(PROCESS_EVENTS):
        _python_processes.append(f"{event} {str(args)[:160]}")


# ------------------------------------------------------------------------------------------ measuring
def rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def gpu_used_mib() -> float:
    import torch

    free, total = torch.cuda.mem_get_info()
    return (total - free) / 2**20


def process_age_s() -> float:
    """Seconds since this process started (from /proc: what 'from process start' means in the table)."""
    with open("/proc/self/stat") as f:
        start_ticks = int(f.read().rpartition(")")[2].split()[19])
    with open("/proc/uptime") as f:
        up = float(f.read().split()[0])
    return up - start_ticks / os.sysconf("SC_CLK_TCK")


class Ledger:
    """Per (runtime, stage): wall ms, host RSS and GPU memory added, and what was loaded."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str], dict[str, Any]] = {}

    def measure(self, runtime: str, stage: str) -> "_Measure":
        return _Measure(self, runtime, stage)

    def add(self, runtime: str, stage: str, ms: float, rss: float = 0.0, gpu: float = 0.0, loaded: str = "") -> None:
        r = self.rows.setdefault((runtime, stage), {"ms": 0.0, "rss_mib": 0.0, "gpu_mib": 0.0, "loaded": ""})
        r["ms"] += ms
        r["rss_mib"] += rss
        r["gpu_mib"] += gpu
        if loaded:
            r["loaded"] = loaded


class _Measure:
    def __init__(self, ledger: Ledger, runtime: str, stage: str) -> None:
        self.ledger, self.runtime, self.stage, self.loaded = ledger, runtime, stage, ""

    def __enter__(self) -> "_Measure":
        import torch

        torch.cuda.synchronize()
        self.t0, self.r0, self.g0 = time.perf_counter(), rss_kib(), gpu_used_mib()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.cuda.synchronize()
        self.ledger.add(self.runtime, self.stage, (time.perf_counter() - self.t0) * 1e3, (rss_kib() - self.r0) / 1024,
                        gpu_used_mib() - self.g0, self.loaded)


def process_guard() -> Any:
    """The preloaded C guard, or None (check_flashinfer_launch.process_guard: the one reader of its counters)."""
    from check_flashinfer_launch import process_guard as guard

    return guard()


# ------------------------------------------------------------------------------------------ bundle surgery
def bundle_without(src: str, dst: str, drop_runtimes: frozenset[str] = frozenset(), drop_entry: int | None = None,
                   only_runtimes: frozenset[str] | None = None, drop_if: Callable[[Any], bool] | None = None) -> str:
    """Write src's kernels and entries into dst less some: whole runtimes, the drop_entry-th exact Triton entry
    (sorted by kernel and key; the negative control), or every entry drop_if(entry) picks (other runtimes' negative
    controls). Returns a description of what was dropped. Nothing is recompiled: the writer of `nojit build` lays
    out the same records and blobs."""
    from nojit.aot.bundle_writer import write_bundle
    from nojit.loader.bundle.file import Bundle, canonical_json

    b = Bundle.open(src)
    m = b.manifest
    keep = {k for k, r in m.kernels.items() if r.runtime not in drop_runtimes
            and (only_runtimes is None or r.runtime in only_runtimes)}
    entries = [e for e in m.entries if e.kernel in keep]
    dropped = f"runtimes {sorted(drop_runtimes)}" if drop_runtimes else ""
    if drop_entry is not None:
        exact = sorted((e for e in entries if m.kernels[e.kernel].runtime == "triton" and e.variant == "exact"),
                       key=lambda e: (e.kernel, canonical_json(e.key)))
        victim = exact[drop_entry % len(exact)]
        entries = [e for e in entries if e is not victim]
        dropped = f"{victim.kernel} {canonical_json(victim.key).decode()}"
    if drop_if is not None:
        victims = [e for e in entries if drop_if(e)]
        entries = [e for e in entries if not drop_if(e)]
        dropped = "; ".join(f"{v.kernel} {canonical_json(v.key).decode()}" for v in victims)
    cubins = {e.blob: b.read_blob(e.blob) for e in entries}
    write_bundle(dst, m.producer, m.target, m.deployment, [m.kernels[k] for k in keep], entries, cubins)
    return dropped


# ------------------------------------------------------------------------------------------ preflight
_PLANS: dict[tuple, tuple[dict[str, str], list[tuple[str, str, bytes]]]] = {}  # plan file stamp -> parsed
_HAVE: dict[tuple, dict[str, set[bytes]]] = {}  # (bundle path, index id) -> kernel -> its exact keys (canonical)


def _plan_requests(plan_path: str) -> tuple[dict[str, str], list[tuple[str, str, bytes]]]:
    """The plan's kernel runtimes and exact requests (kernel, runtime, canonical key), parsed once per process
    while the file is the same (inode, size, mtime): the preflight of each runtime read and parsed the whole
    ~2 MB plan again (about 25 ms a runtime on the H200, session 8)."""
    from nojit.loader.bundle.file import canonical_json

    st = os.stat(plan_path)
    stamp = (os.path.realpath(plan_path), st.st_ino, st.st_size, st.st_mtime_ns)
    parsed = _PLANS.get(stamp)
    if parsed is None:
        with open(plan_path) as f:
            plan = json.load(f)
        runtime_of = {k: v["runtime"] for k, v in plan["kernels"].items()}
        exact = [(r["kernel"], runtime_of.get(r["kernel"]), canonical_json(r["key"])) for r in plan["requests"]
                 if r["variant"] == "exact"]
        parsed = _PLANS[stamp] = (runtime_of, exact)
    return parsed


def plan_preflight(bundle: Any, plan_path: str, runtimes: set[str]) -> dict[str, int]:
    """Every exact key the plan declares for a runtime of this bundle must be one of its entries. Raises one
    PreflightError listing every key that is not (loader/vllm_registry.py's message); returns declared keys per
    runtime."""
    from nojit.loader.bundle.file import canonical_json
    from nojit.loader.errors import PreflightError
    from nojit.loader.vllm_registry import Unserved, _preflight_message

    _runtime_of, exact = _plan_requests(plan_path)
    have = _HAVE.setdefault((bundle.path, id(bundle.index)), {})
    kernels = bundle.index.kernels
    declared: dict[str, int] = {}
    unserved = []
    for kernel, rt, key in exact:
        if rt not in runtimes:
            continue
        declared[rt] = declared.get(rt, 0) + 1
        keys = have.get(kernel)
        if keys is None:  # the kernel's exact entries only, as a server's prepare reads them (and then reuses them)
            keys = have[kernel] = ({canonical_json(e.key) for e in bundle.entries_of_variant(kernel, "exact")}
                                   if kernel in kernels else set())
        if key not in keys:
            reason = "kernel not in the bundle" if kernel not in kernels else "key not in the bundle"
            unserved.append(Unserved(rt, kernel, key.decode()[:200], reason))
    if unserved:
        raise PreflightError(_preflight_message(unserved, sum(declared.values()), bundle.path),
                             fix="add the missing keys to the bundle (`nojit build --add-keys`), or rebuild it")
    return declared


# ------------------------------------------------------------------------------------------ the start
class Start:
    """What the start made: the installation, the vLLM mount, per-runtime state."""

    def __init__(self, args: argparse.Namespace, ledger: Ledger) -> None:
        self.args, self.ledger = args, ledger
        self.inst: Any = None
        self.finder: Any = None
        self.present: set[str] = set()
        self.notes: dict[str, Any] = {}
        self.dg: Any = None
        self.dg_firewall: Any = None
        self.dg_section: dict | None = None
        self.dg_root = ""
        self.cute_entries: list[dict] = []
        self.cute_fns: dict[str, Any] = {}
        self.bundle_runtimes: set[str] = set()
        self.tilelang_blocker: Any = None


def start(args: argparse.Namespace, ledger: Ledger) -> Start:
    """Mount, install once, preflight, preload (the negative control runs the same start on its bundle)."""
    import torch

    from nojit.loader.bundle.file import Bundle

    s = Start(args, ledger)
    records = Bundle.open(args.bundle).manifest.kernels
    s.present = {r.runtime for r in records.values()}
    s.bundle_runtimes = set(s.present)
    with ledger.measure("all", "mount vLLM files + import call sites"):
        import vllm_mount

        s.finder = vllm_mount.mount(args.vllm_src)
        vllm_mount.mount = lambda root: s.finder  # each check's own mount gets this one
        import call_site_steps

        call_site_steps.import_call_sites()
    mounted = {k for k, r in records.items() if r.runtime == "triton"
               and getattr(sys.modules.get(k.partition(":")[0]), "__file__", None)}
    wanted = mounted | {k for k, r in records.items() if r.runtime in ("tilelang", "flashinfer", "humming")}
    s.notes["triton-mounted"] = f"{len(mounted)}/{sum(r.runtime == 'triton' for r in records.values())}"
    from nojit.loader.install import install

    t0, r0, g0 = time.perf_counter(), rss_kib(), gpu_used_mib()
    # the device has no vLLM (the bundle names 0.33.0); vLLM's verbatim modules may hash differently from the
    # extracted copies the Triton entries were built from (check_call_sites.py says why): both allowed, printed
    s.inst = install(args.bundle, mode="strict", allow_mismatch=frozenset({"vllm", "source"}), kernels=wanted)
    total = (time.perf_counter() - t0) * 1e3
    for step, ms in s.inst.timings.items():
        rt = step if step in RUNTIMES else "all"
        ledger.add(rt, "install", ms)
    ledger.add("all", "install (memory)", 0.0, (rss_kib() - r0) / 1024, gpu_used_mib() - g0)
    s.notes["install_total_ms"] = f"{total:.1f}"
    s.notes["install_steps_ms"] = {step: round(ms, 1) for step, ms in s.inst.timings.items()}  # what 'all' is made of
    from nojit.loader.strict import landlock

    ll = landlock.report()
    if ll is not None:  # the Landlock step's own split (find, plan, read rules, apply) and its rule count
        s.notes["landlock_split_ms"] = {**ll.steps, "state": ll.state, "rules": ll.rules}
    import nojit.loader.install as install_module

    install_module.install = lambda *a, **k: s.inst  # install() once per process: every check gets this one
    section_dir = os.path.join(args.deepgemm_dir, "section")
    if "deepgemm" not in s.present and os.path.isfile(os.path.join(section_dir, "section.json")):
        # a bundle built without DeepGEMM: its entries from tools/prepare_deepgemm_device.py's section (the same
        # format, loader/runtimes/deepgemm/cache.py), said in the table: not one bundle for this runtime
        s.present.add("deepgemm")
        s.notes["deepgemm"] = f"entries from {section_dir} (prepare_deepgemm_device.py), not from the bundle"
    if "deepgemm" in s.present:
        with ledger.measure("deepgemm", "install") as m:
            _install_deepgemm(s, records, section_dir if "deepgemm" in s.notes else None)
            m.loaded = f"{len(s.dg_section['entries'])} cache entries seeded"
    if "cutedsl" in s.present:
        with ledger.measure("cutedsl", "install") as m:
            with open(os.path.join(args.cutedsl_work, "entries.json")) as f:
                s.cute_entries = json.load(f)
            m.loaded = f"{len(s.cute_entries)} linked objects found"
    # preflight: the plan's keys against the bundle, then every kernel prepared
    bundle = s.inst.bundle
    t0 = time.perf_counter()
    _plan_requests(args.plan)  # the ~2 MB plan file parsed once, apart: this check's stand-in for vLLM's warmup keys
    s.notes["plan_file_parse_ms"] = round((time.perf_counter() - t0) * 1e3, 1)  # a harness cost, not a server's
    for rt in RUNTIMES:
        if rt not in s.present:
            continue
        if rt == "deepgemm" and "deepgemm" in s.notes:
            continue  # not in the bundle: nothing of the bundle to check its keys against
        with ledger.measure(rt, "preflight") as m:
            t0 = time.perf_counter()
            declared = plan_preflight(bundle, args.plan, {rt})
            t1 = time.perf_counter()
            servers = {"triton": s.inst.servers("triton"), "tilelang": s.inst.servers("tilelang")}.get(rt, {})
            with _source_checks_counted() as by_cache_key:
                for server in servers.values():
                    server.prepare()
            m.loaded = f"{declared.get(rt, 0)} keys"
            s.notes.setdefault("preflight_split_ms", {})[rt] = {
                "plan": round((t1 - t0) * 1e3, 1), "prepare": round((time.perf_counter() - t1) * 1e3, 1),
                "kernels": len(servers), "sources proven by Triton's cache_key": len(by_cache_key),
                "their ms": round(sum(by_cache_key), 1)}
    # preload
    dev = torch.cuda.current_device()
    with ledger.measure("triton", "preload") as m:
        m.loaded = f"{sum(sv.preload(dev) for sv in s.inst.servers('triton').values())} modules"
    if "tilelang" in s.present:
        import check_tilelang as ctl

        from nojit.loader.runtimes.tilelang.serving import TileLangKernelServer

        with ledger.measure("tilelang", "preload") as m:
            mhc = importlib.import_module(ctl.MHC)  # its decorators make the servers (tilelang_serving)
            servers = [v for v in vars(mhc).values() if isinstance(v, TileLangKernelServer)]
            m.loaded = f"{sum(sv.preload(dev) for sv in servers)} modules of {len(servers)} kernels"
    if "cutedsl" in s.present:
        import tvm_ffi

        with ledger.measure("cutedsl", "preload") as m:
            for e in s.cute_entries:
                module = tvm_ffi.load_module(e["so"])
                s.cute_fns[e["symbol"]] = (module, module[e["symbol"]])
            m.loaded = f"{len(s.cute_fns)} objects"
    if "flashinfer" in s.present:
        with ledger.measure("flashinfer", "preload") as m:
            import flashinfer  # noqa: F401
            import flashinfer.gemm  # noqa: F401
            import flashinfer.sampling  # noqa: F401

            m.loaded = "import (modules load at first call)"
    if "humming" in s.present:
        with ledger.measure("humming", "preload") as m:
            import check_humming_gemm as hg

            hg._imports_done()
            m.loaded = f"import, {len(s.inst.state('humming').seeded)} seeded (cubins load at first launch)"
    return s


class _source_checks_counted:
    """While preparing: each kernel whose unchanged source the build's record could not prove, so that Triton's
    cache_key (its AST walk) decided it, with its ms (observed only: the same call is made)."""

    def __enter__(self) -> list[float]:
        from nojit.loader.runtimes.triton import serving

        self.module, self.real, self.ms = serving, serving.check_source, []

        def timed(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return self.real(*a, **k)
            finally:
                self.ms.append((time.perf_counter() - t) * 1e3)

        serving.check_source = timed
        return self.ms

    def __exit__(self, *exc: Any) -> None:
        self.module.check_source = self.real


def _install_deepgemm(s: Start, records: dict, section_dir: str | None) -> None:
    """DeepGEMM's entries of the bundle seeded as its cache, its compiler firewalled (check_deepgemm.py's way)."""
    from nojit.loader.runtimes.deepgemm import cache
    from nojit.loader.runtimes.deepgemm import popen
    from nojit.loader.strict import firewall as compiler_firewall

    bundle = s.inst.bundle
    t0 = time.perf_counter()
    split = s.notes.setdefault("deepgemm_split_ms", {})
    if section_dir is None:
        ids = [k for k, r in records.items() if r.runtime == "deepgemm"]
        s.dg_section = cache.section_of(records, bundle.entries, ids)
        s.dg_root = cache.seed(s.dg_section, bundle.read_blob, bundle.path)
    else:
        with open(os.path.join(section_dir, "section.json")) as f:
            s.dg_section = json.load(f)

        def read_blob(sha: str) -> bytes:
            with open(os.path.join(section_dir, "cubins", sha + ".cubin"), "rb") as f:
                return f.read()

        s.dg_root = cache.seed(s.dg_section, read_blob, section_dir)
    t1 = time.perf_counter()
    split["seed"] = round((t1 - t0) * 1e3, 1)  # a first process writes every entry; a later one hashes them
    report = compiler_firewall.active()
    stub = os.path.join(report.bin_dir, "nvcc") if report is not None else os.path.join(s.dg_root, "bin", "nvcc")
    os.environ["DG_JIT_CACHE_DIR"] = s.dg_root
    os.environ["DG_JIT_NVCC_COMPILER"] = stub
    if not os.path.isdir(os.environ.get("CUDA_HOME", "")):
        os.environ["CUDA_HOME"] = s.dg_root
    cudart = os.path.join(s.args.deepgemm_dir, "lib", "libcudart.so.13")
    if os.path.exists(cudart):
        ctypes.CDLL(cudart, mode=ctypes.RTLD_GLOBAL)
    sys.path.insert(0, s.args.deepgemm_dir)
    import deep_gemm as dg

    t2 = time.perf_counter()
    split["import deep_gemm"] = round((t2 - t1) * 1e3, 1)  # its extension and libcudart loaded (a server pays it)
    cache.check_headers(os.path.dirname(dg.__file__), bundle.path)
    so = [n for n in os.listdir(os.path.dirname(dg.__file__)) if n.startswith("_C_extension")][0]
    s.dg_firewall = popen.PopenFirewall(nvcc=stub, version_text=s.dg_section["nvcc_version"])
    s.dg_firewall.install(os.path.join(os.path.dirname(dg.__file__), so))
    split["probe answer"] = round((time.perf_counter() - t2) * 1e3, 1)  # popen/pclose slots found and rewritten
    dg.set_pdl(bool(s.dg_section.get("pdl", True)))
    dg.set_num_sms(s.dg_section["sm_count"])
    s.dg = dg


# ------------------------------------------------------------------------------------------ the parts
class Part:
    """One library's calls in the composed step: cases, failures, and what it adds to the graph."""

    def __init__(self, runtime: str, what: str) -> None:
        self.runtime, self.what = runtime, what
        self.cases = 0
        self.passed = 0
        self.failures: list[str] = []
        self.ran = False
        self.detail = ""
        self.graph: list[tuple[str, Callable[[], list[Any]]]] = []  # (name, fn returning its outputs)
        self.graph_checks: list[tuple[str, Callable[[], bool], Callable[[], None]]] = []  # CuTeDSL: check, spoil

    @property
    def ok(self) -> bool:
        return self.ran and self.cases > 0 and self.passed == self.cases and not self.failures


def loader_child_args(vllm_src: str, seed: int, out: str, bundle: str, jit_json: str) -> argparse.Namespace:
    """check_call_sites' loader child's arguments: its own parser's defaults (an argument added there reaches
    here; a hand-made Namespace lacked --steps-module and the Triton part raised on the H200), then ours."""
    import check_call_sites as cs

    ns = cs.parser().parse_args([])
    ns.child, ns.vllm_src, ns.seed, ns.out, ns.bundle = "loader", vllm_src, seed, out, bundle
    ns.replay = jit_json.replace(".json", "_writes.pt")
    return ns


def part_triton(s: Start) -> Part:
    import check_call_sites as cs

    p = Part("triton", "vLLM's call sites: prefill, decode, mixed, MTP, sampling vs Triton's JIT (other process)")
    if not s.args.jit_json or not os.path.exists(s.args.jit_json):
        p.failures.append("no JIT reference run (--jit-json)")
        return p
    with open(s.args.jit_json) as f:
        jit = json.load(f)
    out = os.path.join(s.args.work, "loader.json")
    from triton.runtime.jit import JITFunction

    mods = [m for n, m in sorted(sys.modules.items()) if n.startswith("vllm.") and m is not None]
    runs = {id(fn): (fn, fn.__dict__.get("run")) for fn in cs._kernels_of(mods, (JITFunction,))}
    ns = loader_child_args(s.args.vllm_src, jit_seed(s.args), out, s.args.bundle, s.args.jit_json)
    try:
        cs.child(ns)
    finally:  # the tracer's wrappers off, torch's determinism settings back: the other libraries run as they serve
        import torch

        for fn, run in runs.values():
            if run is None:
                fn.__dict__.pop("run", None)
            else:
                fn.run = run
        torch.use_deterministic_algorithms(False)
        torch.utils.deterministic.fill_uninitialized_memory = False
    with open(out) as f:
        loader = json.load(f)
    rows, ok = cs.compare(jit, loader, cs.planned_keys(s.args.plan))
    cs.print_table(rows, len(loader["compiles"]) + len(loader["guard_attempts"]), len(loader["processes"]), True)
    steps_ok = all(st["ok"] for r in (jit, loader) for st in r["steps"].values())
    p.ran = True
    p.cases, p.passed = len(rows), sum(bool(r["ok"]) for r in rows)
    if not steps_ok:
        p.failures += [f"step {n}: {st.get('error', '')[:200]}" for r in (jit, loader) for n, st in r["steps"].items()
                       if not st["ok"]]
    p.failures += [f"import: {e}" for e in loader.get("import_errors", [])]
    if loader["compiles"] or loader["guard_attempts"]:
        p.failures.append(f"{len(loader['compiles'])} compiles, {len(loader['guard_attempts'])} compile attempts")
    p.detail = (f"{len(rows)} kernels, {sum(r['keys'] for r in rows)} keys, launches identical "
                f"{sum(r['identical'] for r in rows)}/{sum(r['launches'] for r in rows)}")
    p.graph += triton_graph_steps(s)
    return p


def jit_seed(args: argparse.Namespace) -> int:
    return int(args.seed)


def triton_graph_steps(s: Start, limit: int = 6) -> list[tuple[str, Callable[[], list[Any]]]]:
    """Bound-grid launches of the first exact key of a few served kernels (check_bound_grid_graph.py's inputs)."""
    from triton_harness import grid_for, synthesize

    from nojit.loader.bundle.triton_key import key_from_json

    steps = []
    for kid, server in sorted(s.inst.servers("triton").items()):
        if len(steps) >= limit:
            break
        keys = [key_from_json(e.key) if e.decoded is None else e.decoded for e in s.inst.bundle.entries(kid)
                if e.variant == "exact"]
        if not keys:
            continue
        try:
            kwargs, bufs, _outputs = synthesize(server.fn, keys[0], 11)
        except Exception:  # noqa: BLE001 - a key the harness cannot make arguments for
            continue
        fn, grid = server.fn, grid_for(server.fn)
        initial = [b.clone() for b in bufs]

        def run(fn: Any = fn, grid: Any = grid, kwargs: dict = kwargs, bufs: list = bufs, initial: list = initial):
            for b, i in zip(bufs, initial):  # in-place kernels: each run from the same bytes
                b.copy_(i)
            fn[grid](**kwargs)
            return bufs

        steps.append((f"triton {kid.rpartition(':')[2]}", run))
    return steps


def part_tilelang(s: Start) -> Part:
    import torch

    import check_tilelang as ctl

    p = Part("tilelang", "mHC kernels (pre, pre-broadcast, post, fused, head) vs float64")
    ctl.mount_vllm = lambda src: None  # mounted once by the start
    audit, blocker = ctl.ProcessAudit(), s.tilelang_blocker
    sys.addaudithook(audit)
    sizes = (1, 7, DECODE_TOKENS, 513, 8192)
    report = ctl.check_bundle(s.args.bundle, s.args.vllm_src, sizes, s.args.seed, None, False, audit, blocker)
    ctl.print_table(report)
    p.ran = True
    p.cases = sum(len(r["cases"]) for r in report["entries"])
    p.passed = sum(c["ok"] for r in report["entries"] for c in r["cases"])
    p.failures += [f"{r['kernel']} {r['variant']}: {e}" for r in report["entries"] for e in r["errors"]]
    if not report["ok"]:
        p.failures.append("check_tilelang's verdict: FAIL")
    p.detail = f"{len(report['entries'])} entries, sizes {sizes}, cubins loaded {report.get('modules_loaded')}"
    mhc = importlib.import_module(ctl.MHC)
    ref = ctl.Float64Reference(importlib.import_module(ctl.TORCH_REF))
    from nojit.loader.bundle.tilelang_key import key_from_json, key_names

    seen = set()
    for e in s.inst.bundle.manifest.entries:
        name = e.kernel.rpartition(":")[2]
        if s.inst.bundle.manifest.kernels[e.kernel].runtime != "tilelang" or name in seen or name not in ctl.BUILDERS:
            continue
        server = getattr(mhc, name, None)
        key = dict(zip(key_names(e.key), key_from_json(e.key)))
        try:
            t, split_k, _ = next(c for c in ctl.case_plan(name, key, (DECODE_TOKENS,), mhc))
            case = ctl.BUILDERS[name](key, t, split_k, ctl.Rand(s.args.seed + 7, "cuda"), ref)
        except Exception:  # noqa: BLE001 - this entry's inputs: try the next entry of the kernel
            continue
        seen.add(name)

        def run(server: Any = server, case: Any = case) -> list[Any]:
            server(*case.args, **case.kwargs)
            return [g.t for g in case.outputs.values()]

        p.graph.append((f"tilelang {name}", run))
        torch.cuda.synchronize()
    return p


def part_deepgemm(s: Start) -> Part:
    import torch

    import check_deepgemm as cdg

    p = Part("deepgemm", "fp8_gemm_nt, fp8_einsum, tf32_hc_prenorm_gemm, MQA + paged MQA logits vs float32")
    rows = s.dg_section.get("check_rows")
    if not rows:
        with open(os.path.join(s.args.deepgemm_dir, "rows.json")) as f:
            rows = json.load(f)
    from nojit.loader.runtimes.deepgemm import cache

    ops = {"fp8_gemm_nt": cdg._gemm_case, "fp8_einsum": cdg._einsum_case, "tf32_hc_prenorm_gemm": cdg._hc_case,
           "fp8_fp4_mqa_logits": cdg._mqa_logits_case, "fp8_fp4_paged_mqa_logits": cdg._paged_mqa_logits_case,
           "get_paged_mqa_logits_metadata": cdg._paged_mqa_logits_case}
    use_ue8m0 = bool(s.dg_section.get("use_ue8m0", True))
    torch.manual_seed(s.args.seed)
    p.ran = True
    for row in rows:
        for i, m in enumerate(row["ms"]):
            expected = cache.find_key(s.dg_section, row["op"], row["n"], row["k"], m, row["name"])
            before = len(s.dg_firewall.refused)
            try:
                r = ops[row["op"]](s.dg, torch, row, m, i, use_ue8m0, 3)
                ok = r["ok"] and len(s.dg_firewall.refused) == before and expected is not None
            except Exception as exc:  # noqa: BLE001 - reported per case
                ok, r = False, {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            p.cases += 1
            p.passed += ok
            if not ok:
                p.failures.append(f"{row['op']} {row['name']} M={m}: {json.dumps(r, default=str)[:300]}")
    staged = os.listdir(os.path.join(s.dg_root, "tmp")) if os.path.isdir(os.path.join(s.dg_root, "tmp")) else []
    if s.dg_firewall.refused or staged:
        p.failures.append(f"compile commands refused {len(s.dg_firewall.refused)}, staged compiles {len(staged)}")
    p.detail = f"{p.cases} cases over {len(rows)} shapes; probe answered {s.dg_firewall.answered}x"
    gemm = next((r for r in rows if r["op"] == "fp8_gemm_nt"), None)
    if gemm is not None:
        from deep_gemm.utils.math import per_block_cast_to_fp8, per_token_cast_to_fp8

        n, k, m = gemm["n"], gemm["k"], DECODE_TOKENS
        b, sfb = per_block_cast_to_fp8(torch.randn(n, k, device="cuda", dtype=torch.bfloat16), use_ue8m0=use_ue8m0)
        a, sfa_rows = per_token_cast_to_fp8(torch.randn(m, k, device="cuda", dtype=torch.bfloat16), use_ue8m0=use_ue8m0)
        sfa = torch.empty_strided((m, k // 128), (1, (m + 3) // 4 * 4), dtype=torch.float32, device="cuda")
        sfa.copy_(sfa_rows)
        d = torch.empty((m, n), device="cuda", dtype=torch.bfloat16)

        def run() -> list[Any]:
            s.dg.fp8_gemm_nt((a, sfa), (b, sfb), d, disable_ue8m0_cast=not use_ue8m0)
            return [d]

        p.graph.append((f"deepgemm fp8_gemm_nt {gemm['name']} M={m}", run))
    return p


def _inprocess_refusals() -> int | None:
    """What strict mode's patched in-process compile entries refused in this process (PTX given to libcuda's image
    loaders or linker, NVRTC, nvJitLink, NVVM): a count, not an assumption (the H200 showed CUDA_DISABLE_PTX_JIT=1
    alone lets raw PTX through cuModuleLoadData). None where the guard is not active."""
    from nojit.loader.strict import inprocess_guard

    return inprocess_guard.refusals() if inprocess_guard.report() is not None else None


def flashinfer_shapes_and_modules(manifest: Any, trtllm_name: Any) -> tuple[list[tuple[int, int]], list[str]]:
    """The block-FP8 GEMM (N, K) of the bundle's TensorRT-LLM cubins and its FlashInfer module names, read from the
    FlashInfer entries only (the H200 run of session 8 read every entry's launch as FlashInfer's, and a Humming
    entry's launch has no `kind`: the FlashInfer part raised before any call)."""
    fi = [e for e in manifest.entries if manifest.kernels[e.kernel].runtime == "flashinfer"]
    shapes = sorted({(int(mt.group(1)), int(mt.group(2))) for e in fi
                     if e.launch.kind == "trtllm_deepgemm" and (mt := trtllm_name.match(e.launch.module))})
    return shapes, sorted(e.launch.module for e in fi if e.launch.kind == "module")


def part_flashinfer(s: Start) -> Part:
    import torch

    import check_flashinfer_launch as cfi
    import flashinfer

    p = Part("flashinfer", "sampling (top-k/top-p, renorms) and block-FP8 GEMM M < 32 (TensorRT-LLM cubins) vs torch")
    shapes, modules = flashinfer_shapes_and_modules(s.inst.bundle.manifest, cfi.TRTLLM_NAME)
    cases = cfi.run_sampling(flashinfer, 20, 2)
    cases += cfi.run_deterministic(flashinfer)
    cases += cfi.run_gemm(flashinfer, shapes, cfi.tile_config_ms(s.inst.bundle.manifest.entries))  # each config's kernel
    cases += cfi.run_comm_loaded([m for m in modules if m in ("trtllm_comm", "trtllm_mnnvl_comm")])
    p.ran = True
    p.cases, p.passed = len(cases), sum(bool(c["ok"]) for c in cases)
    p.failures += [f"{c['case']}: {json.dumps({k: v for k, v in c.items() if k != 'case'}, default=str)[:200]}"
                   for c in cases if not c["ok"]]
    from nojit.loader.runtimes.flashinfer import serving as flashinfer_serving

    builds = list(flashinfer_serving.current().builds)
    if builds:
        p.failures.append(f"FlashInfer builds: {builds}")
    p.detail = f"{len(cases)} cases, {len(shapes)} GEMM shapes, modules {modules}"
    if shapes:
        n, k = shapes[0]
        w = (torch.randn(n, k, device="cuda") * 0.05).to(torch.bfloat16)
        wq, ws = cfi.quantize_weight_128x128(w)
        x = torch.randn(7, k, device="cuda").to(torch.bfloat16)
        out = torch.empty((7, n), dtype=torch.bfloat16, device="cuda")

        def run() -> list[Any]:
            flashinfer.gemm.fp8_blockscale_gemm_sm90(input=x, weight=wq, weight_scale=ws, out=out)
            return [out]

        p.graph.append((f"flashinfer fp8_blockscale_gemm_sm90 M=7 N={n} K={k}", run))
    return p


def part_cutedsl(s: Start) -> Part:
    import torch

    import check_cutedsl_launch as cu

    p = Part("cutedsl", "router GEMM, dequant-gather-K, indexer-q, compressors (objects through CuTeDSL's C runtime) "
             "vs torch/float64")
    # vLLM's Triton paths of these ops are not in the bundle (on sm_90 vLLM takes the CuTeDSL ones, so the plan has
    # none of their keys) and strict mode compiles nothing: each case takes the check's torch / float64 reference,
    # its rule where Triton cannot run (check_cutedsl_launch.py), without a refused compile attempt.
    def not_bundled(*_a: Any, **_k: Any) -> None:
        raise RuntimeError("vLLM's Triton path of this op is not in the bundle (strict mode)")

    ref_ops = types.SimpleNamespace(dequantize_and_gather_k_cache=not_bundled, fused_indexer_q_rope_quant=not_bundled,
                                    compress_norm_rope_store_triton=not_bundled, has_cutedsl=lambda: False)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        cases = cu.build_cases(s.cute_entries, s.cute_fns, ref_ops)
        torch.cuda.synchronize()
        p.ran = True
        for case in cases:
            try:
                case.run()
                torch.cuda.synchronize()
                r = case.check()
                if case.spoil is not None:
                    case.spoil()
                    r["control_rejected"] = not case.check()["ok"]
                ok = bool(r["ok"]) and r.get("control_rejected", False)
            except Exception as exc:  # noqa: BLE001 - reported per case
                ok, r = False, {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
            p.cases += 1
            p.passed += ok
            if not ok:
                p.failures.append(f"{case.name}: {json.dumps(r, default=str)[:300]}")
            elif case.spoil is not None and len(p.graph_checks) < 3 and case.symbols:
                p.graph_checks.append((f"cutedsl {case.name}", lambda c=case: bool(c.check()["ok"]), case.spoil))
                p.graph.append((f"cutedsl {case.name}", lambda c=case: (c.run(), [])[1]))
    launched = {sym for c in cases for sym in c.symbols}
    missing = [e["symbol"] for e in s.cute_entries if e["symbol"] not in launched]
    if missing:
        p.failures.append(f"entries not launched: {missing}")
    p.detail = f"{len(cases)} cases, {len(launched)}/{len(s.cute_entries)} objects launched (linked by the harness)"
    return p


def part_humming(s: Start) -> Part:
    import torch

    import check_humming_gemm as hg

    p = Part("humming", "MoE GEMM w13/w2 (MXFP4 x block-FP8) through Humming's launcher vs float64")
    report: dict = {"cases": [], "failures": [], "tracebacks": []}
    opts = argparse.Namespace(dir=s.args.humming_dir, tokens=f"1,4,{DECODE_TOKENS},200,500")
    hg.device_main(opts, report)
    checked = [c for c in report["cases"] if "ok" in c]
    p.ran = True
    p.cases, p.passed = len(checked), sum(bool(c["ok"]) for c in checked)
    p.failures += report["failures"]
    if report.get("compiles"):
        p.failures.append(f"{len(report['compiles'])} arrivals at Humming's compile step")
    p.detail = f"{len(checked)} launches, {report.get('kernels_launched')} kernels, seeded {report.get('seeded_from_bundle')}"
    with open(os.path.join(s.args.humming_dir, "humming_calls.json")) as f:
        calls = json.load(f)
    layer = calls["layers"][0]
    top_k = int(layer["moe"].get("top_k", hg.TOP_K_DEFAULT))
    locks = hg.make_locks()
    from humming import ops

    for op, call in layer["gemms"].items():
        gemm = hg.Gemm(op, call, layer["input_schema"], seed=hg.gemm_seed(0, op))
        for tokens in (DECODE_TOKENS, 4, 1, 200):
            case = gemm.case(tokens, top_k, seed=hg.case_seed(tokens, 0))
            if case is None or gemm.table[case["interval"]][2].get("use_stream_k", False):
                continue  # stream-K is not bitwise repeatable (session 6): not a graph-vs-eager comparison
            out = torch.empty((case["m"], gemm.n), dtype=torch.bfloat16, device="cuda")
            kw = {name: gemm.tensors[name] for name in ("weight_scale_2", "zero_point", "bias") if name in gemm.tensors}

            def run(gemm: Any = gemm, case: dict = case, out: Any = out, kw: dict = kw) -> list[Any]:
                ops.humming_gemm(layer_config=gemm.layer_config, compute_config=gemm.compute_config,
                                 tuning_config=gemm.tuning_config, inputs=case["q"], weight=gemm.tensors["weight"],
                                 weight_scale=gemm.tensors["weight_scale"], input_scale=case["scale"], outputs=out,
                                 sorted_ids=case["sorted_ids"], expert_ids=case["expert_ids"],
                                 num_tokens_padded=case["padded"], locks=locks,
                                 top_k=case["top_k"] if gemm.op == "w13" else 1, valid_shape_m=case["m"], **kw)
                return [out]

            p.graph.append((f"humming {op} tokens={tokens}", run))
            break
    return p


# ------------------------------------------------------------------------------------------ the graph
def poison(t: Any) -> None:
    t.view(-1).view(__import__("torch").uint8).fill_(0xFF) if t.is_contiguous() else t.fill_(float("nan"))


def graph_check(parts: list[Part]) -> dict[str, Any]:
    """Every part's decode-sized calls in one CUDA graph: eager outputs kept, outputs poisoned, replay, compare."""
    import torch

    steps = [(p.runtime, name, fn) for p in parts for name, fn in p.graph]
    result: dict[str, Any] = {"steps": [], "ok": False, "runtimes": sorted({rt for rt, _, _ in steps})}
    if not steps:
        result["error"] = "no step to capture"
        return result
    torch.cuda.synchronize()
    eager = []
    for rt, name, fn in steps:
        outs = fn()
        torch.cuda.synchronize()
        eager.append([o.clone() for o in outs])
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    try:
        with torch.cuda.stream(stream):
            for _rt, _name, fn in steps:  # warm-up on the capture stream, as torch's docs ask
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            captured = [fn() for _rt, _name, fn in steps]
    except Exception as exc:  # noqa: BLE001 - which step broke the capture is the finding
        result["error"] = f"capture failed: {type(exc).__name__}: {str(exc)[:400]}"
        result["traceback"] = traceback.format_exc()[-2000:]
        result["uncapturable"] = _uncapturable(steps)
        result["error"] += f"; steps that cannot be captured alone: {result['uncapturable']}"
        return result
    torch.cuda.synchronize()
    for outs in captured:
        for o in outs:
            poison(o)
    spoiled = [(name, check, spoil) for p in parts for name, check, spoil in p.graph_checks]
    for _name, _check, spoil in spoiled:
        spoil()
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    ok = True
    for (rt, name, _fn), outs, ref in zip(steps, captured, eager):
        same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(outs, ref))
        if not outs:
            continue
        result["steps"].append({"runtime": rt, "step": name, "equal": same})
        ok &= same
    for name, check, _spoil in spoiled:
        passed = check()
        result["steps"].append({"runtime": "cutedsl", "step": name + " (spoiled, replayed, reference check)",
                                "equal": passed})
        ok &= passed
    result["ok"] = ok and bool(result["steps"])
    result["launch_nodes"] = graph.__class__.__name__
    return result


def _uncapturable(steps: list[tuple[str, str, Callable[[], list[Any]]]]) -> list[str]:
    """After a failed capture of all the steps: each step captured alone, so the table names the one(s) that broke
    it instead of one error for the whole graph."""
    import torch

    bad = []
    for _rt, name, fn in steps:
        try:
            torch.cuda.synchronize()
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                fn()
        except Exception as exc:  # noqa: BLE001 - collected
            bad.append(f"{name} ({type(exc).__name__}: {str(exc)[:120]})")
    return bad


# ------------------------------------------------------------------------------------------ roles
def role_one(args: argparse.Namespace) -> int:
    sys.addaudithook(_audit)
    if os.environ.get("CUDA_DISABLE_PTX_JIT") != "1":
        print("CUDA_DISABLE_PTX_JIT=1 is required (PTX loads must be impossible)\nRESULT: FAIL")
        return 1
    guard = process_guard()
    if guard is None:
        print("the process guard is not preloaded (LD_PRELOAD=libnojit_exec_guard.so)\nRESULT: FAIL")
        return 1
    import torch

    import check_tilelang as ctl

    blocker = ctl.TileLangBlocker()
    sys.meta_path.insert(0, blocker)
    try:
        import cuda.pathfinder  # noqa: F401 - imported by torch 2.14's cuda utils in a server (asks `ldconfig -p`)
    except ImportError:
        pass
    torch.cuda.init()
    torch.empty(1, device="cuda")
    age0 = process_age_s()
    base = {"c_processes": int(guard.nojit_guard_processes()), "nvrtc": int(guard.nojit_guard_nvrtc()),
            "python_processes": len(_python_processes)}
    import triton

    triton_compiles: list[str] = []
    triton.knobs.runtime.jit_post_compile_hook = lambda **kw: triton_compiles.append(str(kw.get("key"))[:80])
    ledger = Ledger()
    os.makedirs(args.work, exist_ok=True)
    t_ready = time.perf_counter()
    s = start(args, ledger)
    s.tilelang_blocker = blocker
    ready_ms = (time.perf_counter() - t_ready) * 1e3
    ready_age = process_age_s()
    print(f"ready: {ready_ms:.0f} ms from install to every runtime preloaded; process age {ready_age:.2f} s "
          f"(CUDA initialised at {age0:.2f} s); runtimes in the bundle: {sorted(s.present)}; notes {s.notes}", flush=True)
    for line in s.inst.allowed_differences:
        print(f"allowed difference: {line}")
    parts: list[Part] = []
    builders = {"triton": part_triton, "tilelang": part_tilelang, "deepgemm": part_deepgemm,
                "flashinfer": part_flashinfer, "cutedsl": part_cutedsl, "humming": part_humming}
    for rt in RUNTIMES:
        if rt not in s.present:
            p = Part(rt, "not in the bundle: not run")
            parts.append(p)
            continue
        print(f"--- {rt}", flush=True)
        t0 = time.perf_counter()
        try:
            p = builders[rt](s)
        except Exception as exc:  # noqa: BLE001 - one library's failure must not hide the others
            p = Part(rt, "raised")
            p.failures.append(f"{type(exc).__name__}: {str(exc)[:600]}")
            print(traceback.format_exc()[-3000:], file=sys.stderr)
        p.seconds = time.perf_counter() - t0
        parts.append(p)
        print(f"--- {rt}: {'PASS' if p.ok else 'FAIL'} {p.passed}/{p.cases} {p.detail} ({p.seconds:.1f} s)", flush=True)
        for f in p.failures[:8]:
            print(f"    FAIL {f}")
    print("--- one CUDA graph", flush=True)
    try:
        graph = graph_check(parts)
    except Exception as exc:  # noqa: BLE001
        graph = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "steps": [], "runtimes": []}
    from nojit.loader.strict import guards

    end = {"c_processes": int(guard.nojit_guard_processes()), "nvrtc": int(guard.nojit_guard_nvrtc()),
           "python_processes": len(_python_processes)}
    counters = {
        "compiles": len(triton_compiles) + len(guards.compile_attempts)
        + (len(s.dg_firewall.refused) if s.dg_firewall else 0),
        "processes": (end["c_processes"] - base["c_processes"]) + (end["python_processes"] - base["python_processes"]),
        "nvrtc": end["nvrtc"] - base["nvrtc"],
        "ptx_loads": _inprocess_refusals(),
    }
    print_tables(parts, graph, counters, ledger, s, ready_ms, ready_age)
    complete = all(rt in s.bundle_runtimes for rt in RUNTIMES)
    ok = (complete and all(p.ok for p in parts) and graph["ok"] and set(graph["runtimes"]) >= set(RUNTIMES)
          and counters["compiles"] == 0 and counters["processes"] == 0 and counters["nvrtc"] == 0
          and counters["ptx_loads"] == 0)
    verdict = "PASS" if ok else ("FAIL" if complete else
                                 f"FAIL (incomplete: not in the bundle {sorted(set(RUNTIMES) - s.bundle_runtimes)})")
    report = {"parts": [dict(vars(p), graph=[n for n, _ in p.graph], graph_checks=[n for n, _, _ in p.graph_checks],
                             ok=p.ok) for p in parts],
              "graph": graph, "counters": counters, "ledger": {f"{k[0]}/{k[1]}": v for k, v in ledger.rows.items()},
              "ready_ms": ready_ms, "ready_process_age_s": ready_age, "notes": s.notes, "python_processes": _python_processes,
              "compile_attempts": list(guards.compile_attempts), "triton_compiles": triton_compiles, "result": verdict,
              "present": sorted(s.present), "in_bundle": sorted(s.bundle_runtimes)}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    print(f"RESULT: {verdict}")
    return 0 if ok else 1


def print_tables(parts: list[Part], graph: dict, counters: dict, ledger: Ledger, s: Start, ready_ms: float,
                 ready_age: float) -> None:
    print("\n| runtime | calls (what ran) | cases passed | graph replay == eager | result |")
    print("|---|---|---|---|---|")
    for p in parts:
        g = [x for x in graph.get("steps", []) if x["runtime"] == p.runtime]
        gs = f"{sum(x['equal'] for x in g)}/{len(g)}" if g else "-"
        verdict = "PASS" if p.ok else ("not run" if not p.ran and not p.failures else "FAIL")
        print(f"| {p.runtime} | {p.what}{'; ' + p.detail if p.detail else ''} | {p.passed}/{p.cases} | {gs} | {verdict} |")
    print(f"\none CUDA graph: {len(graph.get('steps', []))} steps of {graph.get('runtimes')}: "
          f"{'replay == eager' if graph.get('ok') else 'FAIL ' + str(graph.get('error', ''))}")
    for x in graph.get("steps", []):
        if not x["equal"]:
            print(f"  differs: {x['step']}")
    refused = counters["ptx_loads"]
    print(f"counters (whole process after imports): {counters['compiles']} compiles, {counters['processes']} processes, "
          f"{counters['nvrtc']} NVRTC calls, " + (
              f"{refused} in-process compiles refused (PTX/IR images given to the driver's loaders or linker, NVRTC, "
              "nvJitLink, NVVM: strict mode's patched entries count each)" if refused is not None else
              "in-process guard NOT active (the nojit wheel lacks nojit.loader._inproc, or strict mode did not "
              "install its guards): PTX loads not counted, a failure"))
    print("\n(memory per runtime: its preflight and preload, and DeepGEMM's and CuTeDSL's install; install() as a whole "
          "is in the row 'all', with the mount of vLLM's files)")
    print("| runtime | install ms | preflight ms | preload ms | host RSS added MiB | GPU memory added MiB | loaded |")
    print("|---|---|---|---|---|---|---|")
    total = [0.0, 0.0, 0.0, 0.0, 0.0]
    for rt in (*RUNTIMES, "all"):
        cells = [ledger.rows.get((rt, st), {}) for st in ("install", "preflight", "preload")]
        mem = [ledger.rows.get((rt, st), {}) for st in ("install", "preflight", "preload", "install (memory)",
                                                       "mount vLLM files + import call sites")]
        ms = [c.get("ms", 0.0) for c in cells]
        rss = sum(c.get("rss_mib", 0.0) for c in mem)
        gpu = sum(c.get("gpu_mib", 0.0) for c in mem)
        loaded = "; ".join(c["loaded"] for c in cells if c.get("loaded"))
        if rt == "all":
            extra = ledger.rows.get(("all", "mount vLLM files + import call sites"), {}).get("ms", 0.0)
            loaded = f"mount + call-site imports {extra:.0f} ms"
        if rt not in s.present and rt != "all":
            print(f"| {rt} | not in the bundle | | | | | |")
            continue
        for i, v in enumerate((*ms, rss, gpu)):
            total[i] += v
        print(f"| {rt} | {ms[0]:.1f} | {ms[1]:.1f} | {ms[2]:.1f} | {rss:.1f} | {gpu:.1f} | {loaded} |")
    print(f"| total | {total[0]:.1f} | {total[1]:.1f} | {total[2]:.1f} | {total[3]:.1f} | {total[4]:.1f} | "
          f"start to ready {ready_ms:.0f} ms; process age at ready {ready_age:.2f} s |")


def role_negative(args: argparse.Namespace) -> int:
    """The start on a bundle lacking one entry: must fail at preflight, one message naming it, nothing compiled."""
    from nojit.loader.errors import PreflightError

    sys.addaudithook(_audit)
    guard = process_guard()
    import torch

    torch.cuda.init()
    base = (int(guard.nojit_guard_processes()), int(guard.nojit_guard_nvrtc())) if guard else (0, 0)
    ledger = Ledger()
    os.makedirs(args.work, exist_ok=True)
    args.cutedsl_work = args.cutedsl_work or args.work
    try:
        start(args, ledger)
    except PreflightError as exc:
        from nojit.loader.strict import guards

        text = str(exc)
        named = args.expect and args.expect.split(" ", 1)[0] in text and args.expect.split(" ", 1)[1][:60] in text
        lines = [ln for ln in text.splitlines() if ln.startswith("  ") and not ln.startswith("  fix")]
        after = (int(guard.nojit_guard_processes()), int(guard.nojit_guard_nvrtc())) if guard else (0, 0)
        print(f"preflight refused the start:\n{text}")
        ok = bool(named) and len(lines) == 1 and not guards.compile_attempts and after == base and not _python_processes
        print(f"NEGATIVE CONTROL: {'PASS' if ok else 'FAIL'} (unserved keys listed {len(lines)}, the removed entry "
              f"named {bool(named)}, compile attempts {len(guards.compile_attempts)}, processes "
              f"{after[0] - base[0] + len(_python_processes)}, NVRTC {after[1] - base[1]})")
        return 0 if ok else 1
    except Exception as exc:  # noqa: BLE001
        print(f"the start failed, but not at preflight: {type(exc).__name__}: {str(exc)[:800]}\nNEGATIVE CONTROL: FAIL")
        return 1
    print("the start succeeded on a bundle lacking an entry\nNEGATIVE CONTROL: FAIL")
    return 1


def role_cutedsl_link(args: argparse.Namespace) -> int:
    """The harness's step before the serving process: each CuTeDSL object of the bundle linked with g++ against
    CuTeDSL's C runtime (check_cutedsl_launch.link_and_load, on the one bundle), recorded for the process."""
    import check_cutedsl_launch as cu

    from nojit.loader.bundle.installed import file_sha256

    manifest = cu.load_manifest(args.cutedsl_dir)
    manifest["bundle"] = {"file": os.path.abspath(args.bundle), "sha256": file_sha256(os.path.abspath(args.bundle))}
    os.makedirs(args.cutedsl_work, exist_ok=True)
    t0 = time.perf_counter()
    entries, _fns = cu.link_and_load(args.cutedsl_dir, manifest, args.cutedsl_work)
    for e in entries:
        e["so"] = os.path.join(args.cutedsl_work, e["symbol"] + ".so")
    with open(os.path.join(args.cutedsl_work, "entries.json"), "w") as f:
        json.dump(entries, f, indent=1)
    print(f"cutedsl-link: {len(entries)} objects linked in {time.perf_counter() - t0:.1f} s")
    return 0


def role_without(args: argparse.Namespace) -> int:
    drop = frozenset(x for x in (args.drop_runtime or "").split(",") if x)
    what = bundle_without(args.bundle, args.out, drop, args.drop_entry)
    print(what)
    return 0


def role_deepgemm_jit(args: argparse.Namespace) -> int:
    """The JIT side for DeepGEMM: fp8_gemm_nt at a seeded random sample of (shape, M) of the deployment (rows.json:
    the shapes; M in 1..8192) compiled by DeepGEMM's own JIT with this machine's nvcc into an empty cache (first call
    minus a second, cached call), scaled to the plan's DeepGEMM entry count. Not strict: this is the JIT."""
    import torch

    import check_deepgemm as cdg

    work = tempfile.mkdtemp(prefix="nojit-dg-jit-")
    os.environ["DG_JIT_CACHE_DIR"] = work
    os.environ.setdefault("CUDA_HOME", "/usr/local/cuda")
    sys.path.insert(0, args.deepgemm_dir)
    cudart = os.path.join(args.deepgemm_dir, "lib", "libcudart.so.13")
    if os.path.exists(cudart):
        ctypes.CDLL(cudart, mode=ctypes.RTLD_GLOBAL)
    import deep_gemm as dg

    dg.set_pdl(True)
    dg.set_num_sms(torch.cuda.get_device_properties(0).multi_processor_count)
    with open(os.path.join(args.deepgemm_dir, "rows.json")) as f:
        rows = [r for r in json.load(f) if r["op"] == "fp8_gemm_nt"]
    with open(args.plan) as f:
        plan = json.load(f)
    n_entries = sum(r["variant"] == "exact" and plan["kernels"][r["kernel"]]["runtime"] == "deepgemm"
                    for r in plan["requests"])
    rng = random.Random(args.seed)
    times = []
    for _ in range(args.sample):
        row, m = rng.choice(rows), rng.randint(1, 8192)
        t0 = time.perf_counter()
        try:
            cdg._gemm_case(dg, torch, dict(row, ms=[m]), m, 0, True, 1)
        except Exception as exc:  # noqa: BLE001
            print(f"deepgemm-jit {row['name']} M={m}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        first = time.perf_counter() - t0
        t1 = time.perf_counter()
        cdg._gemm_case(dg, torch, dict(row, ms=[m]), m, 0, True, 1)
        second = time.perf_counter() - t1
        times.append(first - second)
        print(f"deepgemm-jit {row['name']} N={row['n']} K={row['k']} M={m}: compile {first - second:.1f} s")
    mean = sum(times) / len(times) if times else float("nan")
    out = {"sample": len(times), "entries": n_entries, "mean_s": mean, "scaled_s": mean * n_entries, "seed": args.seed,
           "compiled": len(os.listdir(os.path.join(work, "cache"))) if os.path.isdir(os.path.join(work, "cache")) else None}
    print(f"DEEPGEMM-JIT: {len(times)} fp8_gemm_nt keys compiled by DeepGEMM's JIT (nvcc here), mean {mean:.1f} s; "
          f"x {n_entries} entries = {mean * n_entries:.0f} s; cache entries made {out['compiled']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f)
    return 0 if times else 1


def role_deepgemm_build(args: argparse.Namespace) -> int:
    """The harness's build step before the serving process: DeepGEMM's generated kernels (tools/prepare_one_device.py
    --deepgemm-work: DeepGEMM's own kernel.cu and nvcc flags per entry, as nojit's DeepGEMM build records them)
    compiled with this machine's nvcc, written as the section loader/runtimes/deepgemm/cache.py seeds (section.json, cubins/).
    The same command line as aot/runtimes/deepgemm/compile.py, with the carried package's include folder."""
    import hashlib
    import shutil
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from nojit.aot.runtimes.deepgemm.compile import local_flags

    with open(os.path.join(args.deepgemm_dir, "src", "sources.json")) as f:
        src = json.load(f)
    nvcc = shutil.which("nvcc") or os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
    package = os.path.abspath(os.path.join(args.deepgemm_dir, "deep_gemm"))
    out = os.path.join(args.deepgemm_dir, "section")
    os.makedirs(os.path.join(out, "cubins"), exist_ok=True)
    work = tempfile.mkdtemp(prefix="nojit-dg-build-")

    def one(item: tuple[str, dict]) -> tuple[str, bytes, float]:
        name, e = item
        d = os.path.join(work, name)
        os.makedirs(d)
        with open(os.path.join(d, "kernel.cu"), "w") as f:
            f.write(e["source"])
        t0 = time.perf_counter()
        p = subprocess.run([nvcc, "kernel.cu", "--cubin", "--output-file", "kernel.cubin",
                            *local_flags(e["flags"], package)], capture_output=True, text=True, cwd=d)
        if p.returncode != 0:
            raise RuntimeError(f"nvcc failed for {name}: {p.stderr[-1500:]}")
        with open(os.path.join(d, "kernel.cubin"), "rb") as f:
            return name, f.read(), time.perf_counter() - t0

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 8) as pool:
        done = list(pool.map(one, sorted(src["sources"].items())))
    entries = {}
    for name, cubin, _s in done:
        sha = hashlib.sha256(cubin).hexdigest()
        with open(os.path.join(out, "cubins", sha + ".cubin"), "wb") as f:
            f.write(cubin)
        entries[name] = {"cubin": sha, "source": src["sources"][name]["source"]}
    section = {k: v for k, v in src.items() if k != "sources"}
    section.update(nvcc=nvcc, entries=entries, not_compiled=[])
    with open(os.path.join(out, "section.json"), "w") as f:
        json.dump(section, f)
    print(f"deepgemm-build: {len(entries)} entries compiled with {nvcc} in {time.perf_counter() - t0:.1f} s "
          f"({os.cpu_count()} jobs; nvcc {sum(x[2] for x in done) / max(1, len(done)):.1f} s per entry)")
    return 0


def role_deepgemm_same(args: argparse.Namespace) -> int:
    """DeepGEMM's entries compiled here (`nojit build --from-plan`, this machine's nvcc) against the same entries the
    build box compiled (--box: entry name -> sha256 of the box's cubin, from its compile cache): the same generated
    source, flags and nvcc release must give the same bytes, so the bundle's DeepGEMM part is the box's."""
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.runtimes.deepgemm.cache import section_of

    with open(args.box) as f:
        box = json.load(f)
    bundle = Bundle.open(args.bundle)
    ids = [k for k, r in bundle.manifest.kernels.items() if r.runtime == "deepgemm"]
    here = {name: e["cubin"] for name, e in section_of(bundle.manifest.kernels, bundle.entries, ids)["entries"].items()}
    both = sorted(set(here) & set(box))
    differ = [n for n in both if here[n] != box[n]]
    print(f"DEEPGEMM-SAME: {len(here)} entries compiled here; {len(both)} also compiled on the build box: "
          f"{len(both) - len(differ)} byte-identical, {len(differ)} differ {differ[:3]}")
    return 0 if both and not differ else 1


def role_table(args: argparse.Namespace) -> int:
    """Time to ready, nojit against the JIT for the same keys: the one process's ledger, the JIT run of the call
    sites (Triton, empty cache, this machine), DeepGEMM's JIT sample (this machine's nvcc), and the build box's
    measured compile times for the runtimes whose JIT cannot run here (labelled)."""
    with open(args.json) as f:
        one = json.load(f)
    with open(args.plan) as f:
        plan = json.load(f)
    declared: dict[str, int] = {}
    for r in plan["requests"]:
        if r["variant"] == "exact":
            rt = plan["kernels"][r["kernel"]]["runtime"]
            declared[rt] = declared.get(rt, 0) + 1
    led = one["ledger"]

    def ready_ms(rt: str) -> float:
        return sum(led.get(f"{rt}/{st}", {}).get("ms", 0.0) for st in ("install", "preflight", "preload"))

    jit: dict[str, str] = {}
    if args.jit_json and os.path.exists(args.jit_json):
        with open(args.jit_json) as f:
            j = json.load(f)
        n, sec = len(j["compiles"]), float(j["seconds"])
        if n:
            jit["triton"] = (f"{n} keys compiled by Triton's JIT from an empty cache here in {sec:.1f} s (the call-site "
                             f"steps, launches included): {sec / n:.2f} s/key, x {declared.get('triton', 0)} keys = "
                             f"{sec / n * declared.get('triton', 0):.0f} s")
    dg = os.path.join(os.path.dirname(args.json), "deepgemm_jit.json")
    if os.path.exists(dg):
        with open(dg) as f:
            d = json.load(f)
        jit["deepgemm"] = (f"{d['sample']} entries (seed {d['seed']}) compiled by DeepGEMM's JIT with nvcc here: mean "
                           f"{d['mean_s']:.1f} s, x {d['entries']} entries = {d['scaled_s']:.0f} s")
    box = os.path.join(os.path.dirname(args.plan), "box_compile_times.json")
    if os.path.exists(box):
        with open(box) as f:
            for rt, text in json.load(f).items():
                jit.setdefault(rt, f"build box (no GPU, 2 cores), not this machine: {text}")
    print("\n| runtime | keys declared | nojit: install + preflight + preload ms (this process) | the JIT for the same keys |")
    print("|---|---|---|---|")
    total, keys = 0.0, 0
    present = set(one.get("present", RUNTIMES))
    for rt in RUNTIMES:
        if rt not in present:
            print(f"| {rt} | {declared.get(rt, 0)} | not in the bundle | {jit.get(rt, 'not measured')} |")
            continue
        ms = ready_ms(rt)
        total += ms
        keys += declared.get(rt, 0)
        where = "" if rt in one.get("in_bundle", present) else " (entries not from the bundle: see the notes)"
        print(f"| {rt} | {declared.get(rt, 0)} | {ms:.1f}{where} | {jit.get(rt, 'not measured')} |")
    total += ready_ms("all")
    mount = led.get("all/mount vLLM files + import call sites", {}).get("ms", 0.0)
    print(f"| all (install()'s shared steps: open, firewall, versions, guards) | - | {ready_ms('all'):.1f} | - |")
    print(f"| **total, runtimes present** | {keys} | **{total:.0f}** | |")
    print(f"(start to ready in the process {one['ready_ms']:.0f} ms, of which {mount:.0f} ms importing vLLM's call-site "
          f"modules from the carried files, which a server imports anyway; process age at ready "
          f"{one['ready_process_age_s']:.2f} s)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--role", default="one", choices=("one", "negative", "cutedsl-link", "without", "deepgemm-jit",
                                                             "table", "deepgemm-build", "deepgemm-same"))
    ap.add_argument("--bundle", default="")
    ap.add_argument("--plan", default=os.path.join(".device", "device.plan.json"))
    ap.add_argument("--vllm-src", default=os.path.join(".device", "vllm_src"))
    ap.add_argument("--deepgemm-dir", default=".device-dg")
    ap.add_argument("--humming-dir", default=".device-hg")
    ap.add_argument("--cutedsl-dir", default=".device-cu")
    ap.add_argument("--cutedsl-work", default="/tmp/nojit-one-cute")
    ap.add_argument("--work", default="/tmp/nojit-one")
    ap.add_argument("--jit-json", help="check_call_sites.py's jit child summary (same --seed)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json")
    ap.add_argument("--expect", help="negative: 'KERNEL KEYJSON' of the removed entry")
    ap.add_argument("--out")
    ap.add_argument("--drop-runtime")
    ap.add_argument("--drop-entry", type=int)
    ap.add_argument("--sample", type=int, default=4)
    ap.add_argument("--box", help="deepgemm-same: entry name -> sha256 of the build box's cubin")
    args = ap.parse_args()
    return {"one": role_one, "negative": role_negative, "cutedsl-link": role_cutedsl_link, "without": role_without,
            "deepgemm-jit": role_deepgemm_jit, "table": role_table,
            "deepgemm-build": role_deepgemm_build, "deepgemm-same": role_deepgemm_same}[args.role](args)


if __name__ == "__main__":
    sys.exit(main())
