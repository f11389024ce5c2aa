"""Humming's GEMM kernels on the H200: the bundle's cubins against Humming's own JIT compiling them there.

Two processes of this script run the SAME cases of tests/gpu/checks/check_humming_gemm.py (same layers, seeds, weights,
routing and activations; every input's sha256 is recorded in both and compared), one after the other:
  * bundle: a strict serving process, as in the `humming-gemm` step: nojit installed, Humming's cache seeded from
    `.device-hg/humming.nojit`, 0 arrivals at Humming's compile step, 0 processes;
  * jit: nojit not installed (not even imported: checked), a fresh empty HUMMING_CACHE_DIR, Humming's own
    NVRTC path compiling every kernel it constructs (its `nvrtc_compile` child with the NVRTC library Humming
    finds on this machine, CUDA headers from the include folders Humming finds; see `--nvrtc-dir`).
Each launch writes into a NaN-poisoned output and is run twice (the repeat says whether the kernel is deterministic,
without which bitwise equality between the two processes means little). The parent then reports, per case: bitwise
equal or not (max abs diff, number of differing elements), Humming's own `_assert_close` rule against the float64
reference for both outputs, whether the two cubins are byte-identical and whether both processes computed the same
Humming cache key; per kernel Humming built: the JIT-written cubin against the bundle's blob for the same source
(where they differ: the ELF sections that differ, the NVRTC/ptxas version and options each cubin records, and any
install path it embeds); and the toolchain of the JIT (NVRTC library and version, options, CUDA headers) against
the build box's (`build_toolchain.json`, written by tools/prepare_humming_device.py).

    python tests/gpu/checks/check_humming_jit.py --dir .device-hg --work /tmp/w/hg-jit [--out DIR] [--json OUT]
        [--tokens 1,4,64,200,300,435,500] [--nvrtc-dir DIR]

Fails (exit 1) when: a process wrote nothing or no case ran, the bundle process compiled or started a process, the
JIT process compiled nothing or had nojit imported, the two processes' inputs differ, or a case's outputs differ
while each process reproduced its own output bit for bit. Outputs outside Humming's rule are reported, not failed
(that is what this step measures).
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROLES = ("bundle", "jit")
PATH_MARK = b"/humming/include/"  # Humming's headers' install path, embedded by device asserts (__FILE__)
MAX_CUBIN_PAIRS = 8  # differing cubin pairs copied to --out for a closer look


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default=".device-hg", help="made by tools/prepare_humming_device.py")
    ap.add_argument("--work", default="/tmp/nojit-hg-jit", help="scratch: outputs, the JIT's cache (emptied first)")
    ap.add_argument("--out", help="where differing cubin pairs are copied")
    ap.add_argument("--json")
    ap.add_argument("--tokens", default="1,4,64,200,300,435,500")
    ap.add_argument("--nvrtc-dir", help="the folder of libnvrtc.so* for the JIT when Humming finds none itself")
    ap.add_argument("--role", choices=ROLES, help=argparse.SUPPRESS)  # a child process of this script
    ap.add_argument("--timeout", type=int, default=420, help="seconds per child process")
    opts = ap.parse_args(argv)
    try:
        opts.token_counts = [int(t) for t in opts.tokens.split(",")]
    except ValueError:
        ap.error(f"--tokens {opts.tokens!r}: comma-separated token counts expected")
    if not opts.token_counts or min(opts.token_counts) < 1:
        ap.error(f"--tokens {opts.tokens!r}: positive token counts expected")
    return opts


# ------------------------------------------------------------------------------------------------ comparisons
def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def tensor_digest(t) -> str:
    """sha256 of a tensor's bytes (dtype and shape included)."""
    import torch

    c = t.detach().contiguous().cpu()
    head = f"{c.dtype}{tuple(c.shape)}".encode()
    return sha256(head + c.reshape(-1).view(torch.uint8).numpy().tobytes()) if c.numel() else sha256(head)


def compare_outputs(a, b) -> dict:
    """Bitwise comparison of two outputs of one case (NaN-safe: compared as bits), with the size of any difference."""
    import torch

    if a.shape != b.shape or a.dtype != b.dtype:
        return {"bitwise_equal": False, "reason": f"{a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"}
    bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    differ = a.contiguous().view(bits) != b.contiguous().view(bits)
    x, y = a.double(), b.double()
    diff = (x - y).abs().masked_fill(torch.isnan(x) & torch.isnan(y), 0.0)  # NaN on one side only: inf
    return {"bitwise_equal": not bool(differ.any()), "differing": int(differ.sum()), "numel": a.numel(),
            "max_abs_diff": float(diff.nan_to_num(float("inf")).max()) if a.numel() else 0.0,
            "nan": [int(torch.isnan(a.double()).sum()), int(torch.isnan(b.double()).sum())]}


