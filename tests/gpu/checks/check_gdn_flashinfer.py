"""H200 check (issue 24, must-show 2): FlashInfer's sm_90 GDN prefill launched by FlashInfer's own Python, its
`cached_compile` answered from the bundle by nojit's strict loader, against the float64 gated delta rule.

What runs, in one strict-mode process (tests/gpu/device_run.sh, step `gdn-fi`, sets it up): vLLM's files carried
verbatim are mounted (qwen_call_site_steps.mount_qwen) and nojit's loader is installed (strict, the bundle's
flashinfer_cute kernels: loader/runtimes/flashinfer_cute puts its BundledCompileCache in FlashInfer's
`_in_mem_compile_cache`); then vLLM's own `fi_chunk_gated_delta_rule` (model_executor/layers/mamba/gdn/
qwen_gdn_linear_attn.py, as `_forward_core` calls it: use_qk_l2norm_in_kernel=False, g in log space, int32
cu_seqlens, checkpoints from the caller's buffer) runs FlashInfer's `chunk_gated_delta_rule` -> its sm_90 launcher
(`delta_rule_prefill_dsl_sm90`) -> `get_cached_compile`, which nojit answers with the bundled object loaded by
`cute.runtime.load_module` (CuTeDSL's own loader, with its MLIR library and C runtime carried), and FlashInfer calls
it on the H200. If vLLM's module does not import there, FlashInfer's entry is called with the arguments vLLM's
function builds (`vllm_call_kwargs`; the CPU half checks them against vLLM's own function), and the output says so.

Cases and reference: check_gdn_prefill.py's (its inputs, its float64 recurrence, its comparison and spoiled-output
control: one place for them): CASES (3 sequences, 5 sequences, checkpoints every 64), which FlashInfer's wrapper
sends to its fused kernel, and CP_CASES (1 sequence; 2 sequences with checkpoints every 64), which it sends to its
CP route (three precompute kernels, then the CP prefill). Each case asserts the kernel classes FlashInfer looked up
(its route), from the keys its cache was asked for. The outputs FlashInfer allocates (o, the
final state) are NaN-poisoned as allocated (check_flashinfer_launch.Poison) and must be among the poisoned
allocations; the checkpoint buffer is the caller's, filled with NaN. Counters: FlashInfer's cache lookups and how
many nojit answered (N of N), objects loaded, `cute.compile` reached (strict mode's guard records every attempt;
must be 0), processes (the preloaded C guard, refusing from the first call on, and an audit hook; must be 0).

    python3 check_gdn_flashinfer.py --stage [--ir-dir .device-gdnfi-ir]   call 1: unpack the MLIR library, sha256
    python3 check_gdn_flashinfer.py --assemble SITE [--dir .device-gdnfi]  call 2: the site (refused if not staged)
    python3 check_gdn_flashinfer.py [--dir .device-gdnfi] [--json OUT]    the check (SITE on PYTHONPATH)
    python3 check_gdn_flashinfer.py --role without --out B2.nojit          the bundle less one key (prints the key)
    python3 check_gdn_flashinfer.py --role negative --bundle B2.nojit --expect-file F   strict refusal naming it
    python3 check_gdn_flashinfer.py --list-sources --vllm-src SITE         the vLLM files the mount loads
Without a GPU the launch phase is skipped after the import path (mount, install, FlashInfer's modules): exit 3.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import subprocess
import sys
import tarfile
import time
from typing import Any

try:
    import lzma
except ImportError:  # a Python built without _lzma: the xz tool (harness steps, before the checked process)
    lzma = None  # type: ignore[assignment]

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, HERE)
RUNTIME = "flashinfer_cute"
FULLY_FUSED = "_FullyFusedDeltaRuleSm90"
CP_ROUTE = ("CPDeltaRuleTPrecomputeSm90", "CPDeltaRuleMNPrecomputeSm90", "CPDeltaRuleFixupHmmaSm90",
            "CPDeltaRulePrefillSm90")
DIR = os.path.join(ROOT, ".device-gdnfi")
IR_DIR = os.path.join(ROOT, ".device-gdnfi-ir")
MLIR_LIBS = ("nvidia_cutlass_dsl", "dsl_packages", "cutlass", "_mlir", "_mlir_libs")
CU13_LIB = ("nvidia_cutlass_dsl", "cu13", "lib")
SKIPPED = 3
NOT_STAGED = 4
CALL_1 = ("run call 1 first, then this call back to back on the same warm machine: carry ['.device-gdnfi-ir'], "
          "command `python3 tests/gpu/checks/check_gdn_flashinfer.py --stage`")


# ---------------------------------------------------------------- call 1: stage the MLIR library (stdlib only)
def file_sha256(path: str) -> str:
    """nojit.loader.bundle.installed.file_sha256's twin: call 1 runs before nojit's wheel is installed (stdlib only)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def stage(ir_dir: str) -> int:
    """Unpack payload A in place, both digests checked, and write staged.json (what call 2 looks for)."""
    t0 = time.perf_counter()
    path = os.path.join(ir_dir, "manifest.json")
    if not os.path.isfile(path):
        print(f"STAGE FAIL: no {path}: carry .device-gdnfi-ir (made by tools/prepare_gdnfi_device.py)")
        return 2
    with open(path) as f:
        ir = json.load(f)["ir"]
    packed = os.path.join(ir_dir, ir["file"])
    if not os.path.isfile(packed) or file_sha256(packed) != ir["xz_sha256"]:
        print(f"STAGE FAIL: {packed} is missing or its sha256 differs from {path}")
        return 2
    target = os.path.join(ir_dir, ir["name"])
    with open(packed, "rb") as src, open(target + ".part", "wb") as dst:
        if lzma is None:
            subprocess.run(["xz", "-dc"], stdin=src, stdout=dst, check=True)
        else:
            dec = lzma.LZMADecompressor()
            for block in iter(lambda: src.read(1 << 20), b""):
                dst.write(dec.decompress(block))
    size = os.path.getsize(target + ".part")
    if file_sha256(target + ".part") != ir["sha256"] or size != ir["size"]:
        os.unlink(target + ".part")
        print(f"STAGE FAIL: {ir['name']} unpacked to a sha256 other than {path}'s")
        return 2
    os.replace(target + ".part", target)
    with open(os.path.join(ir_dir, "staged.json"), "w") as f:
        json.dump({"name": ir["name"], "sha256": ir["sha256"], "size": size}, f)
    print(f"STAGED {ir['name']} ({size / 2**20:.1f} MiB, sha256 {ir['sha256'][:16]}) in {ir_dir} "
          f"in {time.perf_counter() - t0:.1f} s")
    return 0


