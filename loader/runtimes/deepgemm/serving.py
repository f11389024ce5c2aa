"""Serve DeepGEMM from the bundle through DeepGEMM's own cache lookup, with no compiler and no process.

install_deepgemm() seeds the cache (deepgemm_cache), points DeepGEMM at it (DG_JIT_CACHE_DIR, and
DG_JIT_NVCC_COMPILER at a stub that is never run), and answers DeepGEMM's `nvcc --version` probe in
process (deepgemm_popen) with the text the bundle was built under, so DeepGEMM computes the same
keys. A key the bundle lacks reaches DeepGEMM's compile command, which the firewall refuses in
strict mode (no process starts); vLLM's DeepGEMM wrappers then raise KernelNotInBundleError naming
the kernel DeepGEMM generated, the shape and M, and how to add it. Permissive and record modes let
the command run (DeepGEMM compiles as usual) and record mode writes the key for `--add-keys`.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from nojit.loader.runtimes.deepgemm.cache import check_headers, find_key, headers_digest, section_of, seed
from nojit.loader.runtimes.deepgemm.popen import PopenFirewall
from nojit.loader.errors import BundleMismatchError, KernelNotInBundleError
from nojit.loader.policy import KeyRecorder
from nojit.loader.settings import Mode

# vLLM's DeepGEMM entry points (vllm/utils/deep_gemm.py) that reach DeepGEMM's JIT for DeepSeek-V4 on sm_90
WRAPPED = ("fp8_gemm_nt", "fp8_einsum", "fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits",
           "get_paged_mqa_logits_metadata", "tf32_hc_prenorm_gemm")
_STAGED_SOURCE = re.compile(r"cd (\S+) && ")


@dataclass
class DeepGemmServing:
    cache_dir: str
    firewall: PopenFirewall
    section: dict[str, Any]
    bundle_path: str
    originals: dict[str, Callable[..., Any]]


def extension_path(dg: Any) -> str:
    pkg = os.path.dirname(dg.__file__)
    names = [n for n in os.listdir(pkg) if n.startswith("_C_extension") and n.endswith(".so")]
    if len(names) != 1:
        raise BundleMismatchError(f"DeepGEMM at {pkg} has {len(names)} _C_extension libraries",
                                  fix="install vLLM 0.33.0's vendored DeepGEMM unchanged")
    return os.path.join(pkg, names[0])


def call_key(op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
    """{"op", "n", "k", "m"} (+ "groups" / "splits" / the indexer's fields) of a call of vLLM's DeepGEMM entry
    point, as `nojit build --add-keys` resolves it (aot/runtimes/deepgemm/enumerate.py recorded_op); None for
    ops not decoded. The indexer's ops: N = heads and K = head dim (the schedule metadata: N = next_n, K =
    block size in states), M = Q rows (prefill) or the decode batch."""
    kwargs = kwargs or {}
    try:
        if op == "fp8_gemm_nt":  # ((a, sfa), (b, sfb), d, ...)
            a, b = args[0][0], args[1][0]
            return {"op": op, "n": int(b.shape[0]), "k": int(b.shape[1]), "m": int(a.shape[0])}
        if op == "fp8_einsum":  # (expr, (a [b, h, r], sfa), (b [h, d, r], sfb), d, ...)
            a, b = args[1][0], args[2][0]
            return {"op": op, "n": int(b.shape[1]), "k": int(b.shape[2]), "m": int(a.shape[0]),
                    "groups": int(b.shape[0])}
        if op == "tf32_hc_prenorm_gemm":  # (x [M, K], fn [N, K], out, sqrsum, num_splits)
            x, fn = args[0], args[1]
            return {"op": op, "n": int(fn.shape[0]), "k": int(fn.shape[1]), "m": int(x.shape[0]),
                    "splits": int(args[4])}
        if op == "fp8_fp4_mqa_logits":  # ((q [M, H, D], q_sf), (k, k_sf), weights, ks, ke, max_seqlen_k)
            q = args[0][0]
            return {"op": op, "n": int(q.shape[1]), "k": int(q.shape[2]), "m": int(q.shape[0])}
        if op == "fp8_fp4_paged_mqa_logits":  # ((q [B, next_n, H, D], sf), kv_cache, w, lens, table, schedule, max_len)
            q, kv_cache, schedule = args[0][0], args[1], args[5]
            max_context = kwargs["max_model_len"] if "max_model_len" in kwargs else args[6]
            return {"op": op, "n": int(q.shape[2]), "k": int(q.shape[3]), "m": int(q.shape[0]),
                    "next_n": int(q.shape[1]), "block_kv": int(kv_cache.shape[1]), "max_context_len": int(max_context),
                    "num_slots": int(schedule.shape[0]) - 1}
        if op == "get_paged_mqa_logits_metadata":  # (context_lens [B, next_n], block_size, num_sms, indices=)
            from vllm.utils.deep_gemm import _paged_mqa_logits_schedule_slots

            lens, block_kv, num_sms = args[0], int(args[1]), int(args[2])
            next_n = int(lens.shape[1]) if len(lens.shape) == 2 else 1
            return {"op": op, "n": next_n, "k": block_kv, "m": int(lens.shape[0]), "next_n": next_n,
                    "block_kv": block_kv, "num_slots": _paged_mqa_logits_schedule_slots(num_sms, next_n)}
    except (IndexError, KeyError, TypeError, AttributeError, ValueError, ImportError):
        pass
    return None


def _shape_of(op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(n, k, m) of a call, for the message."""
    key = call_key(op, args, kwargs)
    return (key["n"], key["k"], key["m"]) if key else None


