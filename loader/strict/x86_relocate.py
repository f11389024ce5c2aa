"""Moving the first instructions of an x86-64 function elsewhere, so a hot-patched entry can still be called.

Strict mode refuses the driver's PTX loads by patching libcuda's image loaders (cuModuleLoadData and its
siblings) to jump to a checking stub; the stub must then run the original for a cubin or a fatbin. The patch
overwrote the entry's first bytes, so those instructions are copied, whole, into a trampoline near the library
(RIP-relative operands and relative calls re-aimed at what they named), followed by a jump back past the patch.

Only instructions a function prologue is made of are understood (pushes, moves, ALU with immediates, lea,
endbr64, nops, SSE moves, a relative call, RIP-relative memory operands); a control transfer other than a call
(ret, jmp, jcc), a VEX/EVEX prefix or anything unknown makes relocate() return None, and the caller then leaves
the entry unpatched and says so. tests/loader/strict/test_x86_relocate.py checks the lengths against objdump on every exported
function of the CUDA libraries installed here.
"""

from __future__ import annotations

import struct

_LEGACY_PREFIXES = frozenset({0xF0, 0xF2, 0xF3, 0x2E, 0x36, 0x3E, 0x26, 0x64, 0x65, 0x66})
# one-byte opcodes with a ModRM byte and no immediate
_MODRM = frozenset({*(b + i for b in range(0x00, 0x40, 8) for i in range(4)), 0x63, 0x84, 0x85, 0x86, 0x87,
                    0x88, 0x89, 0x8A, 0x8B, 0x8D, 0x8F, 0xD0, 0xD1, 0xD2, 0xD3, 0xFE, 0xFF})
_ALU_AL_IMM8 = frozenset(range(0x04, 0x40, 8))
_ALU_EAX_IMMZ = frozenset(range(0x05, 0x40, 8))
# two-byte (0F xx) opcodes with a ModRM byte: SSE moves and logic, cmov, setcc, movzx/movsx, bt, imul, nop r/m
_MODRM_0F = frozenset({0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x1E, 0x1F, 0x28, 0x29, 0x2A, 0x2C,
                       0x2D, 0x2E, 0x2F, *range(0x40, 0x70), 0x74, 0x75, 0x76, 0x7E, 0x7F, *range(0x90, 0xA0), 0xA3,
                       0xA5, 0xAB, 0xAD, 0xAF, 0xB0, 0xB1, 0xB3, 0xB6, 0xB7, 0xBB, 0xBC, 0xBD, 0xBE, 0xBF, 0xC0,
                       0xC1, *range(0xD0, 0x100)})
_MODRM_IMM8_0F = frozenset({0x70, 0x71, 0x72, 0x73, 0xA4, 0xAC, 0xBA, 0xC2, 0xC4, 0xC5, 0xC6})
JMP_ABS_LEN = 14  # jmp qword ptr [rip+0]; .quad target


class Instruction:
    """One decoded instruction: its length and, if its operand is relative to RIP, where the 32-bit field is."""

    __slots__ = ("length", "rel_at", "is_call")

    def __init__(self, length: int, rel_at: int = -1, is_call: bool = False) -> None:
        self.length, self.rel_at, self.is_call = length, rel_at, is_call


def _modrm_length(code: bytes, at: int) -> tuple[int, int] | None:
    """(bytes of ModRM + SIB + displacement, offset of a RIP-relative disp32 from `at` or -1)."""
    if at >= len(code):
        return None
    modrm = code[at]
    mod, rm = modrm >> 6, modrm & 7
    if mod == 3:
        return 1, -1
    n = 1
    if rm == 4:  # SIB
        if at + 1 >= len(code):
            return None
        n += 1
        if mod == 0 and code[at + 1] & 7 == 5:
            return n + 4, -1
    elif mod == 0 and rm == 5:
        return 5, 1  # RIP-relative disp32
    return n + (1 if mod == 1 else 4 if mod == 2 else 0), -1