def elf_sections(data: bytes) -> dict[str, bytes]:
    """Section name -> contents of an ELF64 little-endian file (a cubin); NOBITS sections as b''."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not an ELF64 file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * entsize) for i in range(count)]
    names = headers[names_index]
    out: dict[str, bytes] = {}
    for h in headers:
        start = names[4] + h[0]
        name = data[start:data.index(b"\0", start)].decode(errors="replace")
        key, n = name, 1
        while key in out:  # repeated names (the null section): numbered
            key, n = f"{name}#{n}", n + 1
        out[key] = b"" if h[1] == 8 else data[h[4]:h[4] + h[5]]
    return out


def tool_info(data: bytes) -> list[str]:
    """The strings of a cubin's .note.nv.tkinfo: the tool (ptxas), its version and its options."""
    try:
        note = elf_sections(data).get(".note.nv.tkinfo", b"")
    except (ValueError, struct.error, IndexError):
        return []
    return [s.decode() for s in note.split(b"\0") if len(s) > 3 and all(32 <= c < 127 for c in s)]


def embedded_paths(data: bytes) -> list[str]:
    """Install paths of Humming's headers in a cubin (the __FILE__ of a device assert), each once."""
    found, i = [], data.find(PATH_MARK)
    while i >= 0:
        start = data.rfind(b"\0", 0, i) + 1
        end = data.find(b"\0", i)
        path = data[start:end if end >= 0 else len(data)].decode(errors="replace")
        if path not in found:
            found.append(path)
        i = data.find(PATH_MARK, i + 1)
    return found


def cubin_difference(bundled: bytes, jit: bytes) -> dict:
    """What differs between the bundle's cubin and the JIT's for the same kernel source."""
    out: dict = {"identical": bundled == jit, "bytes": [len(bundled), len(jit)]}
    if out["identical"]:
        return out
    try:
        a, b = elf_sections(bundled), elf_sections(jit)
        out["sections_differing"] = sorted(n for n in set(a) | set(b) if a.get(n) != b.get(n))
        out["text_identical"] = all(a.get(n) == b.get(n) for n in set(a) | set(b) if n.startswith(".text"))
    except (ValueError, struct.error, IndexError) as exc:
        out["sections_differing"] = [f"unreadable: {exc}"]
    out["tool"] = [tool_info(bundled), tool_info(jit)]
    out["paths"] = [embedded_paths(bundled), embedded_paths(jit)]
    if out["paths"][0] != out["paths"][1] and out.get("text_identical"):
        out["explained"] = "the embedded install path of Humming's headers (an assert's __FILE__); code identical"
    return out


