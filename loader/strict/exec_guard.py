"""Strict mode's exec guard where Landlock's exec allow-list is not applied (Issue 21, Build 2b).

Without Landlock (NOJIT_LANDLOCK=0, a kernel without it, gVisor) the audit hook and the PATH stand-ins do not see a
compiler that C code starts by absolute path. So, only then, libc's own `execve`, `execveat` and `fexecve` bodies are
hot-patched (csrc/nojit_inproc.c) to jump to a stub that refuses a compiler (-1, EACCES, the firewall's event line)
and makes any other exec itself. glibc's system(), popen(), posix_spawn(p), the exec*() family and Python's
subprocess reach execve through libc's internal alias, the same code, also in a fork/vfork/clone child. The bodies
are plain syscall wrappers (`mov $nr,%eax; syscall; cmp; jae`), which x86_relocate.py cannot move (a syscall and a
branch); the stub therefore never returns into them and makes an allowed exec with libc's syscall(). A body that is
not that wrapper is left alone and named in the report.

A target is refused when it (symlinks followed), or a path-like word of its argv, is a compiler as compilers.py
knows them: the same (dev, inode), or the same size and bytes (a copy). The argv words cover a shell's `-c` command
(`system("/usr/bin/gcc ...")`, `x=/usr/bin/gcc; $x`, `$(/tmp/copy -dumpversion)`), `env`/`setsid` wrappers and
`ld.so cc1`; a command naming a compiler's file is refused whole, even one that would only read it.

Not refused (Landlock closes these): a compiler reached through a word the shell builds at run time (a glob, a
variable assembled from pieces, a file written then run), a raw `syscall(SYS_execve)` or a statically linked
program's own exec, a program run by a child process whose image was exec'd (the patch does not survive exec: a
shell's own exec of a path it computed), and a copy whose bytes differ from every compiler found.

Like the Landlock domain it stands in for, the patch is applied once at strict install (install.py, right after
landlock.enforce, before vLLM starts its threads) and not undone by uninstall; patching libc's exec bodies while
another thread runs their first bytes would not be safe, and strict install runs before the serving process does.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.strict import compilers as compilers_mod
from nojit.loader.strict import firewall
from nojit.loader.strict.inprocess_guard import _exported_functions

# the syscall wrappers the stubs replace: their first bytes, as glibc builds them on x86-64
_WRAPPERS = {
    "execve": bytes.fromhex("b83b0000000f05"),  # mov $59,%eax; syscall
    "execveat": bytes.fromhex("4989cab8420100000f05"),  # mov %rcx,%r10; mov $322,%eax; syscall
    "fexecve": None,  # a C function (it tries execveat, then /proc/self/fd): patched whole, never called
}
_LIBC = re.compile(r"libc\.so\.6$")
APPLIES_WHEN = frozenset({"off", "unavailable"})  # landlock.Report.state values where nothing else refuses execs


@dataclass
class ExecGuardReport:
    patched: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    compilers: int = 0

    def summary(self) -> str:
        if not self.patched:
            return f"exec guard not applied ({'; '.join(self.skipped) or 'no libc loaded'})"
        return (f"exec guard on libc's {', '.join(self.patched)} ({self.compilers} compilers by inode and content)"
                + (f"; not patched: {'; '.join(self.skipped)}" if self.skipped else ""))


_state: dict[str, Any] = {"report": None, "fd": -1}
_patches: dict[int, bytes] = {}


def _native() -> Any:
    from nojit.loader import _inproc  # type: ignore[attr-defined]

    return _inproc


def _code_at(address: int, size: int) -> bytes:
    import ctypes

    return ctypes.string_at(address, size)


def activate(landlock_state: str) -> ExecGuardReport | None:
    """Patch libc's exec entries when the Landlock allow-list is not applied (`landlock_state` off or unavailable);
    None (nothing done) otherwise. Idempotent."""
    if landlock_state not in APPLIES_WHEN or os.uname().machine != "x86_64":
        return None
    if _state["report"] is not None:
        return _state["report"]
    native = _native()
    comp = compilers_mod.find()
    files = {p: v for p, v in comp.files.items() if not firewall.is_stand_in(p)}
    ids = sorted({(d, i) for d, i, _, _ in files.values()})
    sized = sorted({(size, p) for p, (_, _, size, _) in files.items()})
    log = ""
    try:
        log = firewall.event_log_path()
        fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                     0o600)
    except Exception:  # no event log: the refusal itself (EACCES) stays the answer
        fd = -1
    report = ExecGuardReport(compilers=len(files))
    try:
        native.exec_guard_set(ids, sized, fd, log)
    except ValueError as exc:  # more compilers than the C tables hold: nothing patched, and the report says why
        report.skipped.append(str(exc))
        _state["report"] = report
        if fd >= 0:
            os.close(fd)
        return report
    _state["fd"] = fd
    _, loaded = native.loaded()
    for path, bias in loaded:
        if not _LIBC.search(path):
            continue
        try:
            functions = {name: (value, size) for name, value, size in _exported_functions(path)}
        except (OSError, ValueError) as exc:
            report.skipped.append(f"{path}: symbol table unreadable ({exc})")
            continue
        for name, prologue in _WRAPPERS.items():
            if name not in functions:
                report.skipped.append(f"{path}:{name}: not exported")
                continue
            value, size = functions[name]
            address = bias + value
            if address in _patches:
                continue
            if size < native.PATCH_LEN or (prologue is not None and _code_at(address, len(prologue)) != prologue):
                report.skipped.append(f"{path}:{name}: not the syscall wrapper expected")
                continue
            try:
                _patches[address] = native.patch(address, name)
            except (OSError, ValueError) as exc:
                report.skipped.append(f"{path}:{name}: not patched ({exc})")
                continue
            report.patched.append(name)
    _state["report"] = report
    return report


def report() -> ExecGuardReport | None:
    return _state["report"]


def refusals() -> int:
    return int(_native().exec_guard_refusals())


def deactivate() -> None:
    """Put libc's code back (tests; a strict install is otherwise never undone in a serving process)."""
    native = _native()
    for address, original in reversed(list(_patches.items())):
        native.unpatch(address, original)
    _patches.clear()
    native.exec_guard_set([], [], -1)
    if _state["fd"] >= 0:
        os.close(_state["fd"])
    _state.update(report=None, fd=-1)