def decode(code: bytes, at: int = 0) -> Instruction | None:
    """The instruction at code[at], or None if it is not one this module can move."""
    i, opsize16, rex_w = at, False, False
    while i < len(code) and code[i] in _LEGACY_PREFIXES:
        opsize16 |= code[i] == 0x66
        i += 1
    if i < len(code) and 0x40 <= code[i] <= 0x4F:
        rex_w = bool(code[i] & 8)
        i += 1
    if i >= len(code):
        return None
    op = code[i]
    i += 1
    immz = 2 if opsize16 else 4
    rel_at = -1
    imm = 0
    if op == 0x0F:
        if i >= len(code):
            return None
        op2 = code[i]
        i += 1
        if op2 in (0x38, 0x3A):  # three-byte maps: ModRM (+ imm8 for 0F 3A)
            if i >= len(code):
                return None
            i += 1
            imm = 1 if op2 == 0x3A else 0
        elif op2 in _MODRM_IMM8_0F:
            imm = 1
        elif op2 not in _MODRM_0F:
            return None
        m = _modrm_length(code, i)
        if m is None:
            return None
        if m[1] >= 0:
            rel_at = i + m[1] - at
        length = i + m[0] + imm - at
        return Instruction(length, rel_at) if at + length <= len(code) else None
    if 0x50 <= op <= 0x5F or op in (0x90, 0x98, 0x99, 0xC9) or 0x91 <= op <= 0x97:
        return Instruction(i - at)
    if op in _ALU_AL_IMM8 or op in (0x6A, 0xA8) or 0xB0 <= op <= 0xB7:
        imm = 1
    elif op in _ALU_EAX_IMMZ or op in (0x68, 0xA9):
        imm = immz
    elif 0xB8 <= op <= 0xBF:
        imm = 8 if rex_w else immz
    elif op == 0xE8:  # call rel32: re-aimed at the same target
        return Instruction(i + 4 - at, i - at, True) if i + 4 <= len(code) else None
    elif op in _MODRM or op in (0x69, 0x6B, 0x80, 0x81, 0x83, 0xC0, 0xC1, 0xC6, 0xC7, 0xF6, 0xF7):
        m = _modrm_length(code, i)
        if m is None:
            return None
        reg = (code[i] >> 3) & 7
        if (op == 0xFF and reg in (3, 4, 5, 7)) or (op == 0xFE and reg > 1):  # jmp r/m, far call: a transfer
            return None
        if op in (0x80, 0x83, 0x6B, 0xC0, 0xC1, 0xC6) or (op == 0xF6 and reg in (0, 1)):
            imm = 1
        elif op in (0x81, 0x69, 0xC7) or (op == 0xF7 and reg in (0, 1)):
            imm = immz
        if m[1] >= 0:
            rel_at = i + m[1] - at
        length = i + m[0] + imm - at
        return Instruction(length, rel_at) if at + length <= len(code) else None
    else:
        return None  # ret, jmp, jcc, int3, string ops, VEX/EVEX, anything not a prologue's
    length = i + imm - at
    return Instruction(length) if at + length <= len(code) else None


def lengths(code: bytes, need: int) -> list[Instruction] | None:
    """The whole instructions that cover at least `need` bytes from code[0], or None."""
    out: list[Instruction] = []
    at = 0
    while at < need:
        ins = decode(code, at)
        if ins is None:
            return None
        out.append(ins)
        at += ins.length
    return out


def relocate(code: bytes, source: int, dest: int, need: int) -> bytes | None:
    """The trampoline placed at `dest` for a function at `source` whose first `need` bytes get patched: its
    whole first instructions, re-aimed where relative, then a jump back to the first byte not copied. None if
    they cannot be moved (unknown instruction, control transfer, or a target out of rel32 reach from `dest`)."""
    found = lengths(code, need)
    if found is None:
        return None
    out = bytearray()
    at = 0
    for ins in found:
        raw = bytearray(code[at:at + ins.length])
        if ins.rel_at >= 0:
            disp = struct.unpack_from("<i", raw, ins.rel_at)[0]
            target = source + at + ins.length + disp
            new = target - (dest + len(out) + ins.length)
            if not -(1 << 31) <= new < (1 << 31):
                return None
            struct.pack_into("<i", raw, ins.rel_at, new)
        out += raw
        at += ins.length
    out += b"\xff\x25\x00\x00\x00\x00" + struct.pack("<Q", source + at)
    return bytes(out)