# ------------------------------------------------------------------------------------------------ toolchain
INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\n]+)[>"]', re.M)


def header_closure(include_dirs: list[str], start: list[bytes], skip: set[str]) -> dict[str, str]:
    """Every header reachable by #include from `start` (texts), resolved as the compiler does ("x" next to the
    including file first, then the include folders in order), conditionals ignored (a superset): label -> sha256,
    the label being the include folder's index and the path under it (machine paths left out)."""
    dirs = [os.path.abspath(d) for d in include_dirs]

    def label(path: str) -> str:
        owners = [(len(d), i, d) for i, d in enumerate(dirs) if path.startswith(d + os.sep)]
        if not owners:
            return "abs:" + path
        _, i, d = max(owners)
        return f"I{i}:{os.path.relpath(path, d)}"

    seen: dict[str, str] = {}
    queue: list[tuple[bytes, str | None]] = [(text, None) for text in start]
    while queue:
        text, where = queue.pop()
        for quote, name in INCLUDE.findall(text):
            name = name.decode(errors="replace").strip()
            if name in skip:
                continue
            folders = ([os.path.dirname(where)] if quote == b'"' and where else []) + dirs
            for d in folders:
                path = os.path.abspath(os.path.join(d, name))
                if os.path.isfile(path):
                    if path not in seen:
                        with open(path, "rb") as f:
                            data = f.read()
                        seen[path] = sha256(data)
                        queue.append((data, path))
                    break
    return {label(p): h for p, h in sorted(seen.items())}


def describe_toolchain() -> dict:
    """What Humming's NVRTC compile is made of in this process, besides the kernel: its compiler class, the NVRTC
    library it finds (version, file digests, the builtins library beside it), its options (include folders by
    index), the CUDA and Humming headers the kernels can reach (digests) and its nvrtc_compile helper."""
    from humming.jit.compiler import Compiler, NVRTCCompiler
    from humming.jit.runtime import KernelRuntime
    from humming.utils import nvrtc

    def file_digest(path: str) -> str:
        with open(path, "rb") as f:
            return sha256(f.read())

    lib = nvrtc.get_nvrtc_library_path()
    real = os.path.realpath(lib)
    folder = os.path.dirname(real)
    includes = [os.path.abspath(d) for d in NVRTCCompiler._get_include_dirs()]
    flags = NVRTCCompiler.get_flags("90a")
    options = [f"-I<I{includes.index(os.path.abspath(f[2:]))}>" if f.startswith("-I")
               and os.path.abspath(f[2:]) in includes else f for f in flags]
    root = Compiler.humming_include_dir()
    start = []
    for path in sorted(glob.glob(f"{root}/**/*.cuh", recursive=True)):
        with open(path, "rb") as f:
            start.append(f.read())
    start += [content.encode() for content in NVRTCCompiler._STD_HEADER_SHIMS.values()]
    helper = nvrtc.may_build_nvrtc_compile_binary()
    try:
        import importlib.metadata

        pip_nvrtc = importlib.metadata.version("nvidia-cuda-nvrtc")
    except Exception:  # not installed through pip here
        pip_nvrtc = None
    return {"compiler": KernelRuntime._get_compiler().__name__,
            "nvrtc_library": lib, "nvrtc_realpath": real, "nvrtc_version": "%d.%d" % NVRTCCompiler._get_version(),
            "nvrtc_sha256": file_digest(real),
            "nvrtc_builtins": {n: file_digest(os.path.join(folder, n)) for n in sorted(os.listdir(folder))
                               if n.startswith("libnvrtc-builtins") and ".alt." not in n},
            "pip_nvidia_cuda_nvrtc": pip_nvrtc,
            "nvrtc_compile": {"path": helper, "sha256": file_digest(helper)},
            "include_dirs": includes, "options": options,
            "headers": header_closure(includes, start, set(NVRTCCompiler._STD_HEADER_SHIMS))}


def toolchain_differences(build: dict, here: dict) -> list[str]:
    """What differs between two describe_toolchain() results (the build box's, this machine's)."""
    out = []
    for key in ("compiler", "nvrtc_version", "nvrtc_sha256", "nvrtc_builtins", "pip_nvidia_cuda_nvrtc", "options"):
        if build.get(key) != here.get(key):
            extra = f" ({build.get('nvrtc_realpath')} vs {here.get('nvrtc_realpath')})" if key == "nvrtc_sha256" else ""
            out.append(f"{key}: {json.dumps(build.get(key))[:300]} vs {json.dumps(here.get(key))[:300]}{extra}")
    if (build.get("nvrtc_compile") or {}).get("sha256") != (here.get("nvrtc_compile") or {}).get("sha256"):
        out.append("nvrtc_compile helper differs")
    a, b = build.get("headers") or {}, here.get("headers") or {}
    only_build, only_here = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    changed = sorted(k for k in set(a) & set(b) if a[k] != b[k])
    for what, names in (("headers only on the build box", only_build), ("headers only here", only_here),
                        ("headers with other contents", changed)):
        if names:
            out.append(f"{what}: {len(names)} ({', '.join(names[:8])}{', ...' if len(names) > 8 else ''})")
    return out


# ------------------------------------------------------------------------------------------------ children
def _kernel_objects() -> list:
    """Every kernel object Humming constructed in this process (all KernelRuntime subclasses' instances)."""
    from humming.jit.runtime import KernelRuntime

    seen, out, classes = set(), [], [KernelRuntime]
    while classes:
        cls = classes.pop()
        classes += cls.__subclasses__()
        for obj in list(cls.__dict__.get("_instances", {}).values()):
            if id(obj) not in seen and getattr(obj, "kernel_filename", None):
                seen.add(id(obj))
                out.append(obj)
    return out


def kernels_built() -> list[dict]:
    """Per kernel object: class, the digest of its rendered source, its cubin file and digest, Humming's cache key."""
    rows = []
    for obj in _kernel_objects():
        with open(obj.kernel_filename, "rb") as f:
            cubin = f.read()
        rows.append({"class": type(obj).__name__, "code_sha256": sha256(obj.code.encode()),
                     "kernel_file": obj.kernel_filename, "cubin_sha256": sha256(cubin),
                     "key": os.path.basename(os.path.dirname(obj.kernel_filename))})
    return sorted(rows, key=lambda r: (r["class"], r["code_sha256"]))


def run_cases(g, opts, role: str, report: dict) -> None:
    """check_humming_gemm's cases (its layers, seeds and launch), each launched twice, outputs saved for the parent."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    with open(os.path.join(opts.dir, "humming_calls.json")) as f:
        calls = json.load(f)
    locks = g.make_locks()
    folder = os.path.join(opts.work, role)
    for li, layer in enumerate(calls["layers"]):
        top_k = int(layer["moe"].get("top_k", g.TOP_K_DEFAULT))
        for op, call in layer["gemms"].items():
            t0 = time.perf_counter()
            try:  # weights converted and repacked by Humming (its weight-transform kernels: bundle's or JIT's)
                gemm = g.Gemm(op, call, layer["input_schema"], seed=g.gemm_seed(li, op))
            except Exception as exc:
                report["failures"].append(f"{role} {op}: weight preparation failed: {type(exc).__name__}: {str(exc)[:600]}")
                report["tracebacks"].append(traceback.format_exc()[-3000:])
                continue
            report["weights"][op] = {"checkpoint": [tensor_digest(gemm.w_bytes), tensor_digest(gemm.s_bytes)],
                                     "transformed": {k: tensor_digest(v) for k, v in sorted(gemm.tensors.items())
                                                     if isinstance(v, torch.Tensor)},
                                     "config_matches": gemm.config_matches, "s": round(time.perf_counter() - t0, 2)}
            if not gemm.config_matches:
                report["failures"].append(f"{role} {op}: Humming's layer config differs from vLLM's bundled one")
            for t in opts.token_counts:
                row: dict = {"op": op, "tokens": t}
                try:
                    case = gemm.case(t, top_k, g.case_seed(t, li))
                    if case is None:
                        raise RuntimeError(f"M={t * top_k} is in no interval of the tuning table")
                    row["inputs"] = tensor_digest(torch.cat([case[k].reshape(-1).view(torch.uint8) for k in (
                        "topk", "q", "scale", "sorted_ids", "expert_ids", "padded")]))
                    out, first_s = gemm.launch(case, locks)
                    again, _ = gemm.launch(case, locks)  # a fresh poisoned output: is the kernel deterministic?
                    row.update(gemm.check(case, out, first_s))
                    row["repeat_equal"] = compare_outputs(out, again)["bitwise_equal"]
                    path = os.path.join(folder, f"{op}_{t}.pt")
                    torch.save(out.cpu(), path)
                    row["output"] = path
                    with open(row["kernel_file"], "rb") as f:
                        row["cubin_sha256"] = sha256(f.read())
                except Exception as exc:
                    row.update(ok=False, reason=f"{type(exc).__name__}: {str(exc)[:600]}")
                    report["tracebacks"].append(traceback.format_exc()[-3000:])
                report["cases"].append(row)
                print(f"  [{role}] {op} tokens={t} M={row.get('m')} interval={row.get('interval')} "
                      f"stream_k={row.get('stream_k')}: {'ok' if row.get('ok') else 'outside rule'} "
                      f"{row.get('stats', row.get('reason', ''))} repeat_equal={row.get('repeat_equal')}", flush=True)
            del gemm
            torch.cuda.empty_cache()


def bundle_child(g, opts, report: dict) -> None:
    inst, compiles = g.install_strict(opts.dir)
    g._imports_done()
    report["seeded_from_bundle"] = len(inst.state("humming").seeded)
    run_cases(g, opts, "bundle", report)
    report["compiles"] = list(compiles)
    report["bundle_hits"], report["misses"] = inst.state("humming").hits, list(inst.state("humming").misses)


def _choose_nvrtc(opts, report: dict) -> str:
    """Humming's own choice of NVRTC library; `--nvrtc-dir` (or, where Humming finds none, the cu13 folder of the
    `nvidia` packages on sys.path) in its place. Its folder goes on LD_LIBRARY_PATH: the NVRTC child loads
    libnvrtc-builtins from there."""
    import humming.utils.nvrtc as nvrtc
    from humming.utils.cuda import filter_cuda_paths

    found, error = None, None
    if not opts.nvrtc_dir:
        try:
            found = nvrtc.get_nvrtc_library_path()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
    if found is None:
        dirs = [opts.nvrtc_dir] if opts.nvrtc_dir else [os.path.join(p, "nvidia", "cu13", "lib") for p in sys.path]
        libs = [lib for d in dirs for lib in sorted(glob.glob(os.path.join(d, "libnvrtc.so*"))) if ".alt." not in lib]
        if not libs:
            raise RuntimeError(f"no NVRTC library: Humming found none ({error}) and none in {dirs[:4]}")
        found = libs[0]
        chosen = (os.path.dirname(found), found)
        nvrtc._find_nvrtc_lib_dir = lambda: (*chosen, filter_cuda_paths(required_headers=["cuda_runtime.h"]))
        report["nvrtc_choice"] = f"given: {found} (Humming's own: {error or 'not asked'})"
    else:
        report["nvrtc_choice"] = f"Humming's own: {found}"
    folder = os.path.dirname(os.path.realpath(found))
    os.environ["LD_LIBRARY_PATH"] = ":".join(filter(None, [folder, os.environ.get("LD_LIBRARY_PATH")]))
    return found


def jit_child(g, opts, report: dict) -> None:
    cache = os.environ.get("HUMMING_CACHE_DIR", "")
    if not cache or not os.path.isdir(cache) or os.listdir(cache):
        raise RuntimeError(f"HUMMING_CACHE_DIR={cache!r} is not an empty folder: the JIT must start from nothing")
    import humming.utils.nvrtc  # noqa: F401  (imported with its background helper build off; see main)

    os.environ.pop("HUMMING_DISABLE_PARALLEL_BUILD", None)  # Humming's default: compile_many in parallel
    _choose_nvrtc(opts, report)
    helper = humming.utils.nvrtc.may_build_nvrtc_compile_binary()
    if not os.access(helper, os.X_OK):
        raise RuntimeError(f"{helper} is not executable (the carry lost its mode: device_run.sh sets it)")
    compiles = g.count_compiles()
    g._imports_done()
    try:
        report["toolchain"] = describe_toolchain()
    except Exception as exc:  # the comparison of outputs and cubins does not need it
        report["toolchain_error"] = f"{type(exc).__name__}: {str(exc)[:600]}"
    t0 = time.perf_counter()
    run_cases(g, opts, "jit", report)
    report["seconds_with_compiles"] = round(time.perf_counter() - t0, 1)
    report["compiles"] = list(compiles)
    report["nojit_imported"] = sorted(m for m in sys.modules if m == "nojit" or m.startswith("nojit."))
    signatures = sorted(glob.glob(os.path.join(cache, "*", "signature.txt")))
    if signatures:  # Humming's key on this machine: class $$ NVRTC $$ flags $$ expr $$ code $$ header mtimes
        with open(signatures[0]) as f:
            parts = f.read().split("$$")
        report["key_parts"] = {"compiler": parts[0], "nvrtc": parts[1], "flags": parts[2][:2000],
                               "header_mtimes": len(json.loads(parts[5])) if len(parts) > 5 and parts[5][:1] == "{"
                               else None}
    logs = [p for p in glob.glob(os.path.join(cache, "*", "stderr.log")) if os.path.getsize(p)]
    report["compiler_messages"] = [open(p).read()[-1500:] for p in logs[:2]]


def child_main(opts) -> int:
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.abspath(os.path.join(opts.dir, "site")))
    import check_humming_gemm as g

    sys.addaudithook(g._audit)
    report: dict = {"role": opts.role, "cases": [], "weights": {}, "failures": [], "tracebacks": []}
    t0 = time.perf_counter()
    try:
        (bundle_child if opts.role == "bundle" else jit_child)(g, opts, report)
        report["kernels"] = kernels_built()
    except Exception as exc:
        report["failures"].append(f"{opts.role}: {type(exc).__name__}: {str(exc)[:800]}")
        report["tracebacks"].append(traceback.format_exc()[-4000:])
    report["processes"] = len(g.PROCESSES)
    report["processes_first"] = g.PROCESSES[:3]
    report["processes_at_import"] = len(g.AT_IMPORT)
    report["seconds"] = round(time.perf_counter() - t0, 1)
    with open(os.path.join(opts.work, f"{opts.role}.json"), "w") as f:
        json.dump(report, f, indent=1, default=str)
    for tb in report["tracebacks"][:2]:
        print(tb, file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------------------ parent
def bundle_blobs(bundle_path: str) -> dict[str, tuple[str, bytes]]:
    """The bundle's Humming entries by the digest of their rendered source: (blob digest, cubin)."""
    from nojit.loader.bundle.file import Bundle

    b = Bundle.open(bundle_path)
    out = {}
    for kid in b.kernel_ids():
        if b.index.kernels[kid].runtime == "humming":
            for e in b.entries(kid):
                out[sha256(e.launch.code.encode())] = (e.blob, b.read_blob(e.blob))
    return out