# ---------------------------------------------------------------- call 2: the site (stdlib only)
class NotStaged(Exception):
    """Call 1 did not run on this machine (or staged another payload)."""


def load_manifest(d: str) -> dict:
    with open(os.path.join(d, "manifest.json")) as f:
        return json.load(f)


def staged_ir(ir_dir: str, manifest: dict) -> str:
    """The MLIR library call 1 left here, checked against call 2's manifest; NotStaged says what to do."""
    want = manifest["ir"]
    staged = os.path.join(ir_dir, "staged.json")
    if not os.path.isfile(staged):
        raise NotStaged(f"{want['name']} is not staged on this machine ({staged} is missing: the machine was not "
                        f"the warm one call 1 left, or call 1 did not run); {CALL_1}")
    with open(staged) as f:
        got = json.load(f)
    path = os.path.join(ir_dir, want["name"])
    if got.get("sha256") != want["sha256"] or not os.path.isfile(path):
        raise NotStaged(f"the staged {got.get('name')} (sha256 {str(got.get('sha256'))[:16]}) is not the one this "
                        f"payload names (sha256 {want['sha256'][:16]}): prepare both payloads together; {CALL_1}")
    if file_sha256(path) != want["sha256"]:
        raise NotStaged(f"{path}: sha256 differs from the stage record (changed since call 1); {CALL_1}")
    return path