def _refusal(serving: DeepGemmServing, op: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
             before: int) -> KernelNotInBundleError:
    command = serving.firewall.refused[before] if len(serving.firewall.refused) > before else ""
    staged = _STAGED_SOURCE.match(command)
    source = ""
    if staged:
        try:
            with open(os.path.join(staged.group(1), "kernel.cu")) as f:
                source = " ".join(line.strip() for line in f if line.strip() and not line.startswith("#"))
        except OSError:
            pass
    shape = _shape_of(op, args, kwargs)
    where = f"N={shape[0]} K={shape[1]} M={shape[2]}" if shape else "shape not decoded"
    nearest = find_key(serving.section, op, *shape) if shape else None
    key = f"DeepGEMM {op} {where}: generated kernel [{source[:400]}]"
    if nearest:
        key += f" (the build mapped this shape and M to {nearest}: DeepGEMM's key differs, check nvcc/DeepGEMM versions)"
    return KernelNotInBundleError(
        kernel_id(op), key, serving.bundle_path,
        fix=f"add M={shape[2] if shape else '?'} for this shape to the deployment (max_num_batched_tokens; the "
        "indexer's decode batch: max_num_seqs) or record it "
        "with NOJIT_MODE=record, then `nojit build --add-keys keys.jsonl`; NOJIT_MODE=permissive lets DeepGEMM compile")