def compare(bundle: dict, jit: dict, blobs: dict[str, tuple[str, bytes]], build_toolchain: dict | None,
            load, copy_pair=None) -> dict:
    """The two children's reports -> the step's report. `load(path)` reads a saved output; `copy_pair(name, a, b)`
    keeps a differing cubin pair. Pure apart from those two (tested on the CPU with synthetic reports)."""
    report: dict = {"cases": [], "kernels": {}, "failures": [], "toolchain_differences": None}
    for role, r in (("bundle", bundle), ("jit", jit)):
        if not r:
            report["failures"].append(f"the {role} process wrote no report")
        else:
            report["failures"] += r.get("failures", [])
    if not bundle or not jit:
        return report
    if bundle.get("compiles") or bundle.get("processes"):
        report["failures"].append(f"bundle process: {len(bundle.get('compiles') or [])} compiles, "
                                  f"{bundle.get('processes')} processes (strict serving must have none)")
    if not jit.get("compiles"):
        report["failures"].append("the JIT process compiled nothing: it cannot have been Humming's JIT")
    if jit.get("nojit_imported"):
        report["failures"].append(f"nojit was imported in the JIT process: {jit['nojit_imported'][:3]}")
    if bundle.get("weights") != jit.get("weights") and bundle.get("weights") and jit.get("weights"):
        for op in sorted(set(bundle["weights"]) | set(jit["weights"])):
            a, b = bundle["weights"].get(op, {}), jit["weights"].get(op, {})
            if a.get("checkpoint") != b.get("checkpoint"):
                report["failures"].append(f"{op}: the checkpoint weights differ between the processes")
            ta, tb = a.get("transformed") or {}, b.get("transformed") or {}
            if ta != tb:  # the weight-transform kernels' outputs
                names = sorted(k for k in set(ta) | set(tb) if ta.get(k) != tb.get(k))
                report["failures"].append(f"{op}: Humming's transformed weights differ (bundle's vs JIT's transform "
                                          f"kernels): {names}")
    jit_cases = {(c["op"], c["tokens"]): c for c in jit.get("cases", [])}
    for c in bundle.get("cases", []):
        j = jit_cases.get((c["op"], c["tokens"]))
        row = {"op": c["op"], "tokens": c["tokens"], "m": c.get("m"), "interval": c.get("interval"),
               "block_shape": c.get("block_shape"), "stream_k": c.get("stream_k"),
               "bundle_rule": c.get("ok"), "bundle_stats": c.get("stats"), "jit_rule": (j or {}).get("ok"),
               "jit_stats": (j or {}).get("stats"), "repeat_equal": [c.get("repeat_equal"), (j or {}).get("repeat_equal")]}
        if not j or "output" not in c or "output" not in j:
            row["reason"] = c.get("reason") or (j or {}).get("reason") or "no output written"
            report["failures"].append(f"{c['op']} tokens={c['tokens']}: not compared ({row['reason']})")
            report["cases"].append(row)
            continue
        if c.get("inputs") != j.get("inputs"):
            report["failures"].append(f"{c['op']} tokens={c['tokens']}: the inputs differ between the processes")
        row.update(compare_outputs(load(c["output"]), load(j["output"])))
        row["cubin_identical"] = c.get("cubin_sha256") == j.get("cubin_sha256")
        row["same_key"] = os.path.basename(os.path.dirname(c.get("kernel_file") or "a/")) == \
            os.path.basename(os.path.dirname(j.get("kernel_file") or "b/"))
        if not row["bitwise_equal"] and row["repeat_equal"] == [True, True]:
            report["failures"].append(f"{c['op']} tokens={c['tokens']}: bundle and JIT outputs differ in "
                                      f"{row['differing']} elements (max {row['max_abs_diff']:.4g}) while each "
                                      f"reproduces itself bit for bit")
        report["cases"].append(row)
    if not report["cases"]:
        report["failures"].append("no case ran")
    # every kernel the JIT built against the bundle's blob of the same source
    seeded = {k["code_sha256"]: k for k in bundle.get("kernels", [])}
    kernels = report["kernels"]
    kernels.update(jit_built=len(jit.get("kernels", [])), identical=0, differing=[], not_in_bundle=[], same_key=0)
    for k in jit.get("kernels", []):
        blob = blobs.get(k["code_sha256"])
        if blob is None:
            kernels["not_in_bundle"].append(f"{k['class']} {k['code_sha256'][:12]}")
            continue
        kernels["same_key"] += k["key"] == seeded.get(k["code_sha256"], {}).get("key")
        if blob[0] == k["cubin_sha256"]:
            kernels["identical"] += 1
            continue
        try:
            with open(k["kernel_file"], "rb") as f:
                jit_cubin = f.read()
        except OSError as exc:
            kernels["differing"].append({"class": k["class"], "code": k["code_sha256"][:12], "error": str(exc)})
            continue
        d = cubin_difference(blob[1], jit_cubin)
        d.update({"class": k["class"], "code": k["code_sha256"][:12]})
        kernels["differing"].append(d)
        if copy_pair is not None and len(kernels["differing"]) <= MAX_CUBIN_PAIRS:
            copy_pair(f"{k['class']}-{k['code_sha256'][:12]}", blob[1], jit_cubin)
    if jit.get("kernels") is not None and not jit.get("kernels"):
        report["failures"].append("the JIT process reported no kernel objects")
    if build_toolchain is not None and jit.get("toolchain"):
        report["toolchain_differences"] = toolchain_differences(build_toolchain, jit["toolchain"])
    report["toolchain"] = {k: v for k, v in (jit.get("toolchain") or {}).items() if k != "headers"}
    report["headers_reached"] = len((jit.get("toolchain") or {}).get("headers") or {})
    for key in ("nvrtc_choice", "seconds", "seconds_with_compiles", "compiles", "compiler_messages", "key_parts",
                "toolchain_error"):
        report[f"jit_{key}"] = jit.get(key) if key != "compiles" else len(jit.get("compiles") or [])
    report["bundle_seeded"] = bundle.get("seeded_from_bundle")
    report["bundle_compiles"], report["bundle_processes"] = len(bundle.get("compiles") or []), bundle.get("processes")
    return report


