"""Launch one bundled Triton key twice on the GPU, through the loader and through Triton's JIT.

Inputs are synthesized from the key itself, so they select exactly that key in both paths:
pointers get buffers of the key's dtype (offset by one element where the key says the
pointer is not 16-byte aligned), ints get small values of the key's class (1, a multiple
of 16, or neither), constexprs their key values. Every buffer is filled from one seed;
buffers the kernel stores to are poisoned (all bits set) first. Both paths start from
identical bytes, and afterwards every byte of every buffer is hashed for comparison.

The kernel semantics are not modelled: values are small so that every address stays
inside its buffer, which is padded on both sides.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import random
import textwrap
from typing import Any

import torch

ELEMS = 1 << 17  # elements per buffer (more for kernels with wide constexpr rows, see buffer_elems)
MAX_ELEMS = 1 << 21
MARGIN = 1 << 13  # elements before the pointer, for small negative offsets
INDEX_CAP = 64  # largest synthesized index value: INDEX_CAP x the widest stride (1025) < ELEMS
GRID = (3, 2, 1)  # the largest grid used; kernels get only the axes they read (see grid_for)

# Parameters holding tables of device addresses (vLLM's V2 block tables, staged writes, KV
# zeroing): each entry gets the address of one of TABLE_TARGETS int32 buffers of its own, in
# both processes, and the table's bytes (addresses, which differ between processes) are not
# compared; the target buffers are.
ADDRESS_TABLES = {
    "_gather_block_tables_kernel": ("src_block_table_ptrs", "dst_block_table_ptrs"),
    "_compute_slot_mappings_kernel": ("block_table_ptrs",),
    "_apply_write_kernel": ("output_ptr",),  # a table only with MULTI_GROUP (a *u64 parameter then)
    "_zero_kv_blocks_kernel": ("seg_addrs_ptr",),
}
TABLE_TARGETS = 8


# Kernels whose rows are as wide as a constexpr (a vocabulary) and are updated in place: their
# row strides must be at least that wide, else programs on neighbouring rows overlap and race.
WIDE_ROWS = {"_topk_topp_kernel": "VOCAB_SIZE"}
MAX_ROWS = 49  # rows such a kernel may touch: row counts are synthesized below 49 (see _int_of_class)


def grid_for(fn: Any) -> tuple[int, int, int]:
    """GRID restricted to the axes the kernel reads: a second program on an axis the kernel
    ignores would redo the same read-modify-writes and race with the first."""
    src = inspect.getsource(fn.fn).replace(" ", "")
    used = [any(f"{call}({axis})" in src or f"{call}(axis={axis})" in src for call in ("program_id", "num_programs"))
            for axis in range(3)]
    return tuple(g if used[a] or a == 0 else 1 for a, g in enumerate(GRID))  # type: ignore[return-value]


def buffer_elems(spec: Any) -> int:
    """Buffers at least four times the widest constexpr row (e.g. a vocabulary), within MAX_ELEMS."""
    widest = max((v[1] for t, v in spec if t == "constexpr" and v[0] == "int"), default=0)
    return min(MAX_ELEMS, max(ELEMS, 4 * widest + MARGIN))

_DTYPES = {
    "i8": torch.int8, "u8": torch.uint8, "i16": torch.int16, "i32": torch.int32, "i64": torch.int64,
    "u1": torch.bool, "fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64,
    "fp8e4nv": torch.float8_e4m3fn, "fp8e5": torch.float8_e5m2, "u32": torch.uint32, "u64": torch.uint64,
}


_STORES = ("store", "atomic_add", "atomic_max", "atomic_min", "atomic_xchg", "atomic_cas")


def _root(node: ast.AST) -> str | None:
    while isinstance(node, ast.BinOp):
        node = node.left
    return node.id if isinstance(node, ast.Name) else None


def _stored_params(fn: Any, depth: int = 0, calls: tuple[str, ...] = _STORES) -> set[int]:
    """Indices of parameters used as the base address of a store (or of `calls`), following @jit helpers."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))
    params = [p.name for p in fn.params]
    out: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        if isinstance(node.func, ast.Attribute) and node.func.attr in calls and node.args:
            root = _root(node.args[0])
            if root in params:
                out.add(params.index(root))
        elif isinstance(node.func, ast.Name) and depth < 4:
            helper = fn.__globals__.get(node.func.id)
            if helper is not None and hasattr(helper, "params") and hasattr(helper, "fn"):
                for j in _stored_params(helper, depth + 1, calls):
                    if j < len(node.args) and (root := _root(node.args[j])) in params:
                        out.add(params.index(root))
    return out