def _extract(d: str, facts: dict, site: str) -> None:
    path = os.path.join(d, facts["archive"])
    if file_sha256(path) != facts["sha256"]:
        raise SystemExit(f"{path}: sha256 differs from manifest.json (re-run tools/prepare_gdnfi_device.py)")
    if lzma is None:
        subprocess.run(["tar", "-xJf", path, "-C", site], check=True)
        return
    with tarfile.open(path) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(site, filter="data")
        else:
            tar.extractall(site)  # noqa: S202 - our own archive, sha256-checked


def assemble(d: str, ir_dir: str, site: str) -> int:
    """SITE: nvidia-cutlass-dsl (its files, the C runtime in cu13/lib where CuTeDSL looks, the staged MLIR library
    linked into _mlir_libs) and FlashInfer's Python. The tvm-ffi wheel is installed by the step with pip."""
    from check_cutedsl_launch import RUNTIME_LIB, unpack_runtime

    manifest = load_manifest(d)
    try:
        ir = staged_ir(ir_dir, manifest)
    except NotStaged as exc:
        print(f"GDN-FI: FAIL (not staged): {exc}")
        return NOT_STAGED
    os.makedirs(site, exist_ok=True)
    _extract(d, manifest["cutlass_site"], site)
    _extract(d, manifest["flashinfer"], site)
    libdir = os.path.join(site, *CU13_LIB)
    os.makedirs(libdir, exist_ok=True)
    os.replace(os.path.join(unpack_runtime(d, manifest, site + ".work"), RUNTIME_LIB), os.path.join(libdir, RUNTIME_LIB))
    link = os.path.join(site, *MLIR_LIBS, manifest["ir"]["name"])
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink(os.path.abspath(ir), link)
    print(f"assembled {site}: nvidia-cutlass-dsl {manifest['tools']['nvidia-cutlass-dsl']} "
          f"({manifest['cutlass_site']['files']} files, {RUNTIME_LIB}, {manifest['ir']['name']} staged by call 1), "
          f"FlashInfer {manifest['flashinfer']['version']}")
    return 0


# ---------------------------------------------------------------- the serving process
def vllm_call_kwargs(q: Any, k: Any, v: Any, g: Any, beta: Any, initial_state: Any, cu_seqlens: Any,
                     **checkpoints: Any) -> dict[str, Any]:
    """FlashInfer's `chunk_gated_delta_rule` arguments as vLLM 0.33.0's fi_chunk_gated_delta_rule builds them
    (qwen_gdn_linear_attn.py:313-360, use_qk_l2norm_in_kernel=False as `_forward_core` passes): the fallback when
    vLLM's module cannot be imported; tests/checks/test_check_gdn_flashinfer.py compares it with vLLM's function."""
    import torch

    return {"q": q.squeeze(0).contiguous(), "k": k.squeeze(0).contiguous(), "v": v.squeeze(0).contiguous(),
            "g": torch.exp(g.squeeze(0).contiguous().to(torch.float32)),
            "beta": beta.squeeze(0).contiguous().to(torch.float32),
            "initial_state": initial_state.to(torch.float32), "output_final_state": True,
            "cu_seqlens": cu_seqlens.to(torch.int64),
            "state_checkpoints": checkpoints.get("state_checkpoints"),
            "checkpoint_cu_starts": checkpoints.get("checkpoint_cu_starts"),
            "checkpoint_every_n_tokens": checkpoints.get("checkpoint_every_n_tokens", 0),
            "use_cp": "auto", "backend": "flashinfer"}