def summary(report: dict) -> list[str]:
    rows = [r for r in report["cases"] if "bitwise_equal" in r]
    k = report.get("kernels") or {}
    lines = []
    for r in report["cases"]:
        lines.append(f"  {r['op']} tokens={r['tokens']} M={r.get('m')} interval={r.get('interval')} "
                     f"stream_k={r.get('stream_k')}: bitwise {'EQUAL' if r.get('bitwise_equal') else 'DIFFERENT'}"
                     f" ({r.get('differing')}/{r.get('numel')} differ, max {r.get('max_abs_diff')}), "
                     f"rule bundle={'ok' if r.get('bundle_rule') else 'FAIL'} jit={'ok' if r.get('jit_rule') else 'FAIL'}, "
                     f"cubin {'identical' if r.get('cubin_identical') else 'DIFFERENT'}, same key {r.get('same_key')}, "
                     f"repeatable {r.get('repeat_equal')}")
    for d in (k.get("differing") or [])[:8]:
        lines.append(f"  cubin differs: {d.get('class')} {d.get('code')}: sections {d.get('sections_differing')}, "
                     f".text identical {d.get('text_identical')}, tool {d.get('tool')}, paths {d.get('paths')}"
                     f"{' -> ' + d['explained'] if d.get('explained') else ''}")
    if report.get("jit_key_parts"):
        kp = report["jit_key_parts"]
        lines.append(f"  Humming's key here: {kp.get('compiler')} {kp.get('nvrtc')}, {kp.get('header_mtimes')} header "
                     f"mtimes, flags {kp.get('flags', '')[:400]}")
    if report.get("toolchain"):
        t = report["toolchain"]
        lines.append(f"  JIT toolchain: NVRTC {t.get('nvrtc_version')} {t.get('nvrtc_realpath')} (pip nvidia-cuda-nvrtc "
                     f"{t.get('pip_nvidia_cuda_nvrtc')}), include folders {t.get('include_dirs')}")
    for extra in ("jit_toolchain_error", "jit_compiler_messages"):
        if report.get(extra):
            lines.append(f"  {extra}: {str(report[extra])[:1500]}")
    for line in report.get("toolchain_differences") or []:
        lines.append(f"  toolchain differs from the build box: {line}")
    if report.get("toolchain_differences") == []:
        lines.append(f"  toolchain: same as the build box (NVRTC library and builtins, options, "
                     f"{report.get('headers_reached')} headers)")
    lines.append(f"RESULT humming-jit: {sum(bool(r['bitwise_equal']) for r in rows)}/{len(rows)} cases bitwise equal "
                 f"(bundle vs Humming's JIT on this GPU); Humming's rule: bundle "
                 f"{sum(bool(r.get('bundle_rule')) for r in rows)}/{len(rows)}, JIT {sum(bool(r.get('jit_rule')) for r in rows)}"
                 f"/{len(rows)}; case cubins identical {sum(bool(r.get('cubin_identical')) for r in rows)}/{len(rows)}; "
                 f"JIT-built kernels identical to the bundle's blob {k.get('identical')}/{k.get('jit_built')} "
                 f"(same cache key {k.get('same_key')}, not in bundle {len(k.get('not_in_bundle') or [])}); "
                 f"JIT: {report.get('jit_compiles')} compiles in {report.get('jit_seconds_with_compiles')} s, "
                 f"{report.get('jit_nvrtc_choice')}; bundle: {report.get('bundle_compiles')} compiles, "
                 f"{report.get('bundle_processes')} processes; {len(report['failures'])} failures")
    lines += [f"  FAIL {f}" for f in report["failures"][:20]]
    return lines


