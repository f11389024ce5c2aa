"""GPU check: every bundled TileLang (mHC) variant against float64 references, served with no TileLang, no compiles.

Run on an sm_90 machine with no vLLM and no TileLang (the H200 through the device tool), with .device
prepared by tools/prepare_device.py (--tilelang-bundle) and the nojit wheel installed:

    python tests/gpu/checks/check_tilelang.py --bundle .device/tilelang.nojit [--vllm-src .device/vllm_src]
        [--sizes 1,7,64,513,8192] [--kernels SUBSTR] [--seed N] [--json OUT]
    python tests/gpu/checks/check_tilelang.py --bundle B.nojit --dry-run   # no GPU: launches captured, checked vs the plan

One process does it all, in this order:
  * an audit hook records every process started, and a meta-path finder refuses `import tilelang`;
  * nojit is installed in strict mode (vLLM may be missing: allow_mismatch {"vllm"});
  * vLLM's mHC kernel module is imported from the carried, verbatim copy (mount_vllm), so its
    `@tilelang_jit` kernels become nojit servers (their source digest is checked against the bundle);
  * per bundle entry and num_tokens: fresh random inputs built the way vLLM's ops build them, outputs
    poisoned (0xFF bytes: NaN in fp32 and bf16) inside guard bands, one launch through the server with
    the positional arguments and aliasing of vLLM's owner, then: the call resolved this entry's key,
    tensor shapes match the entry's launch plan, every output element written, guard bands and inputs
    untouched, and each output within its tolerance of a float64 reference on the GPU;
  * once per entry the same inputs go through vLLM's own owner object (`_MHC_..._KERNEL(...)`), which
    must reach the same cubin and give bit-identical outputs;
  * finally: no process started, no compile attempt in nojit's guards, tilelang never imported.

The references are vLLM's kernels/mhc/torch.py evaluated in float64 (Float64Reference) plus the steps a
kernel body adds that torch.py lacks (fused RMSNorm with its bf16 rounding point, broadcast residual,
split-K partial sums). Prints one row per entry, then `RESULT: PASS` or `RESULT: FAIL` (exit 0/1).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.abc
import importlib.machinery
import json
import math
import os
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MHC = "vllm.model_executor.kernels.mhc.tilelang_kernels"
TORCH_REF = "vllm.model_executor.kernels.mhc.torch"
SIZES = (1, 7, 64, 513, 8192)
# mhc_fused reads split_k from yp_out's shape: vLLM's value (8) at every size, plus these (T, split_k).
EXTRA_SPLITS = ((7, 1), (64, 2), (513, 4))
GUARD = 256  # poisoned elements on each side of every output


# --------------------------------------------------------------------------------------------------
# Process guards: nothing may start a process, and TileLang must stay out of the process.

class ProcessAudit:
    """Audit hook recording every process start; `phase` tells startup (before nojit) from serving."""

    EVENTS = frozenset({"subprocess.Popen", "os.system", "os.posix_spawn", "os.exec", "os.spawn", "os.fork",
                        "os.forkpty", "pty.spawn"})

    def __init__(self) -> None:
        self.phase = "startup"
        self.events: list[tuple[str, str]] = []

    def __call__(self, event: str, args: tuple) -> None:
        if event in self.EVENTS:
            self.events.append((self.phase, f"{event} {str(args[0] if args else '')[:100]}"))


class TileLangBlocker(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`import tilelang` raises ImportError; find_spec still answers (a spec), so probes never crash."""

    def __init__(self) -> None:
        self.refused: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name == "tilelang" or name.startswith("tilelang."):
            return importlib.machinery.ModuleSpec(name, self)
        return None

    def create_module(self, spec: Any) -> None:
        return None

    def exec_module(self, module: Any) -> None:
        self.refused.append(module.__name__)
        raise ImportError(f"{module.__name__} is blocked: this check serves vLLM's TileLang kernels without TileLang")


# --------------------------------------------------------------------------------------------------
# The carried vLLM copy.