def flashinfer_as_vllm_calls(**kw: Any) -> tuple[Any, Any]:
    from flashinfer.gdn_prefill import chunk_gated_delta_rule

    kw.pop("output_final_state")
    kw.pop("use_qk_l2norm_in_kernel")
    output, state = chunk_gated_delta_rule(**vllm_call_kwargs(**kw))
    return output.unsqueeze(0), state


class Lookups:
    """FlashInfer's lookups of its compile cache (nojit's BundledCompileCache), counted: how many, and how many were
    answered with an object nojit loaded from the bundle (`cache.loaded`; an entry FlashInfer's cache held before the
    install, or stored after a compile, is a lookup but not an answer from the bundle)."""

    def __init__(self, cache: Any) -> None:
        from nojit.loader.bundle import fi_cute_key

        self.calls = self.answered = 0
        self.kernels: list[str] = []  # the class (qualname) of each looked-up key, in order
        self.cache, real = cache, cache.get

        def get(key: Any, default: Any = None) -> Any:
            self.calls += 1
            try:
                self.kernels.append(fi_cute_key.kernel_of(fi_cute_key.key_to_json(key)).rpartition(":")[2])
            except ValueError:
                self.kernels.append(repr(key)[:80])
            fn = real(key, default)
            self.answered += fn is not None and any(fn is v for v in cache.loaded.values())
            return fn
        cache.get = get  # an instance attribute: FlashInfer's `_in_mem_compile_cache.get(key)` finds it first


def start(bundle: str, vllm_src: str) -> dict[str, Any]:
    """Mount vLLM's copy, install nojit (strict, the bundle's flashinfer_cute kernels), import the call."""
    from qwen_call_site_steps import GDN, mount_qwen

    from nojit.loader.bundle.file import Bundle
    from nojit.loader.install import install

    mount_qwen(vllm_src)
    b = Bundle.open(bundle)
    ids = {k for k, r in b.manifest.kernels.items() if r.runtime == RUNTIME}
    b.close()
    t0 = time.perf_counter()
    inst = install(bundle_path=bundle, mode="strict", allow_mismatch=frozenset({"vllm"}), kernels=ids)
    import triton  # noqa: F401  (vLLM has imported it before any plugin loads)

    from nojit.loader.runtimes.triton.driver import answer_from_torch

    # what nojit's vLLM plugin does right after install (loader/plugin.py): Triton's driver questions answered from
    # torch; without it vLLM's FLA import built Triton's cuda_utils on the H200 (refused: strict mode), session 10
    answer_from_torch()
    s: dict[str, Any] = {"install_ms": round(1000 * (time.perf_counter() - t0), 1), "kernels": len(ids)}
    try:
        s["call"], s["via"] = importlib.import_module(GDN).fi_chunk_gated_delta_rule, f"vLLM {GDN}.fi_chunk_gated_delta_rule"
    except Exception as exc:  # noqa: BLE001 - the brief's fallback, said in the output
        s["call"] = flashinfer_as_vllm_calls
        s["via"] = (f"FlashInfer's chunk_gated_delta_rule with vLLM's arguments (vLLM's module did not import: "
                    f"{type(exc).__name__}: {str(exc)[:300]})")
    import flashinfer
    import flashinfer.gdn_prefill as gp
    from flashinfer.gdn_kernels.delta_rule_dsl import custom_compile_cache as ccc
    from nojit.loader.runtimes.flashinfer_cute.serving import BundledCompileCache

    cache = inst.state(RUNTIME)
    s["flashinfer"] = f"{getattr(flashinfer, '__version__', '?')} from {os.path.dirname(flashinfer.__file__)}"
    s["sm90_kernel_module"] = gp.chunk_gated_delta_rule_sm90 is not None  # FlashInfer's own try/except import
    s["cache_is_nojit"] = isinstance(ccc._in_mem_compile_cache, BundledCompileCache) and ccc._in_mem_compile_cache is cache
    s["lookups"] = Lookups(cache)
    return s