def run_child(opts, role: str, env: dict) -> int:
    cmd = [sys.executable, os.path.abspath(__file__), "--role", role, "--dir", opts.dir, "--work", opts.work,
           "--tokens", opts.tokens] + (["--nvrtc-dir", opts.nvrtc_dir] if opts.nvrtc_dir else [])
    try:
        return subprocess.run(cmd, env=env, timeout=opts.timeout).returncode
    except subprocess.TimeoutExpired:
        print(f"  the {role} process ran past {opts.timeout} s", flush=True)
        return 124


def parent_main(opts) -> int:
    import torch

    shutil.rmtree(opts.work, ignore_errors=True)
    for sub in ROLES + ("jit-cache", "jit-tmp"):
        os.makedirs(os.path.join(opts.work, sub))
    base = {**os.environ, "HUMMING_DISABLE_PARALLEL_BUILD": "1"}  # no background helper build at import
    t0 = time.perf_counter()
    run_child(opts, "bundle", base)
    jit_env = {k: v for k, v in base.items() if not k.startswith(("NOJIT_", "HUMMING_CACHE_DIR", "HUMMING_TMP_DIR",
                                                                  "HUMMING_COMPILER"))}
    jit_env.update(HUMMING_CACHE_DIR=os.path.join(opts.work, "jit-cache"),
                   HUMMING_TMP_DIR=os.path.join(opts.work, "jit-tmp"))
    run_child(opts, "jit", jit_env)
    children = {}
    for role in ROLES:
        path = os.path.join(opts.work, f"{role}.json")
        children[role] = json.load(open(path)) if os.path.exists(path) else None
    toolchain_path = os.path.join(opts.dir, "build_toolchain.json")
    build_toolchain = json.load(open(toolchain_path)) if os.path.exists(toolchain_path) else None

    def copy_pair(name: str, bundled: bytes, jit: bytes) -> None:
        if opts.out:
            folder = os.path.join(opts.out, "humming_jit_cubins")
            os.makedirs(folder, exist_ok=True)
            for tag, data in (("bundle", bundled), ("jit", jit)):
                with open(os.path.join(folder, f"{name}.{tag}.cubin"), "wb") as f:
                    f.write(data)

    try:
        blobs = bundle_blobs(os.path.join(opts.dir, "humming.nojit"))
    except Exception as exc:
        blobs = {}
        print(f"  bundle unreadable: {exc}")
    report = compare(children["bundle"], children["jit"], blobs, build_toolchain,
                     lambda p: torch.load(p, map_location="cpu"), copy_pair)
    if build_toolchain is None:
        report["failures"].append(f"{toolchain_path} is missing: rerun tools/prepare_humming_device.py")
    report["seconds"] = round(time.perf_counter() - t0, 1)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"report": report, "children": children}, f, indent=1, default=str)
    for line in summary(report):
        print(line, flush=True)
    return 1 if report["failures"] else 0


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    opts.work = os.path.abspath(opts.work)
    return child_main(opts) if opts.role else parent_main(opts)


if __name__ == "__main__":
    sys.exit(main())
