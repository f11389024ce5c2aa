"""loader/strict/x86_relocate.py against an independent decoder: objdump's instruction boundaries at the start of
exported functions of NVIDIA's x86-64 libraries installed here (built the way libcuda is), and the arithmetic of
a relocated RIP-relative operand and call checked by hand. A wrong length would make a trampoline run half an
instruction in libcuda's cubin loads, so every length the module claims to know must be objdump's."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess

import pytest

from nojit.loader.strict import x86_relocate
from nojit.loader.strict.inprocess_guard import _exported_functions

LIBS = ("libcudart.so.13", "libcupti.so.13", "libnvrtc.so.13", "libnvJitLink.so.13", "libnvvm.so.4", "libcufft.so.12",
        "libcusparse.so.12", "libcublas.so.13")
_LINE = re.compile(r"^\s*([0-9a-f]+):\t([0-9a-f ]+?)\s*\t(.*)$")


def _lib_dir() -> str | None:
    try:
        import nvidia.cu13

        return os.path.join(list(nvidia.cu13.__path__)[0], "lib")
    except ImportError:
        return None


def _objdump(path: str, start: int, size: int) -> list[tuple[int, bytes, str]]:
    out = subprocess.run(["objdump", "-d", "-w", f"--start-address={start:#x}", f"--stop-address={start + size:#x}",
                          path], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        m = _LINE.match(line)
        if m:
            found.append((int(m.group(1), 16), bytes.fromhex(m.group(2).replace(" ", "")), m.group(3)))
    return found


@pytest.mark.skipif(shutil.which("objdump") is None or _lib_dir() is None,
                    reason="needs objdump and the nvidia-* CUDA wheels (vLLM's torch brings them)")
def test_lengths_agree_with_objdump_on_nvidia_libraries():
    lib_dir = _lib_dir()
    agreed = whole = prologues = functions = 0
    for name in LIBS:
        path = os.path.join(lib_dir, name)
        if not os.path.exists(path):
            continue
        exported = sorted({v for _, v, size in _exported_functions(path) if size >= 14})
        for value in exported[:: max(1, len(exported) // 60)]:
            listing = _objdump(path, value, 64)
            if not listing or listing[0][0] != value:
                continue
            functions += 1
            code = b"".join(raw for _, raw, _ in listing[:-1])  # the last one may be cut by the stop address
            at = 0
            for address, raw, text in listing[:-1]:
                if "(bad)" in text:  # objdump reached data or padding it cannot decode: stop comparing here
                    break
                ins = x86_relocate.decode(code, at)
                if ins is not None:
                    assert ins.length == len(raw), f"{name}+{address:#x}: {text!r} is {len(raw)} bytes, decoded {ins.length}"
                    agreed += 1
                at += len(raw)
            covered = x86_relocate.lengths(code, x86_relocate.JMP_ABS_LEN)
            if covered is not None:
                prologues += 1
                ends = {sum(i.length for i in covered[:k + 1]) for k in range(len(covered))}
                starts = {a - value for a, _, _ in listing}
                assert ends <= starts | {len(code)}, f"{name}+{value:#x}: boundaries {sorted(ends)} vs {sorted(starts)}"
                whole += 1
    print(f"{functions} functions, {agreed} instructions decoded as objdump did, "
          f"{prologues} prologues movable")
    assert functions >= 100 and agreed >= 500, (functions, agreed)
    assert prologues >= functions // 3, (prologues, functions)  # the decoder covers the usual prologues


def test_rip_relative_operand_and_call_are_re_aimed():
    source, dest = 0x7F0000001000, 0x7F0000100000
    # mov rax, [rip+0x100]; call rel32 +0x20; push rbx; sub rsp, 0x40; cmp dword [rip+0x10], 0 (imm8 after disp)
    code = (b"\x48\x8b\x05" + struct.pack("<i", 0x100) + b"\xe8" + struct.pack("<i", 0x20) + b"\x53"
            + b"\x48\x83\xec\x40" + b"\x83\x3d" + struct.pack("<i", 0x10) + b"\x00")
    out = x86_relocate.relocate(code, source, dest, 18)  # the sub ends at 17: the cmp is moved too
    assert out is not None
    moved = len(code)
    assert out[:3] == b"\x48\x8b\x05"
    assert dest + 7 + struct.unpack_from("<i", out, 3)[0] == source + 7 + 0x100  # the same memory
    assert out[7] == 0xE8 and dest + 12 + struct.unpack_from("<i", out, 8)[0] == source + 12 + 0x20  # the same callee
    assert dest + moved + struct.unpack_from("<i", out, 19)[0] == source + moved + 0x10  # RIP counts the immediate
    assert out[moved:moved + 6] == b"\xff\x25\x00\x00\x00\x00"
    assert struct.unpack_from("<Q", out, moved + 6)[0] == source + moved  # back to the first byte not copied


@pytest.mark.parametrize("code", [b"\xc3" + bytes(20), b"\x55\xeb\x10" + bytes(20), b"\x55\x0f\x84" + bytes(24),
                                  b"\xc5\xf8\x77" + bytes(20), b"\x55\xff\x25" + bytes(24)])
def test_control_transfers_and_unknown_instructions_are_not_moved(code):
    """ret, jmp rel8, jcc rel32, a VEX instruction, jmp [rip+x]: the entry is left unpatched rather than guessed."""
    assert x86_relocate.relocate(code, 0x1000, 0x2000, 14) is None


def test_a_target_out_of_reach_is_not_moved():
    code = b"\x48\x8b\x05" + struct.pack("<i", 0x100) + b"\x53" * 10
    assert x86_relocate.relocate(code, 0x1000, 0x1000 + (3 << 30), 14) is None