class CudaLikePlatform:
    """What tilelang_kernels.py asks `current_platform` on an H200: CUDA with PDL, not ROCm, not SM100.

    ENABLE_PDL (module global, part of nojit's source digest) must come out True as on a real H200.
    """

    capability = 90

    def is_cuda(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_arch_support_pdl(self) -> bool:
        return True

    def has_device_capability(self, capability: int | tuple[int, int], device_id: int = 0) -> bool:
        if isinstance(capability, tuple):
            capability = capability[0] * 10 + capability[1]
        return self.capability >= capability

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(f"the check's stub vllm.platforms has no {name!r}: the carried vLLM code needs more "
                             "than check_tilelang.CudaLikePlatform provides")


def mount_vllm(src: str) -> None:
    """Make `vllm.*` resolve to the copy under src/vllm and nowhere else, plus a stub vllm.platforms.

    Every directory becomes a package module whose __path__ is that directory, so the copied files
    import under their real names (nojit identifies kernels by module:qualname) while no package
    __init__ runs; a vLLM installed elsewhere is never consulted.
    """
    if any(m == "vllm" or m.startswith("vllm.") for m in sys.modules if m != "vllm.tilelang_utils"):
        raise RuntimeError("vllm is already imported in this process; mount_vllm needs a fresh process")
    base = os.path.join(os.path.abspath(src), "vllm")
    if not os.path.isfile(os.path.join(base, *MHC.split(".")[1:]) + ".py"):
        raise FileNotFoundError(f"{base}: no carried copy of {MHC} (run tools/prepare_device.py)")
    for dirpath, dirnames, _files in os.walk(base):  # top-down: parents first
        dirnames[:] = [d for d in dirnames if d != "__pycache__"]
        rel = os.path.relpath(dirpath, base)
        name = "vllm" if rel == "." else "vllm." + rel.replace(os.sep, ".")
        _set_module(name, _package(name, dirpath))
    platforms = types.ModuleType("vllm.platforms", "check_tilelang stub: only what tilelang_kernels.py reads")
    platforms.current_platform = CudaLikePlatform()  # type: ignore[attr-defined]
    _set_module("vllm.platforms", platforms)
    utils = sys.modules.get("vllm.tilelang_utils")  # nojit's stub, if nojit was installed first
    if utils is not None:
        setattr(sys.modules["vllm"], "tilelang_utils", utils)


def _package(name: str, path: str) -> types.ModuleType:
    pkg = types.ModuleType(name)
    pkg.__path__ = [path]
    pkg.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    pkg.__spec__.submodule_search_locations = [path]
    return pkg


def _set_module(name: str, module: types.ModuleType) -> None:
    sys.modules[name] = module
    parent, _, leaf = name.rpartition(".")
    if parent in sys.modules:
        setattr(sys.modules[parent], leaf, module)


# --------------------------------------------------------------------------------------------------
# References.

class _Float64Names(types.ModuleType):
    """`torch` as torch.py sees it in the reference: float32 and bfloat16 both name float64."""

    float32 = torch.float64
    bfloat16 = torch.float64

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


class Float64Reference:
    """vLLM's kernels/mhc/torch.py, run in float64.

    Its functions compute in torch.float32 and round results to torch.bfloat16, by name. The same
    code objects, bound to globals where `torch` names float64 for both, run vLLM's own formulas in
    float64 and return unrounded results (given float64 copies of the inputs' exact values).
    """

    def __init__(self, module: types.ModuleType) -> None:
        namespace = dict(vars(module))
        namespace["torch"] = _Float64Names("torch")
        self.mhc_pre = _rebind(module.mhc_pre_torch, namespace)
        self.mhc_post = _rebind(module.mhc_post_torch, namespace)


def _rebind(fn: Any, namespace: dict[str, Any]) -> Any:
    new = types.FunctionType(fn.__code__, namespace, fn.__name__, fn.__defaults__, fn.__closure__)
    new.__kwdefaults__ = fn.__kwdefaults__
    return new


def deepgemm_k_ranges(k: int, n_splits: int, block_k: int = 64) -> list[tuple[int, int]]:
    """K range of each split in DeepGEMM's tf32_hc_prenorm_gemm (sm90): whole 64-wide blocks, the first
    (blocks % n_splits) splits one block longer (k_offset = (s*per + min(s, rem)) * BLOCK_K)."""
    blocks = -(-k // block_k)
    per, rem = divmod(blocks, n_splits)
    out = []
    for s in range(n_splits):
        start = (s * per + min(s, rem)) * block_k
        out.append((min(start, k), min(start + (per + (s < rem)) * block_k, k)))
    return out


def prenorm_gemm_partials(x: torch.Tensor, fn: torch.Tensor, n_splits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """What vLLM feeds the pre kernels: DeepGEMM's split-K partial x@fn^T [n_splits,T,N] and sum(x^2) [n_splits,T].

    Computed in float64 from the exact inputs and rounded once to fp32 (the kernel sums the splits).
    """
    x64, fn64 = x.double(), fn.double()
    ranges = deepgemm_k_ranges(x.shape[1], n_splits)
    mul = torch.stack([x64[:, a:b] @ fn64[:, a:b].T for a, b in ranges]).float()
    sqr = torch.stack([x64[:, a:b].square().sum(-1) for a, b in ranges]).float()
    return mul.contiguous(), sqr.contiguous()


def rmsnorm_as_kernel(y: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The with_norm kernels' RMSNorm of the collapsed input y (float64, unrounded): the sum of squares is
    taken from the unrounded fp32 sum, the values are stored as bf16 before scaling (output_shared)."""
    rs = torch.rsqrt(y.square().mean(-1, keepdim=True) + eps)
    return y.to(torch.bfloat16).double() * rs * weight.double()


def fused_partials(new_r: torch.Tensor, weight_t: torch.Tensor, split_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """mhc_fused's split-K outputs: split s covers hidden [s*H/split_k, (s+1)*H/split_k) of every stream;
    yp_out[s] = sum over that slice of new_r . weight_t, rp_out[s] = sum of new_r^2 (new_r unrounded)."""
    t, hc, h = new_r.shape
    r = new_r.reshape(t, hc, split_k, h // split_k)
    w = weight_t.double().reshape(weight_t.shape[0], hc, split_k, h // split_k)
    return torch.einsum("tjsh,njsh->stn", r, w), r.square().sum(dim=(1, 3)).T


# --------------------------------------------------------------------------------------------------
# Tolerances. |out - ref| <= atol_frac * max|ref| + rtol * |ref| elementwise, as in the H200 validation.

@dataclass(frozen=True)
class Tolerance:
    rtol: float
    atol_frac: float


# bf16 keeps 8 significant bits (a rounding step of 2^-8 = 0.39% of the value's binade). A kernel rounds
# fp32 results to bf16 once (post, fused residual, hc_head) or twice (with_norm: the collapsed input in
# shared memory, then the normalized output), and its fp32 sum may round the other way than the float64
# reference: up to ~2 steps, under 1e-2. atol covers values near zero that come out of cancelling sums,
# whose rounding error scales with the summands (about max|ref|), not with the small result.
BF16 = Tolerance(rtol=1e-2, atol_frac=1e-2)
# fp32 sums over K = 4096..16384 products in another order than float64: ~sqrt(K) * 6e-8 relative to the
# summands' scale (measured on the H200: 1.3e-6 abs at values ~1, 3.5e-3 at values ~1e4).
F32_SUM = Tolerance(rtol=1e-4, atol_frac=1e-5)
# post/comb mixes: sigmoid/softmax and 20 Sinkhorn normalizations in fp32 with fast-math exp/rsqrt;
# measured errors ~3e-7 abs on values in [0, 2]. rtol 1e-4 leaves two orders of magnitude.
F32_MIX = Tolerance(rtol=1e-4, atol_frac=1e-6)
# A pure copy (broadcast residual_out) must be bit-exact.
EXACT = Tolerance(rtol=0.0, atol_frac=0.0)


def compare(out: torch.Tensor, ref: torch.Tensor, tol: Tolerance) -> dict[str, Any]:
    """max abs error, max relative error over |ref| >= 1e-3 max|ref|, and pass/fail (NaN fails)."""
    o, r = out.double(), ref.double()
    err = (o - r).abs()
    scale = float(r.abs().max()) if r.numel() else 0.0
    bound = tol.atol_frac * scale + tol.rtol * r.abs()
    ok = bool((err <= bound).all()) and bool(torch.isfinite(r).all())
    big = r.abs() >= 1e-3 * scale
    rel = float((err[big] / r.abs()[big]).max()) if bool(big.any()) else 0.0
    return {"max_abs": float(err.max()) if err.numel() else 0.0, "max_rel": rel, "max_ref": scale, "ok": ok,
            "bad": int((~(err <= bound)).sum())}


# --------------------------------------------------------------------------------------------------
# Cases: inputs as vLLM's ops build them, the call as vLLM's owner makes it, and the reference.

class Guarded:
    """An output buffer poisoned with 0xFF bytes (NaN in fp32 and bf16), inside poisoned guard bands."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: str) -> None:
        n = math.prod(shape)
        self.flat = torch.empty(n + 2 * GUARD, dtype=dtype, device=device)
        self.t = self.flat[GUARD:GUARD + n].view(shape)
        self.poison()

    def poison(self) -> None:
        self.flat.view(torch.uint8).fill_(0xFF)

    def unwritten(self) -> int:
        return int(torch.isnan(self.t).sum())

    def guards_intact(self) -> bool:
        bands = torch.cat([self.flat[:GUARD], self.flat[-GUARD:]]).view(torch.uint8)
        return bool((bands == 0xFF).all())


class Rand:
    """Seeded inputs on one device."""

    def __init__(self, seed: int, device: str) -> None:
        self.device = device
        self.g = torch.Generator(device=device).manual_seed(seed)

    def normal(self, *shape: int, std: float = 1.0, mean: float = 0.0,
               dtype: torch.dtype | None = None) -> torch.Tensor:
        t = torch.randn(shape, generator=self.g, device=self.device) * std + mean
        return t.to(dtype or torch.float32)

    def uniform(self, *shape: int, lo: float = 0.0, hi: float = 1.0) -> torch.Tensor:
        return torch.rand(shape, generator=self.g, device=self.device) * (hi - lo) + lo


@dataclass
class Case:
    num_tokens: int
    split_k: int | None
    args: tuple[Any, ...]  # positional, as vLLM's owner passes them to the kernel
    kwargs: dict[str, Any]
    named: dict[str, Any]  # kernel parameter name -> the tensor vLLM passes there (aliases share one)
    outputs: dict[str, Guarded]
    tolerances: dict[str, Tolerance]
    reference: Callable[[], dict[str, Any]]
    # The same inputs through vLLM's owner object; returns its outputs (default: the guarded ones, in place).
    owner: Callable[[Any], dict[str, Any] | None] | None = None
    values: dict[str, int] = field(default_factory=dict)  # dynamic vars: num_tokens, split_k
    sources: dict[str, Any] = field(default_factory=dict)  # what the kernel's inputs were made from (fn)


def _outputs(device: Any, **specs: tuple[tuple[int, ...], Any]) -> dict[str, Guarded]:
    return {name: Guarded(shape, dtype, device) for name, (shape, dtype) in specs.items()}


def _mix_params(r: Rand, n: int, k: int, n_scale: int) -> tuple[Any, Any, Any]:
    """fn [n, k] (mixes of order 1 after the RMS scaling), hc_scale [n_scale], hc_base [n]."""
    return r.normal(n, k, std=k ** -0.5), r.uniform(n_scale, lo=0.5, hi=1.5), r.normal(n, std=0.5)


_PRE_DEFAULTS = {"use_pre_mix_in": False, "save_pre_mix": False, "rms_numel": 0, "split_mode": "fused",
                 "write_aux": False, "gemm_last_dim": -1}


def _require(key: dict[str, Any], defaults: dict[str, Any]) -> None:
    odd = {k: key[k] for k, v in defaults.items() if k in key and key[k] != v}
    if odd:
        raise NotImplementedError(f"no reference for {odd} (vLLM's DeepSeek-V4 owners never pass these)")


def _eps(key: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(key[n] for n in ("rms_eps", "hc_pre_eps", "hc_sinkhorn_eps", "hc_post_mult_value", "sinkhorn_repeat"))


def build_pre_norm(key: dict[str, Any], t: int, split_k: int | None, r: Rand, ref: Float64Reference) -> Case:
    """mhc_pre_big_fuse_with_norm_tilelang as mhc_pre_tilelang / mhc_fused_post_pre_tilelang reach it."""
    _require(key, _PRE_DEFAULTS)
    h, hc, ns = key["hidden_size"], key["hc_mult"], key["n_splits"]
    n3 = hc * (2 + hc)
    residual = r.normal(t, hc, h, dtype=torch.bfloat16)
    fn, scale, base = _mix_params(r, n3, hc * h, 3)
    weight = r.normal(h, std=0.2, mean=1.0, dtype=torch.bfloat16)
    mul, sqr = prenorm_gemm_partials(residual.view(t, hc * h), fn, ns)
    out = _outputs(r.device, post_mix=((t, hc), torch.float32), comb_mix=((t, hc * hc), torch.float32),
                   layer_input=((t, h), torch.bfloat16))
    post, comb, li = out["post_mix"].t, out["comb_mix"].t, out["layer_input"].t
    eps, norm_eps = _eps(key), key["norm_eps"]
    # MhcPreBigFuseTileLangKernel._kernel_args: pre_mix_in = pre_mix_out = post_mix, aux_out = layer_input.
    args = (mul, sqr, scale, base, residual, post, comb, li, weight, post, post, li, h, *eps, norm_eps, ns, hc)
    named = dict(gemm_out_mul=mul, gemm_out_sqrsum=sqr, hc_scale=scale, hc_base=base, residual=residual,
                 post_mix=post, comb_mix=comb, layer_input=li, norm_weight=weight, pre_mix_in=post, pre_mix_out=post,
                 aux_out=li)

    def reference() -> dict[str, Any]:
        p, c, y = ref.mhc_pre(residual.double(), fn.double(), scale.double(), base.double(), *eps)
        return {"post_mix": p.reshape(t, hc), "comb_mix": c.reshape(t, hc * hc),
                "layer_input": rmsnorm_as_kernel(y, weight, norm_eps)}

    def owner(mhc: Any) -> None:
        mhc._MHC_PRE_BIG_FUSE_TILELANG_KERNEL(mul, sqr, scale, base, residual, post, comb, li, *eps,
                                              norm_weight=weight, norm_eps=norm_eps)

    tols = {"post_mix": F32_MIX, "comb_mix": F32_MIX, "layer_input": BF16}
    return Case(t, None, args, {}, named, out, tols, reference, owner, {"num_tokens": t}, {"fn": fn})


def build_pre_broadcast(key: dict[str, Any], t: int, split_k: int | None, r: Rand, ref: Float64Reference) -> Case:
    """mhc_pre_big_fuse_broadcast_with_norm_tilelang as mhc_pre_broadcast_tilelang (layer 0) reaches it."""
    _require(key, {"gemm_last_dim": -1})
    h, hc, ns = key["hidden_size"], key["hc_mult"], key["n_splits"]
    n3 = hc * (2 + hc)
    residual = r.normal(t, h, dtype=torch.bfloat16)
    fn_b, scale, base = _mix_params(r, n3, h, 3)  # fn_broadcast [n3, H]; DeepGEMM runs over K = H
    weight = r.normal(h, std=0.2, mean=1.0, dtype=torch.bfloat16)
    mul, sqr = prenorm_gemm_partials(residual, fn_b, ns)
    out = _outputs(r.device, residual_out=((t, hc, h), torch.bfloat16), post_mix=((t, hc), torch.float32),
                   comb_mix=((t, hc * hc), torch.float32), layer_input=((t, h), torch.bfloat16))
    ro, post, comb, li = (out[n].t for n in ("residual_out", "post_mix", "comb_mix", "layer_input"))
    eps, norm_eps = _eps(key), key["norm_eps"]
    args = (mul, sqr, scale, base, residual, ro, post, comb, li, weight, h, *eps, norm_eps, ns, hc)
    named = dict(gemm_out_mul=mul, gemm_out_sqrsum=sqr, hc_scale=scale, hc_base=base, residual=residual,
                 residual_out=ro, post_mix=post, comb_mix=comb, layer_input=li, norm_weight=weight)

    def reference() -> dict[str, Any]:
        # The broadcast residual is hc copies of x. torch.py's mhc_pre on those copies, with fn's first
        # block fn_broadcast and zeros after (x_full @ fn_full^T = x @ fn_b^T; mean of x_full^2 = mean of
        # x^2), gives the kernel's post/comb and its collapsed input sum_j pre_j * x.
        rb = residual.double().unsqueeze(1).expand(t, hc, h).contiguous()
        fn_full = torch.cat([fn_b.double(), fn_b.new_zeros(n3, (hc - 1) * h, dtype=torch.float64)], dim=1)
        p, c, y = ref.mhc_pre(rb, fn_full, scale.double(), base.double(), *eps)
        return {"residual_out": rb, "post_mix": p.reshape(t, hc), "comb_mix": c.reshape(t, hc * hc),
                "layer_input": rmsnorm_as_kernel(y, weight, norm_eps)}

    def owner(mhc: Any) -> None:
        mhc._MHC_PRE_BIG_FUSE_TILELANG_KERNEL(mul, sqr, scale, base, residual, post, comb, li, *eps, residual_out=ro,
                                              norm_weight=weight, norm_eps=norm_eps)

    tols = {"residual_out": EXACT, "post_mix": F32_MIX, "comb_mix": F32_MIX, "layer_input": BF16}
    return Case(t, None, args, {}, named, out, tols, reference, owner, {"num_tokens": t}, {"fn": fn_b})


def build_post(key: dict[str, Any], t: int, split_k: int | None, r: Rand, ref: Float64Reference) -> Case:
    """mhc_post_tilelang as the op mhc_post_tilelang calls it (comb [T,hc,hc], post squeezed to [T,hc])."""
    h, hc = key["hidden"], key["hc"]
    comb, residual = r.uniform(t, hc, hc), r.normal(t, hc, h, dtype=torch.bfloat16)
    post, x = r.uniform(t, hc, hi=2.0), r.normal(t, h, dtype=torch.bfloat16)
    out = _outputs(r.device, x=((t, hc, h), torch.bfloat16))
    args = (comb, residual, post, x, out["x"].t, hc, h)
    named = dict(a=comb, b=residual, c=post, d=x, x=out["x"].t)

    def reference() -> dict[str, Any]:
        return {"x": ref.mhc_post(x.double(), residual.double(), post.double().unsqueeze(-1), comb.double())}

    def owner(mhc: Any) -> None:
        mhc._MHC_POST_TILELANG_KERNEL(comb, residual, post, x, out["x"].t, hc, h)

    return Case(t, None, args, {}, named, out, {"x": BF16}, reference, owner, {"num_tokens": t})


def build_fused(key: dict[str, Any], t: int, split_k: int | None, r: Rand, ref: Float64Reference) -> Case:
    """mhc_fused_tilelang as MhcFusedTileLangKernel calls it (weight_t = fn.view(n_out, hc, H))."""
    h, hc, n_out, n_thr = key["hidden"], key["hc"], key["n_out"], key["n_thr"]
    assert split_k and h % (split_k * n_thr) == 0, f"split_k={split_k}: the kernel drops uneven hidden slices"
    comb, residual = r.uniform(t, hc, hc), r.normal(t, hc, h, dtype=torch.bfloat16)
    post, x = r.uniform(t, hc, hi=2.0), r.normal(t, h, dtype=torch.bfloat16)
    weight_t = r.normal(n_out, hc * h, std=(hc * h) ** -0.5).view(n_out, hc, h)
    out = _outputs(r.device, yp_out=((split_k, t, n_out), torch.float32), rp_out=((split_k, t), torch.float32),
                   residual_out=((t, hc, h), torch.bfloat16))
    yp, rp, ro = out["yp_out"].t, out["rp_out"].t, out["residual_out"].t
    args = (comb, residual, post, x, weight_t, yp, rp, ro, hc, h, n_out)
    kwargs = {"n_thr": n_thr, "tile_n": key["tile_n"]}
    named = dict(comb_mix=comb, residual_in=residual, post_mix=post, x_in=x, weight_t=weight_t, yp_out=yp,
                 rp_out=rp, residual_out=ro)

    def reference() -> dict[str, Any]:
        new_r = ref.mhc_post(x.double(), residual.double(), post.double().unsqueeze(-1), comb.double())
        yp_ref, rp_ref = fused_partials(new_r, weight_t, split_k)
        return {"yp_out": yp_ref, "rp_out": rp_ref, "residual_out": new_r}

    def owner(mhc: Any) -> dict[str, Any]:
        got = mhc._MHC_FUSED_TILELANG_KERNEL(comb, residual, post, x, weight_t, hc, h, n_out)
        return dict(zip(("yp_out", "rp_out", "residual_out"), got))

    tols = {"yp_out": F32_SUM, "rp_out": F32_SUM, "residual_out": BF16}
    return Case(t, split_k, args, kwargs, named, out, tols, reference, owner, {"num_tokens": t, "split_k": split_k})


def build_head(key: dict[str, Any], t: int, split_k: int | None, r: Rand, ref: Float64Reference) -> Case:
    """hc_head_fuse_tilelang as hc_head_fused_kernel_tilelang calls it."""
    h, hc = key["hidden_size"], key["hc_mult"]
    residual = r.normal(t, hc, h, dtype=torch.bfloat16)
    fn, scale, base = _mix_params(r, hc, hc * h, 1)
    out = _outputs(r.device, out=((t, h), torch.bfloat16))
    args = (residual, fn, scale, base, out["out"].t, h, key["rms_eps"], key["hc_eps"], hc)
    named = dict(residual=residual, fn=fn, hc_scale=scale, hc_base=base, out=out["out"].t)

    def reference() -> dict[str, Any]:
        # hc_head is mHC pre's collapse alone: pre = sigmoid(x@fn^T * rsqrt(mean x^2 + rms_eps) * scale + base)
        # + hc_eps, out = sum_j pre_j * residual_j. torch.py's mhc_pre gives exactly that layer_input when fn,
        # hc_scale and hc_base are extended by rows the collapse never reads (post and comb; zeros).
        n3 = hc * (2 + hc)
        fn24 = torch.cat([fn.double(), fn.new_zeros(n3 - hc, hc * h, dtype=torch.float64)])
        scale3 = torch.cat([scale.double(), scale.new_ones(2, dtype=torch.float64)])
        base24 = torch.cat([base.double(), base.new_zeros(n3 - hc, dtype=torch.float64)])
        _p, _c, y = ref.mhc_pre(residual.double(), fn24, scale3, base24, key["rms_eps"], key["hc_eps"], 1.0, 1.0, 1)
        return {"out": y}

    def owner(mhc: Any) -> None:
        mhc._HC_HEAD_FUSED_TILELANG_KERNEL(residual, fn, scale, base, out["out"].t, h, key["rms_eps"], key["hc_eps"],
                                           hc)

    return Case(t, None, args, {}, named, out, {"out": BF16}, reference, owner, {"num_tokens": t})


BUILDERS: dict[str, Callable[..., Case]] = {
    "mhc_pre_big_fuse_with_norm_tilelang": build_pre_norm,
    "mhc_pre_big_fuse_broadcast_with_norm_tilelang": build_pre_broadcast,
    "mhc_post_tilelang": build_post,
    "mhc_fused_tilelang": build_fused,
    "hc_head_fuse_tilelang": build_head,
}


def case_plan(kernel: str, key: dict[str, Any], sizes: tuple[int, ...], mhc: Any) -> list[tuple[int, int | None, bool]]:
    """(num_tokens, split_k, also via vLLM's owner) for one entry.

    mhc_fused: vLLM's split (mhc_fused_post_pre_split_config) at every size, plus the first size vLLM
    itself routes to this tile_n (where the owner check runs), plus EXTRA_SPLITS. Others: every size,
    owner check at the second.
    """
    if kernel != "mhc_fused_tilelang":
        at = sizes[min(1, len(sizes) - 1)]
        return [(t, None, t == at) for t in sizes]
    h, hc = key["hidden"], key["hc"]
    config = getattr(mhc, "mhc_fused_post_pre_split_config", lambda *a: None)
    owner_t = next((t for t in range(1, 33) if (c := config(t, h, hc)) and (c[0], c[2]) == (key["tile_n"],
                                                                                            key["n_thr"])), None)
    split = config(owner_t, h, hc)[1] if owner_t else 8
    plan = [(t, split, t == owner_t) for t in sorted({*sizes, *([owner_t] if owner_t else [])})]
    return plan + [(t, s, False) for t, s in EXTRA_SPLITS if t in sizes and s != split]


# --------------------------------------------------------------------------------------------------
# Running one case.

def plan_mismatches(launch: Any, case: Case) -> list[str]:
    """Tensor dtypes/shapes the entry's launch plan expects vs what the case passes."""
    from nojit.loader.bundle.launch_expr import evaluate

    errors = []
    for tp in launch.tensor_params:
        t = case.named.get(tp["name"])
        if t is None:
            errors.append(f"{tp['name']}: not passed")
            continue
        want = tuple(d if isinstance(d, int) else evaluate(d, case.values) for d in tp["shape"])
        if tuple(t.shape) != want or str(t.dtype).removeprefix("torch.") != tp["dtype"]:
            errors.append(f"{tp['name']}: {t.dtype} {tuple(t.shape)}, plan {tp['dtype']} {want}")
    return errors


class LaunchCapture:
    """--dry-run: stands for the C launcher of every variant; records what would reach cuLaunchKernelEx."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.c_calls = 0  # launches the C path made (its packed bytes decoded), the rest took the Python path

    def install(self, servers: dict[str, Any]) -> None:
        from nojit.loader.runtimes.tilelang import serving as tilelang_serving

        tilelang_serving.current_device = lambda: 0
        tilelang_serving.current_stream = lambda device: 0
        for server in servers.values():
            for variant in server.variants.values():
                variant._functions[0] = id(variant)
                variant._c_launch = self._launch
                if getattr(variant, "_plan", None) is not None:
                    variant._tl_launch = self._c_path(variant)

    def _c_path(self, variant: Any) -> Any:
        """Stands for the C launch (csrc/nojit_fast_tilelang.h): what its plan packs for the call, recorded as the
        Python path's launches are; a declined call (1) takes the Python path."""
        import struct

        from nojit.loader.runtimes.triton.fast import fast_module

        pack = fast_module().tl_pack
        plan = variant.launch

        def launch(c_plan: Any, tensors: tuple, device: int, stream: int) -> int:
            r = pack(c_plan, tensors)
            if r is None:
                return 1
            if r == 0:
                return 0
            grid, block, smem, packed = r
            types_ = "".join("p" if p["kind"] == "tensor" else {"int32": "i", "int64": "l"}[p["ctype"]]
                             for p in plan.params)
            args = [struct.unpack_from("<I" if t == "i" else "<Q", packed, 8 * i)[0] for i, t in enumerate(types_)]
            self.calls.append({"function": variant._functions[device], "grid": grid, "block": block, "smem": smem,
                               "types": types_.encode(), "args": args, "pdl": int(plan.pdl),
                               "cooperative": int(plan.cooperative)})
            self.c_calls += 1
            return 0

        return launch

    def _launch(self, function: int, gx: int, gy: int, gz: int, bx: int, by: int, bz: int, smem: int, stream: int,
                types_: bytes, args: list[int], nargs: int, cx: int, cy: int, cz: int, pdl: int, coop: int,
                err: Any, errlen: int) -> int:
        self.calls.append({"function": function, "grid": (gx, gy, gz), "block": (bx, by, bz), "smem": smem,
                           "types": bytes(types_), "args": list(args)[:nargs], "pdl": pdl, "cooperative": coop})
        return 0


def expected_launch(variant: Any, case: Case) -> dict[str, Any]:
    """The launch the entry's plan prescribes for the case's tensors (by parameter name, aliasing included)."""
    from nojit.loader.bundle.launch_expr import evaluate

    plan = variant.launch
    args = [case.named[p["name"]].data_ptr() if p["kind"] == "tensor" else case.values[p["name"]] for p in plan.params]
    types_ = "".join("p" if p["kind"] == "tensor" else {"int32": "i", "int64": "l"}[p["ctype"]] for p in plan.params)
    return {"function": id(variant), "grid": tuple(evaluate(e, case.values) for e in plan.grid),
            "block": tuple(evaluate(e, case.values) for e in plan.block), "smem": plan.dynamic_smem,
            "types": types_.encode(), "args": args, "pdl": int(plan.pdl), "cooperative": int(plan.cooperative)}


def run_case(server: Any, entry_key: tuple[Any, ...], case: Case, mhc: Any, capture: LaunchCapture | None) -> dict:
    """Launch once through the server as vLLM would, then check key, plan, writes, guards, inputs, values."""
    variant = server.variants[entry_key]
    res: dict[str, Any] = {"num_tokens": case.num_tokens, "split_k": case.split_k, "errors": []}
    _tensors, key = server._bind(*case.args, **case.kwargs)
    if key != entry_key:
        res["errors"].append(f"vLLM's call resolves key {key}, not this entry's")
    res["errors"] += plan_mismatches(variant.launch, case)
    out_ids = {id(g.t) for g in case.outputs.values()}
    inputs = {n: t for n, t in case.named.items() if id(t) not in out_ids}
    before = {n: t.clone() for n, t in inputs.items()}
    server(*case.args, **case.kwargs)
    if capture is not None:
        want = expected_launch(variant, case)
        if capture.calls[-1:] != [want]:
            res["errors"].append(f"launch {capture.calls[-1:]} != plan {want}")
    else:
        torch.cuda.synchronize()
        expected = case.reference()
        res["outputs"] = {}
        for name, g in case.outputs.items():
            r = compare(g.t, expected[name], case.tolerances[name])
            r["unwritten"], r["guards"] = g.unwritten(), g.guards_intact()
            res["outputs"][name] = r
            if not (r["ok"] and r["unwritten"] == 0 and r["guards"]):
                res["errors"].append(f"{name}: {r['bad']} beyond tolerance, {r['unwritten']} unwritten, "
                                     f"guards {'intact' if r['guards'] else 'OVERWRITTEN'}")
    changed = [n for n, t in inputs.items() if not torch.equal(t.view(torch.uint8), before[n].view(torch.uint8))]
    if changed:
        res["errors"].append(f"inputs written: {changed}")
    if case.owner is not None:
        res["owner"] = run_owner(case, mhc, capture)
        if res["owner"] != "same":
            res["errors"].append(f"owner path: {res['owner']}")
    res["ok"] = not res["errors"]
    return res


def run_owner(case: Case, mhc: Any, capture: LaunchCapture | None) -> str:
    """The same inputs through vLLM's owner object: same cubin, bit-identical outputs."""
    direct = {n: g.t.clone() for n, g in case.outputs.items()}
    n_before = len(capture.calls) if capture else 0
    for g in case.outputs.values():
        g.poison()
    got = case.owner(mhc) or {n: g.t for n, g in case.outputs.items()}
    if capture is not None:
        if len(capture.calls) != n_before + 1:
            return "owner made no launch"
        a, b = capture.calls[n_before - 1], capture.calls[-1]
        same = a["function"] == b["function"] and a["grid"] == b["grid"] and (
            case.split_k is not None or a["args"] == b["args"])
        return "same" if same else f"other launch {b} (direct {a})"
    torch.cuda.synchronize()
    diff = [n for n in direct if not torch.equal(got[n].view(torch.uint8), direct[n].view(torch.uint8))]
    if not all(g.guards_intact() for g in case.outputs.values()):
        diff.append("guard bands")
    return "same" if not diff else f"differs in {diff}"


# --------------------------------------------------------------------------------------------------
# Driver.

def short_keys(entries: list[Any]) -> dict[int, str]:
    """Per entry, the key arguments whose values differ among its kernel's entries (e.g. n_splits=8)."""
    from nojit.loader.bundle.tilelang_key import key_from_json, key_names

    by_kernel: dict[str, list[Any]] = {}
    for e in entries:
        by_kernel.setdefault(e.kernel, []).append(e)
    out = {}
    for group in by_kernel.values():
        dicts = [dict(zip(key_names(e.key), key_from_json(e.key))) for e in group]
        varying = [n for n in dicts[0] if len({repr(d.get(n)) for d in dicts}) > 1]
        for e, d in zip(group, dicts):
            out[id(e)] = " ".join(f"{n}={d[n]}" for n in varying) or "-"
    return out


def check_bundle(bundle_path: str, vllm_src: str, sizes: tuple[int, ...], seed: int, kernels: str | None,
                 dry_run: bool, audit: ProcessAudit, blocker: TileLangBlocker) -> dict[str, Any]:
    from nojit.loader.strict import guards
    from nojit.loader.install import install
    from nojit.loader.bundle.tilelang_key import key_from_json, key_names
    from nojit.loader.runtimes.tilelang.serving import TileLangKernelServer

    device = "cpu" if dry_run else "cuda"
    audit.phase = "serving"
    from nojit.loader.bundle.file import Bundle

    tilelang_ids = {k for k, r in Bundle.open(bundle_path).manifest.kernels.items() if r.runtime == "tilelang"}
    # a merged bundle (device_run.sh `wheel`) also holds Triton kernels, checked by check_triton.py
    inst = install(bundle_path, mode="strict", allow_mismatch=frozenset({"vllm"}), kernels=tilelang_ids)
    mount_vllm(vllm_src)
    mhc = importlib.import_module(MHC)
    ref = Float64Reference(importlib.import_module(TORCH_REF))
    report: dict[str, Any] = {"bundle": bundle_path, "sizes": list(sizes), "seed": seed, "dry_run": dry_run,
                              "enable_pdl": getattr(mhc, "ENABLE_PDL", None), "entries": []}
    entries = sorted((e for e in inst.bundle.manifest.entries
                      if inst.bundle.manifest.kernels[e.kernel].runtime == "tilelang"
                      and (not kernels or kernels in e.kernel)), key=lambda e: (e.kernel, key_from_json(e.key)))
    # The servers vLLM's module now holds (nojit fills them as the module decorates its kernels).
    servers = {k: getattr(mhc, k.rpartition(":")[2], None) for k in {e.kernel for e in entries}}
    servers = {k: s for k, s in servers.items() if isinstance(s, TileLangKernelServer)}
    capture = LaunchCapture() if dry_run else None
    if capture is not None:
        capture.install(servers)
    else:
        t0 = time.perf_counter()
        report["modules_loaded"] = sum(s.preload(torch.cuda.current_device()) for s in servers.values())
        report["preload_s"] = time.perf_counter() - t0
    labels = short_keys(entries)
    for n, entry in enumerate(entries):
        name = entry.kernel.rpartition(":")[2]
        key = dict(zip(key_names(entry.key), key_from_json(entry.key)))
        row: dict[str, Any] = {"kernel": name, "variant": labels[id(entry)], "key": key, "cases": [], "errors": [],
                               "ok": False}
        report["entries"].append(row)
        server = servers.get(entry.kernel)
        if server is None or name not in BUILDERS:
            row["errors"].append(f"{name} is not a nojit server in vLLM's module, or has no check")
            continue
        try:
            plan = case_plan(name, key, sizes, mhc)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            row["errors"].append(f"{type(exc).__name__}: {exc}")
            continue
        for i, (t, split_k, via_owner) in enumerate(plan):
            try:
                case = BUILDERS[name](key, t, split_k, Rand(seed + 1000 * n + i, device), ref)
                if not via_owner:
                    case.owner = None
                row["cases"].append(run_case(server, key_from_json(entry.key), case, mhc, capture))
                del case  # free this size's buffers before the next
            except Exception as exc:  # noqa: BLE001 - one bad case must not hide the others
                row["cases"].append({"num_tokens": t, "split_k": split_k, "ok": False,
                                     "errors": [f"{type(exc).__name__}: {str(exc)[:300]}"]})
        row["ok"] = not row["errors"] and bool(row["cases"]) and all(c["ok"] for c in row["cases"])
    report["launches"] = len(capture.calls) if capture else None
    report["launches_by_c_path"] = capture.c_calls if capture else None
    report["process_events"] = [f"{p}: {e}" for p, e in audit.events]
    report["serving_processes"] = [e for p, e in audit.events if p == "serving"]
    report["compile_attempts"] = list(guards.compile_attempts)
    report["tilelang_refused"] = list(blocker.refused)
    report["tilelang_loaded"] = sorted(m for m in sys.modules if m == "tilelang" or m.startswith("tilelang."))
    report["ok"] = (bool(report["entries"]) and all(r["ok"] for r in report["entries"]) and report["enable_pdl"] is True
                    and not report["serving_processes"] and not report["compile_attempts"]
                    and not report["tilelang_loaded"])
    return report


def _fmt(x: float) -> str:
    return "0" if x == 0 else f"{x:.1e}" if x < 1e-2 or x >= 1e3 else f"{x:.3f}"


def print_table(report: dict[str, Any]) -> None:
    header = ("kernel", "variant", "num_tokens (split_k)", "max abs/rel per output", "written", "owner", "result")
    rows = []
    for r in report["entries"]:
        cases = r["cases"]
        sizes = ",".join(str(c["num_tokens"]) + (f"({c['split_k']})" if c.get("split_k") else "") for c in cases)
        errs: dict[str, list[float]] = {}
        for c in cases:
            for o, v in c.get("outputs", {}).items():
                e = errs.setdefault(o, [0.0, 0.0])
                e[0], e[1] = max(e[0], v["max_abs"]), max(e[1], v["max_rel"])
        outs = " ".join(f"{o} {_fmt(a)}/{_fmt(b)}" for o, (a, b) in errs.items()) or ("plan ok" if report["dry_run"]
                                                                                       else "-")
        unwritten = sum(v["unwritten"] for c in cases for v in c.get("outputs", {}).values())
        guards_ok = all(v["guards"] for c in cases for v in c.get("outputs", {}).values())
        written = "-" if report["dry_run"] else "yes" if unwritten == 0 and guards_ok else f"NO ({unwritten})"
        owner = next((c["owner"] for c in cases if "owner" in c), "-")
        rows.append((r["kernel"], r["variant"], sizes, outs, written, owner if len(owner) < 12 else "DIFF",
                     "PASS" if r["ok"] else "FAIL"))
    widths = [max(len(str(x[i])) for x in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths)))
    for r in report["entries"]:
        for msg in r["errors"] + [f"N={c['num_tokens']} split_k={c.get('split_k')}: {e}" for c in r["cases"]
                                  for e in c["errors"]]:
            print(f"  FAIL {r['kernel']} {r['variant']}: {msg}")
    print(f"\nENABLE_PDL {report['enable_pdl']}; processes started while serving: {len(report['serving_processes'])}"
          f" (startup: {len(report['process_events']) - len(report['serving_processes'])}); nojit compile attempts: "
          f"{len(report['compile_attempts'])}; tilelang imports refused: {len(report['tilelang_refused'])}; "
          f"tilelang modules loaded: {report['tilelang_loaded'] or 'none'}"
          + (f"; cubins loaded: {report['modules_loaded']} in {report['preload_s'] * 1e3:.1f} ms"
             if "modules_loaded" in report else f"; launches captured: {report['launches']}"))
    for e in report["process_events"]:
        print(f"  process {e}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bundle", required=True)
    ap.add_argument("--vllm-src", default=os.path.join(ROOT, ".device", "vllm_src"),
                    help="carried vLLM files (tools/prepare_device.py), holding vllm/model_executor/...")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="num_tokens values")
    ap.add_argument("--kernels", help="substring filter on kernel ids")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dry-run", action="store_true", help="no GPU: capture launches and check them against the plan")
    ap.add_argument("--json", help="write the full report here")
    args = ap.parse_args(argv)
    audit = ProcessAudit()
    sys.addaudithook(audit)
    blocker = TileLangBlocker()
    sys.meta_path.insert(0, blocker)
    os.environ["CUDA_DISABLE_PTX_JIT"] = "1"  # before the driver initialises: SASS only, as in serving
    seed = args.seed if args.seed is not None else int.from_bytes(os.urandom(3), "little")
    sizes = tuple(int(s) for s in args.sizes.split(","))
    if not args.dry_run and not (torch.cuda.is_available() and torch.cuda.get_device_capability(0) == (9, 0)):
        print("needs an sm_90 GPU (use --dry-run without one)\nRESULT: FAIL")
        return 1
    where = "dry run (CPU)" if args.dry_run else torch.cuda.get_device_name(0)
    print(f"bundle {args.bundle}; {where}; torch {torch.__version__}; sizes {sizes}; seed {seed}", flush=True)
    t0 = time.perf_counter()
    report = check_bundle(args.bundle, args.vllm_src, sizes, seed, args.kernels, args.dry_run, audit, blocker)
    report["seconds"] = time.perf_counter() - t0
    print_table(report)
    n_cases = sum(len(r["cases"]) for r in report["entries"])
    print(f"\n{len(report['entries'])} entries, {n_cases} cases, {report['seconds']:.1f} s")
    print(f"RESULT: {'PASS' if report['ok'] else 'FAIL'}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