def _wrap(serving: DeepGemmServing, module: Any, op: str, mode: Mode, recorder: KeyRecorder | None,
          source_hash: str = "") -> None:
    original = getattr(module, op)

    def record(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
        key = call_key(op, args, kwargs)
        if recorder is not None and key:  # the form `nojit build --add-keys` resolves to DeepGEMM's entry
            recorder.record(kernel_id(op), "deepgemm", key, "miss", source_hash)

    @functools.wraps(original)
    def served(*args: Any, **kwargs: Any) -> Any:
        before = len(serving.firewall.refused)
        try:
            out = original(*args, **kwargs)
        except RuntimeError as exc:
            if mode is Mode.STRICT and len(serving.firewall.refused) > before:
                raise _refusal(serving, op, args, kwargs, before) from exc
            raise
        if len(serving.firewall.refused) > before:  # permissive/record: DeepGEMM compiled it
            record(args, kwargs)
        return out

    serving.originals[op] = original
    setattr(module, op, served)


def kernel_id(op: str) -> str:
    """The bundle's kernel id of a vLLM DeepGEMM entry point (aot/runtimes/deepgemm/planner.py)."""
    return f"vllm.utils.deep_gemm:{op}"


def install_deepgemm(section: dict[str, Any], read_blob: Callable[[str], bytes], bundle_path: str,
                     mode: Mode, recorder: KeyRecorder | None = None, source_hash: str = "",
                     allow: frozenset[str] = frozenset()) -> DeepGemmServing:
    """Seed, point, firewall, wrap. Call before vLLM's first DeepGEMM call (the plugin runs first).

    The compiler DeepGEMM is pointed at (DG_JIT_NVCC_COMPILER): in strict mode the firewall's nvcc
    stand-in (firewall.activate ran first and set it; a process that escaped the in-process answer
    would be refused there too), otherwise the seeded stub. Either way its `--version` probe is
    answered in process and no process starts for a key the bundle holds."""
    from nojit.loader.strict import firewall as compiler_firewall

    root = seed(section, read_blob, bundle_path)
    report = compiler_firewall.active()
    stub = os.path.join(report.bin_dir, "nvcc") if report is not None else os.path.join(root, "bin", "nvcc")
    os.environ["DG_JIT_CACHE_DIR"] = root
    os.environ["DG_JIT_NVCC_COMPILER"] = stub
    home = os.environ.get("CUDA_HOME", "")
    real_nvcc = os.path.join(home, "bin", "nvcc") if home and os.access(os.path.join(home, "bin", "nvcc"), os.X_OK) else None
    if not os.path.isdir(home):
        os.environ["CUDA_HOME"] = root  # DeepGEMM requires an existing CUDA_HOME; nothing is read from it
    try:
        import vllm.third_party.deep_gemm as dg
        import vllm.utils.deep_gemm as vllm_dg
    except ImportError as exc:
        raise BundleMismatchError(f"bundle {bundle_path} holds DeepGEMM entries, but vLLM's DeepGEMM does not import "
                                  f"here ({exc})", fix="install the vLLM the bundle was built with (its "
                                  "vllm/third_party/deep_gemm), or rebuild the bundle with --runtime triton,tilelang") from None
    if dg.__version__ != section["deep_gemm_version"]:
        raise BundleMismatchError(
            f"bundle {bundle_path} holds DeepGEMM {section['deep_gemm_version']} entries, installed is {dg.__version__}",
            fix="rebuild the bundle with this vLLM's DeepGEMM")
    package = os.path.dirname(dg.__file__)
    check_headers(package, bundle_path)
    if source_hash and headers_digest(package) != source_hash and "source" not in allow:
        raise BundleMismatchError(
            f"bundle {bundle_path}: DeepGEMM's headers at {package} differ from the ones its entries were built "
            "with (DeepGEMM hashes them into every cache key, so no entry would be found)",
            fix="rebuild the bundle against this vLLM's DeepGEMM with `nojit build`")
    firewall = PopenFirewall(nvcc=stub, version_text=section["nvcc_version"], allow_others=mode is not Mode.STRICT,
                             real_nvcc=real_nvcc)
    firewall.install(extension_path(dg))
    serving = DeepGemmServing(root, firewall, section, bundle_path, {})
    for op in WRAPPED:
        if hasattr(vllm_dg, op):
            _wrap(serving, vllm_dg, op, mode, recorder, source_hash)
    return serving


def install_from_bundle(bundle: Any, records: Mapping[str, Any], kernel_ids: list[str], mode: Mode,
                        recorder: KeyRecorder | None, allow: frozenset[str]) -> DeepGemmServing:
    """install_deepgemm for the DeepGEMM kernels of an opened bundle (loader/install.py; records: its kernel records)."""
    section = section_of(records, bundle.entries, kernel_ids)
    hashes = {records[k].source_hash for k in kernel_ids}
    return install_deepgemm(section, bundle.read_blob, bundle.path, mode, recorder,
                            source_hash=hashes.pop() if len(hashes) == 1 else "", allow=allow)