def run_case(call: Any, lookups: Lookups, route: tuple[str, ...], name: str, lengths: list[int], every: int,
             seed: int) -> dict[str, Any]:
    """One prefill as vLLM's `_forward_core` makes it ([1, T, heads, dim] operands, g = log alpha, int32 cu_seqlens);
    `route`: the kernel classes FlashInfer's wrapper must look up for it (no other)."""
    import torch
    from check_flashinfer_launch import Poison
    from check_gdn_prefill import HV, compare, inputs, reference

    r: dict[str, Any] = {"case": name, "lengths": lengths, "every": every, "route": list(route)}
    first = len(lookups.kernels)
    x = inputs(lengths, seed, "cuda")
    g = torch.log(x["alpha"])
    x["alpha"] = torch.exp(g)  # what FlashInfer receives (vLLM passes exp(g))
    ref = reference(x, every)
    kw: dict[str, Any] = {}
    if every:
        n = len(lengths)
        per = [(x["cu"][i + 1] - x["cu"][i]) // every for i in range(n)]
        kw = {"state_checkpoints": torch.full((sum(per), HV, x["v"].shape[-1], x["q"].shape[-1]), float("nan"),
                                              dtype=torch.float32, device="cuda"),
              "checkpoint_cu_starts": torch.tensor([sum(per[:i]) for i in range(n + 1)], dtype=torch.int64,
                                                   device="cuda"),
              "checkpoint_every_n_tokens": every}
    try:
        with Poison() as poison:
            o, state = call(q=x["q"][None], k=x["k"][None], v=x["v"][None], g=g[None], beta=x["beta"][None],
                            initial_state=x["init"], output_final_state=True,
                            cu_seqlens=torch.tensor(x["cu"], dtype=torch.int32, device="cuda"),
                            use_qk_l2norm_in_kernel=False, **kw)
        torch.cuda.synchronize()
        r["poisoned"] = poison.hit(o) and poison.hit(state)
        r.update(compare({"o": o[0], "state": state, "ckpt": kw.get("state_checkpoints")}, ref, every))
        r["looked_up"] = sorted(set(lookups.kernels[first:]))
        r["ok"] = bool(r["ok"] and r["poisoned"] and r["looked_up"] == sorted(route))
    except Exception as exc:  # noqa: BLE001 - reported per case
        r.update(ok=False, error=f"{type(exc).__name__}: {str(exc)[:600]}")
    return r


def serving_check(args: argparse.Namespace) -> int:
    import check_flashinfer_launch as fl
    from check_gdn_prefill import CASES, CP_CASES, TOL

    result: dict[str, Any] = {"ok": False}
    sys.addaudithook(fl._audit_hook)
    guard = fl.process_guard()
    import torch

    gpu = torch.cuda.is_available()
    if gpu:
        if guard is None:
            print("GDN-FI: FAIL: the process guard is not preloaded (LD_PRELOAD=libnojit_exec_guard.so)")
            return 1
        _before_counting()
        torch.empty(1, device="cuda")
    base = fl.counts(guard) if guard else {"python_processes": len(fl._audit)}
    s = start(args.bundle or os.path.join(args.dir, "gdn.nojit"), os.path.join(args.dir, "vllm_src"))
    if guard:  # processes started by the install and the imports (tvm_ffi, FlashInfer, CuTeDSL): must be 0 too
        s["processes_install_and_import"] = {k: v - base[k] for k, v in fl.counts(guard).items()}
    lookups = s.pop("lookups")
    call = s.pop("call")
    result["start"] = s
    print(json.dumps(s))
    ready = s["sm90_kernel_module"] and s["cache_is_nojit"]
    if not gpu:
        print(f"SKIP: no CUDA device; the import path {'ran' if ready else 'FAILED'} (the launch needs the H200)")
        return SKIPPED if ready else 1
    from nojit.loader.strict import guards

    guard.nojit_guard_set_mode(1)  # from here every process start and NVRTC compile is refused
    t0 = time.perf_counter()
    cases = ([run_case(call, lookups, (FULLY_FUSED,), *c) for c in CASES]
             + [run_case(call, lookups, CP_ROUTE, *c) for c in CP_CASES])
    result["launch_seconds"] = round(time.perf_counter() - t0, 2)
    guard.nojit_guard_set_mode(0)
    end = fl.counts(guard)  # from before the install: the imports' processes count too
    cache = lookups.cache
    counters = {"lookups": lookups.calls, "answered_by_nojit": lookups.answered, "objects_loaded": len(cache.loaded),
                "misses": len(cache.misses), "compile_attempts_refused": len(guards.compile_attempts),
                **{k: end[k] - base[k] for k in end}}
    result.update(cases=cases, counters=counters, compile_attempts=list(guards.compile_attempts),
                  python_process_events=list(fl._audit))
    for c in cases:
        print(f"  {'ok  ' if c['ok'] else 'FAIL'} {c['case']}: {c.get('errors') or c.get('error')} poisoned: "
              f"{c.get('poisoned')} control rejected: {c.get('control_rejected')}; looked up {c.get('looked_up')}"
              f"{'' if c.get('looked_up') == sorted(c['route']) else ' (expected ' + str(sorted(c['route'])) + ')'}")
    zero = (counters["compile_attempts_refused"] == 0 and counters["misses"] == 0 and counters["c_processes"] == 0
            and counters["nvrtc_compiles"] == 0 and counters["python_processes"] == 0)
    answered = lookups.calls >= len(cases) and lookups.answered == lookups.calls  # >= one per call on either route
    result["ok"] = ready and zero and answered and all(c["ok"] and c.get("control_rejected") for c in cases)
    print(f"{sum(c['ok'] for c in cases)}/{len(cases)} GDN prefill cases within {TOL} of float64 via {s['via']}; "
          f"FlashInfer's cache answered {lookups.answered} of {lookups.calls} lookups from the bundle "
          f"({counters['objects_loaded']} objects loaded by cute.runtime.load_module: {sorted(set(lookups.kernels))}); compile attempts refused "
          f"{counters['compile_attempts_refused']} {list(guards.compile_attempts)}; processes {counters['c_processes'] + counters['python_processes']}, "
          f"NVRTC {counters['nvrtc_compiles']}")
    print("GDN-FI:", "PASS" if result["ok"] else "FAIL")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1, default=str)
    return 0 if result["ok"] else 1


