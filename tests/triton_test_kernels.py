"""Small Triton kernels that exercise every way a parameter can be specialized (for key parity)."""

import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_dns"], do_not_specialize_on_alignment=["p_noalign", "n_noalign"])
def every_kind(
    p,
    p_noalign,
    q,
    n,
    n_dns,
    n_noalign,
    n64: tl.int64,
    scale: tl.float32,
    flag,
    x,
    maybe_ptr,
    BLOCK: tl.constexpr,
    MODE: tl.constexpr = "relu",
):
    offs = tl.arange(0, BLOCK)
    v = tl.load(p + offs) * scale + n + n_dns + n_noalign + n64
    if flag:
        v = v + x
    if maybe_ptr is not None:
        v = v + tl.load(maybe_ptr + offs)
    tl.store(q + offs, v)
    tl.store(p_noalign + offs, v)