def read_modify_write_names(fn: Any) -> set[str]:
    """Parameters the kernel both loads from and stores to (its state changes from launch to launch)."""
    return {fn.params[i].name for i in _stored_params(fn) & _stored_params(fn, calls=("load",))}


def stored_pointer_names(fn: Any) -> set[str]:
    """Parameters the kernel only stores through (pure outputs, poisoned before a run), including
    inside @jit helpers. Buffers it also reads (read-modify-write) get valid input data instead."""
    return {fn.params[i].name for i in _stored_params(fn) - _stored_params(fn, calls=("load",))}


def _int_of_class(name: str, ty: str, attr: Any, rng: random.Random, row: int = 1024) -> int:
    if ty != "i32":
        raise ValueError(f"{ty} arguments need values beyond 2^31; not synthesized")
    if "stride" in name.lower():
        # Row strides at least as wide as any row a kernel writes (vLLM's rows are padded to
        # their width): with narrower rows, programs writing neighbouring rows would race.
        aligned = -(-row // 16) * 16
        return aligned + 1 if attr == "" else aligned
    if attr == "D":
        return 16 * rng.randint(1, 3)
    if attr == "":
        return rng.choice([2, 3, 5, 6, 7, 9, 10, 11])
    return rng.randint(2, 24)  # not specialized: any value


def synthesize(fn: Any, key: Any, seed: int, device: str = "cuda") -> tuple[dict[str, Any], list[torch.Tensor], set[str]]:
    """kwargs selecting `key`, the backing buffers (in parameter order), and the output names."""
    from nojit.loader.bundle.key_values import untag as constexpr_value

    spec, options = key
    rng = random.Random(seed)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    outputs = stored_pointer_names(fn)
    elems = buffer_elems(spec)
    row = 1024
    if fn.__name__ in WIDE_ROWS:
        row = dict(zip((q.name for q in fn.params), spec))[WIDE_ROWS[fn.__name__]][1][1]
        elems = max(elems, MAX_ROWS * (row + 16) + 2 * MARGIN)
    kwargs: dict[str, Any] = {}
    buffers: list[torch.Tensor] = []
    targets: list[torch.Tensor] = []
    tables = _address_tables(fn, spec)
    for p, (ty, attr) in zip(fn.params, spec):
        if ty == "constexpr":
            kwargs[p.name] = constexpr_value(attr)
        elif ty.startswith("*"):
            dtype = _DTYPES[ty.lstrip("*k")]
            base = torch.empty(elems, dtype=dtype, device=device)
            if p.name in outputs:
                base.view(torch.uint8).fill_(0xFF)
            elif dtype.is_floating_point:
                base.copy_(torch.randn(elems, generator=gen, device=device, dtype=torch.float32).to(dtype))
            elif dtype == torch.bool:
                base.copy_(torch.randint(0, 2, (elems,), generator=gen, device=device).bool())
            else:
                base.zero_()  # filled below, from the pointer on
            offset = MARGIN + (1 if attr == "" else 0)
            if p.name not in outputs and not dtype.is_floating_point and dtype != torch.bool:
                # Non-decreasing small integers from the pointer on: valid offsets, lengths and
                # cumulative starts at once, so programs of one launch do not race on overlapping
                # ranges; zeros in the margin before it.
                base.zero_()
                base[offset:].copy_(_index_values(elems - offset, gen, device).to(dtype))
                if "stride" in p.name.lower():  # a table of row strides: rows as wide as scalar strides
                    base[offset:].fill_(_int_of_class(p.name, "i32", "D", rng))
            if p.name in tables and dtype in (torch.int64, torch.uint64):
                mine = [_index_values(elems, gen, device).to(torch.int32) for _ in range(TABLE_TARGETS)]
                addresses = torch.tensor([t[MARGIN:].data_ptr() for t in mine], dtype=torch.int64, device=device)
                base.view(torch.int64)[offset:].copy_(addresses.repeat((elems - offset) // TABLE_TARGETS + 1)[: elems - offset])
                base.nojit_address_table = True
                targets += mine
            kwargs[p.name] = base[offset:]
            buffers.append(base)
        elif ty in ("fp32", "fp64", "fp16", "bf16"):
            kwargs[p.name] = rng.uniform(0.5, 2.0)
        elif ty == "u1":
            kwargs[p.name] = bool(rng.getrandbits(1))
        else:
            kwargs[p.name] = _int_of_class(p.name, ty, attr if isinstance(attr, str) or attr is None else "", rng, row)
    for name, tagged in options:
        if name not in ("debug", "instrumentation_mode"):
            kwargs[name] = constexpr_value(tagged)
    return kwargs, buffers + targets, outputs


def _address_tables(fn: Any, spec: Any) -> set[str]:
    names = set(ADDRESS_TABLES.get(fn.__name__, ()))
    constexprs = {p.name: attr for p, (ty, attr) in zip(fn.params, spec) if ty == "constexpr"}
    if constexprs.get("MULTI_GROUP", ("bool", True))[1] is False:
        names.discard("output_ptr")  # a data pointer then
    return names


def _index_values(n: int, gen: Any, device: str) -> torch.Tensor:
    """n non-decreasing small integers (steps of 0-2), capped at INDEX_CAP: such values also index
    other tables and are scaled by strides (block table -> block number x stride), which must stay
    inside every buffer."""
    steps = torch.randint(0, 3, (n,), generator=gen, device=device)
    return torch.cumsum(steps, 0).clamp_(max=INDEX_CAP)


def misaligned_copies(fn: Any, key: Any, kwargs: dict[str, Any], buffers: list[torch.Tensor]
                      ) -> tuple[dict[str, Any], list[torch.Tensor], int]:
    """The same inputs off their 16-byte alignment: every pointer the key marks aligned ('D')
    gets a copy of its whole buffer a few bytes further on. Returns the new
    kwargs, the buffers to fingerprint (same bytes as the originals) and how many moved."""
    out = dict(kwargs)
    moved: list[torch.Tensor] = []
    tensors = [p for p in fn.params if isinstance(kwargs.get(p.name), torch.Tensor)]
    attrs = {q.name: attr for q, (_ty, attr) in zip(fn.params, key[0])}
    n = 0
    for p, base in zip(tensors, buffers):
        if attrs[p.name] != "D":
            moved.append(base)
            continue
        # 4 bytes off (one element for wider types): off any 8- or 16-byte vector alignment, but
        # still 4-byte aligned, which kernels that store 32-bit words into byte buffers need.
        shift = max(1, 4 // base.element_size())
        bigger = torch.empty(base.numel() + shift, dtype=base.dtype, device=base.device)
        bigger[shift:].copy_(base)
        offset = kwargs[p.name].storage_offset() - base.storage_offset()
        out[p.name] = bigger[shift + offset:]
        same = bigger[shift:]
        if getattr(base, "nojit_address_table", False):
            same.nojit_address_table = True
        moved.append(same)
        n += 1
    return out, moved + buffers[len(tensors):], n


def fingerprint(buffers: list[torch.Tensor]) -> list[str]:
    torch.cuda.synchronize()
    return ["address table" if getattr(b, "nojit_address_table", False)
            else hashlib.sha256(b.cpu().view(torch.uint8).numpy().tobytes()).hexdigest()[:32] for b in buffers]


def written_elements(fn: Any, buffers: list[torch.Tensor], kwargs: dict[str, Any], outputs: set[str]) -> int:
    """How many elements of the poisoned output buffers the kernel overwrote."""
    n = 0
    for p, b in zip([p for p in fn.params if p.name in kwargs and isinstance(kwargs[p.name], torch.Tensor)], buffers):
        if p.name in outputs:
            n += int((b.view(torch.uint8).view(-1, b.element_size()) != 0xFF).any(dim=1).sum())
    return n