# ---------------------------------------------------------------- the negative control
def is_victim(entry: Any) -> bool:
    """The key the 3-sequence case needs: the fused kernel without checkpoints."""
    return entry.kernel.endswith(":" + FULLY_FUSED) and not dict(entry.key[2])["needs_checkpointing"][1]


def role_without(args: argparse.Namespace) -> int:
    """The bundle less the victim entry; prints the key as the strict refusal must name it."""
    from check_one_process import bundle_without

    from nojit.loader.bundle import fi_cute_key
    from nojit.loader.bundle.file import Bundle

    src = args.bundle or os.path.join(args.dir, "gdn.nojit")
    b = Bundle.open(src)
    victims = [e for e in b.manifest.entries if b.manifest.kernels[e.kernel].runtime == RUNTIME and is_victim(e)]
    b.close()
    if len(victims) != 1:
        print(f"expected one {FULLY_FUSED} entry without checkpoints in {src}, found {len(victims)}", file=sys.stderr)
        return 1
    bundle_without(src, args.out, drop_if=is_victim)
    print(fi_cute_key.key_text(victims[0].key))
    return 0


def role_negative(args: argparse.Namespace) -> int:
    """The 3-sequence case on the bundle less its key: strict refusal naming the key, nothing compiled or started."""
    import check_flashinfer_launch as fl
    from check_gdn_prefill import CASES

    from nojit.loader.errors import KernelNotInBundleError
    from nojit.loader.strict import guards

    with open(args.expect_file) as f:
        expect = f.read().strip().splitlines()[-1]
    sys.addaudithook(fl._audit_hook)
    guard = fl.process_guard()
    import torch

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device (FlashInfer's wrapper asks the GPU before its lookup)")
        return SKIPPED
    if guard is None:  # its process count would be 0 by construction
        print("NEGATIVE CONTROL: FAIL: the process guard is not preloaded (LD_PRELOAD=libnojit_exec_guard.so)")
        return 1
    _before_counting()
    base = fl.counts(guard)
    s = start(args.bundle, os.path.join(args.dir, "vllm_src"))
    x = CASES[0]
    refused = None
    try:
        run_case_raising(s["call"], x[1], x[3])
    except KernelNotInBundleError as exc:
        refused = exc
    except Exception as exc:  # noqa: BLE001
        print(f"the call failed, but not with a strict refusal: {type(exc).__name__}: {str(exc)[:600]}")
    end = fl.counts(guard)
    started = sum(end[k] - base[k] for k in end if k != "nvrtc_compiles")
    named = refused is not None and expect in refused.message
    ok = (named and not guards.compile_attempts and s["lookups"].answered == 0 and started == 0
          and len(s["lookups"].cache.loaded) == 0)
    if refused is not None:
        print(f"strict refusal: {refused.message}\n  fix: {refused.fix}")
    print(f"NEGATIVE CONTROL: {'PASS' if ok else 'FAIL'} (refused {refused is not None}, the removed key named {named}, "
          f"compile attempts refused {len(guards.compile_attempts)} {list(guards.compile_attempts)}, objects loaded {len(s['lookups'].cache.loaded)}, "
          f"processes {started})")
    return 0 if ok else 1



def _before_counting() -> None:
    """What a server has done before any plugin loads: CUDA up, and cuda.pathfinder imported (its import runs
    ctypes.util.find_library: ldconfig, and gcc and file where ldconfig lacks libdl; check_flashinfer_launch does the
    same), so the counted windows hold what FlashInfer, CuTeDSL and nojit start."""
    import torch

    torch.cuda.init()
    try:
        import cuda.pathfinder  # noqa: F401
    except ImportError:
        pass

def run_case_raising(call: Any, lengths: list[int], seed: int) -> None:
    import torch
    from check_gdn_prefill import inputs

    x = inputs(lengths, seed, "cuda")
    call(q=x["q"][None], k=x["k"][None], v=x["v"][None], g=torch.log(x["alpha"])[None], beta=x["beta"][None],
         initial_state=x["init"], output_final_state=True,
         cu_seqlens=torch.tensor(x["cu"], dtype=torch.int32, device="cuda"), use_qk_l2norm_in_kernel=False)
    torch.cuda.synchronize()


def list_sources(vllm_src: str) -> list[str]:
    from qwen_call_site_steps import GDN, mount_qwen

    finder = mount_qwen(vllm_src)
    importlib.import_module(GDN)
    return sorted(set(finder.loaded))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=DIR)
    ap.add_argument("--ir-dir", default=IR_DIR)
    ap.add_argument("--stage", action="store_true")
    ap.add_argument("--assemble", metavar="SITE")
    ap.add_argument("--role", choices=("check", "without", "negative"), default="check")
    ap.add_argument("--bundle")
    ap.add_argument("--out")
    ap.add_argument("--expect-file")
    ap.add_argument("--json")
    ap.add_argument("--list-sources", action="store_true")
    ap.add_argument("--vllm-src")
    args = ap.parse_args()
    if args.stage:
        return stage(args.ir_dir)
    if args.assemble:
        return assemble(args.dir, args.ir_dir, args.assemble)
    if args.list_sources:
        print(json.dumps({"files": list_sources(args.vllm_src)}))
        return 0
    if args.role == "without":
        return role_without(args)
    if args.role == "negative":
        return role_negative(args)
    return serving_check(args)


if __name__ == "__main__":
    sys.exit(main())
