"""DeepGEMM's compiler probe, answered in process: no shell, no nvcc, no process.

DeepGEMM (vLLM's vendored 2.8.1) runs `<nvcc> --version` through libc `popen` once per process
and puts the answer into its cache key; on a cache miss it runs nvcc the same way. Python never
sees either (no audit hook, no subprocess). Its extension imports `popen`/`pclose` through lazy
PLT slots that lie outside RELRO, so nojit rewrites those two slots of that one library: the
probe is answered from the text the bundle recorded (an in-memory FILE*), and every other
command is refused (NULL, which DeepGEMM reports as a failed command) and remembered so the
serving side can name what was asked.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import threading
from dataclasses import dataclass, field

from nojit.loader.errors import NoJitError

_R_X86_64_JUMP_SLOT = 7
_POPEN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p)
_PCLOSE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


_PINNED: list["PopenFirewall"] = []  # the patched slots point into these callbacks: never collected


class PopenFirewallError(NoJitError):
    """The DeepGEMM extension cannot be firewalled (unexpected ELF layout or not loaded)."""


def plt_slots(path: str, names: tuple[str, ...]) -> dict[str, int]:
    """Offsets (from the load base) of the JUMP_SLOT relocations for `names` in an x86-64 ELF. The file is mapped,
    not read: only its section table and relocation sections are touched (DeepGEMM's extension is about 30 MB)."""
    with open(path, "rb") as f:
        try:
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except ValueError:  # an empty file
            data = b""
    try:
        return _plt_slots(data, path, names)
    finally:
        if isinstance(data, mmap.mmap):
            data.close()


def _plt_slots(data: bytes | mmap.mmap, path: str, names: tuple[str, ...]) -> dict[str, int]:
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or struct.unpack_from("<H", data, 18)[0] != 62:
        raise PopenFirewallError(f"{path} is not an x86-64 ELF64 shared object",
                                 "serve DeepGEMM on x86-64 Linux only")
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    try:
        sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    except struct.error:
        raise PopenFirewallError(f"{path}: its section table lies outside the file",
                                 "this DeepGEMM build is not supported by nojit's in-process probe answer") from None
    wanted = {n.encode() for n in names}
    found: dict[str, int] = {}
    for sh in sections:
        if sh[1] != 4:  # SHT_RELA
            continue
        symtab = sections[sh[6]]
        strtab = sections[symtab[6]]
        end = sh[4] + sh[5] - sh[5] % 24
        for r_offset, r_info, _ in struct.iter_unpack("<QQq", memoryview(data)[sh[4]:end]):
            if r_info & 0xFFFFFFFF != _R_X86_64_JUMP_SLOT:
                continue
            st_name, = struct.unpack_from("<I", data, symtab[4] + (r_info >> 32) * 24)
            start = strtab[4] + st_name
            stop = data.find(b"\0", start)
            name = data[start:stop] if stop >= 0 else b""
            if name in wanted:
                found[name.decode()] = r_offset
    missing = [n for n in names if n not in found]
    if missing:
        raise PopenFirewallError(f"{path} has no lazy PLT slot for {', '.join(missing)}",
                                 "this DeepGEMM build is not supported by nojit's in-process probe answer")
    return found


def _writable(address: int) -> bool:
    with open("/proc/self/maps") as maps:
        for line in maps:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= address < hi:
                return "w" in line.split()[1]
    return False


def load_base(path: str) -> int:
    """The address the dynamic loader mapped `path` at (its offset-0 mapping) in this process."""
    real = os.path.realpath(path)
    with open("/proc/self/maps") as maps:
        for line in maps:
            parts = line.split()
            # the kernel prints the mapped file's path resolved: resolve again only a name that could match
            if len(parts) >= 6 and parts[2] == "00000000" and (parts[5] == real or (
                    os.path.basename(parts[5]) == os.path.basename(real) and os.path.realpath(parts[5]) == real)):
                return int(parts[0].split("-")[0], 16)
    raise PopenFirewallError(f"{path} is not loaded in this process",
                             "import DeepGEMM before installing the firewall")


@dataclass
class PopenFirewall:
    """Answers `<nvcc> --version` with `version_text`; refuses and records every other command.

    With `allow_others` (permissive and record modes) other commands are recorded and then run by
    libc's popen, with the stub path replaced by `real_nvcc` when one is given.
    """

    nvcc: str
    version_text: str
    allow_others: bool = False
    real_nvcc: str | None = None
    refused: list[str] = field(default_factory=list)
    answered: int = 0
    _open: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def install(self, extension_path: str) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self._fmemopen = libc.fmemopen
        self._fmemopen.restype = ctypes.c_void_p
        self._fmemopen.argtypes = [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p]
        self._fclose = libc.fclose
        self._fclose.argtypes = [ctypes.c_void_p]
        self._real_popen = libc.popen
        self._real_popen.restype = ctypes.c_void_p
        self._real_popen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        real_pclose = libc.pclose
        real_pclose.argtypes = [ctypes.c_void_p]
        self._real_pclose = real_pclose
        self._answer = ctypes.create_string_buffer(self.version_text.encode())
        self._popen_cb = _POPEN(self._popen)
        self._pclose_cb = _PCLOSE(self._pclose)
        slots = plt_slots(extension_path, ("popen", "pclose"))
        base = load_base(extension_path)
        for name in slots:
            if not _writable(base + slots[name]):
                raise PopenFirewallError(f"{extension_path}: the {name} slot is read-only (RELRO/BIND_NOW)",
                                         "this DeepGEMM build is not supported by nojit's in-process probe answer")
        _PINNED.append(self)
        for name, callback in (("popen", self._popen_cb), ("pclose", self._pclose_cb)):
            ctypes.c_void_p.from_address(base + slots[name]).value = ctypes.cast(callback, ctypes.c_void_p).value

    def _popen(self, command: bytes, mode: bytes) -> int | None:
        text = command.decode(errors="replace")
        if text.strip() in (f"{self.nvcc} --version", f"{self.nvcc} --version 2>&1") and mode.startswith(b"r"):
            stream = self._fmemopen(self._answer, len(self.version_text), b"r")
            with self._lock:
                self._open.add(stream)
                self.answered += 1
            return stream
        with self._lock:
            self.refused.append(text)
        if self.allow_others:
            if self.real_nvcc:
                text = text.replace(self.nvcc, self.real_nvcc)
            return self._real_popen(text.encode(), mode)
        return None

    def _pclose(self, stream: int) -> int:
        with self._lock:
            ours = stream in self._open
            self._open.discard(stream)
        if ours:
            self._fclose(stream)
            return 0
        return self._real_pclose(stream)
