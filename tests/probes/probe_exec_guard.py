"""Run by tests/loader/strict/test_exec_guard.py in a fresh process: with `guard` the exec guard is applied as strict
mode applies it without Landlock (exec_guard.activate("off")), with `none` it is not (the positive control); then gcc
is started by absolute path in each form C code has, and non-compilers are run. Prints one RESULT line.

    probe_exec_guard.py guard|none WORKDIR

WORKDIR holds x.c, cp/mycc (a copy of gcc), ln/mycc (a symlink to it) and gcclib (the folder of gcc's cc1), made
by the test.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

GCC = "/usr/bin/gcc"
AT_EMPTY_PATH = 0x1000
which, work = sys.argv[1], sys.argv[2]
src = os.path.join(work, "x.c")
gcclib = open(os.path.join(work, "gcclib")).read().strip()  # where cc1 is, for the copied driver
libc = ctypes.CDLL(None, use_errno=True)
P = ctypes.POINTER(ctypes.c_char_p)
libc.execv.argtypes = [ctypes.c_char_p, P]
libc.execveat.argtypes = [ctypes.c_int, ctypes.c_char_p, P, P, ctypes.c_int]
libc.fexecve.argtypes = [ctypes.c_int, P, P]
libc.posix_spawn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, P, P]
libc.popen.restype = ctypes.c_void_p
libc.popen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.pclose.argtypes = [ctypes.c_void_p]


def out(name: str) -> str:
    return os.path.join(work, f"out_{name}")


def cargv(*words: str):
    return (ctypes.c_char_p * (len(words) + 1))(*[w.encode() for w in words], None)


ENV = cargv(*[f"{k}={v}" for k, v in os.environ.items()])


def in_child(call) -> int:
    """Run `call` in a forked child (it execs or returns); the child's exit status (127: the exec failed)."""
    pid = libc.fork()
    if pid == 0:
        call()
        libc._exit(127)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def spawn(path: str, *argv: str) -> int:
    pid = ctypes.c_int(0)
    rc = libc.posix_spawn(ctypes.byref(pid), path.encode(), None, None, cargv(*argv), ENV)
    return -rc if rc else os.waitstatus_to_exitcode(os.waitpid(pid.value, 0)[1])


def compile_args(name: str, cc: str = GCC) -> tuple[str, ...]:
    return (cc, "-S", src, "-o", out(name))


def popen(command: str) -> None:
    stream = libc.popen(command.encode(), b"r")  # NULL (EACCES) when the shell itself was refused
    if stream:
        libc.pclose(stream)


def fd_of(path: str) -> int:
    return os.open(path, os.O_RDONLY)


if which == "guard":
    from nojit.loader.strict import exec_guard

    report = exec_guard.activate("off")
    assert report is not None and report.patched, report
forms = {
    "system_abs": lambda: libc.system(f"{GCC} -S {src} -o {out('system_abs')} 2>/dev/null".encode()),
    "popen_abs": lambda: popen(f"{GCC} -S {src} -o {out('popen_abs')}"),
    "fork_execv": lambda: in_child(lambda: libc.execv(GCC.encode(), cargv(*compile_args("fork_execv")))),
    "posix_spawn": lambda: spawn(GCC, *compile_args("posix_spawn")),
    "copied_gcc": lambda: spawn(f"{work}/cp/mycc", *compile_args("copied_gcc", f"{work}/cp/mycc"), "-B", gcclib + "/"),
    "symlinked_gcc": lambda: in_child(lambda: libc.execv(f"{work}/ln/mycc".encode(),
                                                         cargv(*compile_args("symlinked_gcc")))),
    "execveat_fd": lambda: in_child(lambda: libc.execveat(fd_of(GCC), b"", cargv(*compile_args("execveat_fd")), ENV,
                                                          AT_EMPTY_PATH)),
    "fexecve": lambda: in_child(lambda: libc.fexecve(fd_of(GCC), cargv(*compile_args("fexecve")), ENV)),
}
for name in forms:
    if os.path.exists(out(name)):
        os.unlink(out(name))
for form in forms.values():
    form()
allowed = {
    "system_true": libc.system(b"true"),
    "system_sh_c": libc.system(b"sh -c 'exit 0'"),
    "spawn_true": spawn("/bin/true", "true"),
    "fork_execv_true": in_child(lambda: libc.execv(b"/bin/true", cargv("true"))),
}
refusals = None
if which == "guard":
    refusals = exec_guard.refusals()
print("RESULT " + json.dumps({"compiled": {n: os.path.exists(out(n)) for n in forms}, "allowed": allowed,
                              "refusals": refusals}), flush=True)
