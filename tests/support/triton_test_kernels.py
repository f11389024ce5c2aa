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


@triton.jit
def row_logsumexp(out_ptr, x_ptr, stride, n, BLOCK: tl.constexpr):
    """One row per program: a reduction whose order follows the layout Triton picks."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * stride + offs, mask=offs < n, other=float("-inf")).to(tl.float32)
    m = tl.max(x, axis=0)
    tl.store(out_ptr + row, m + tl.log(tl.sum(tl.exp(x - m), axis=0)))


@triton.jit
def tile_matmul(c_ptr, a_ptr, b_ptr, K, BLOCK: tl.constexpr):
    """A pipelined K loop feeding tl.dot: with aligned inputs Triton copies tiles asynchronously."""
    offs = tl.arange(0, BLOCK)
    acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
    for k in range(0, K, BLOCK):
        a = tl.load(a_ptr + offs[:, None] * K + (k + offs)[None, :])
        b = tl.load(b_ptr + (k + offs)[:, None] * BLOCK + offs[None, :])
        acc += tl.dot(a, b)
    tl.store(c_ptr + offs[:, None] * BLOCK + offs[None, :], acc)
