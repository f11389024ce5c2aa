"""Run by tests/loader/strict/test_exec_allowlist.py in a fresh process: install a bundle (NOJIT_MODE from the environment), then
start gcc in every form the audit hook cannot see, and print which of them made their output file.

    probe_exec_forms.py BUNDLE WORKDIR

WORKDIR holds x.c, and cp/ (gcc copied as mycc, with its cc1, collect2, as and ld), ln/ (a symlink to gcc),
allowed/ (a copy of gcc named mycc and of /bin/true named mytool: NOJIT_EXEC_ALLOW names it) and gcclib (the
path of gcc's library folder: crtbegin.o, libgcc), made by the test. The orphan form starts a shell that
outlives this process and compiles two seconds later; the test looks for its output afterwards.
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys

from nojit.loader.install import install
from nojit.loader.settings import MISMATCH_FACTS

bundle, work = sys.argv[1], sys.argv[2]
GCC = "/usr/bin/gcc"
src = os.path.join(work, "x.c")


def out(name: str) -> str:
    return os.path.join(work, f"out_{name}")


libc = ctypes.CDLL(None, use_errno=True)
libc.execv.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_char_p)]
libc.posix_spawn.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p)]


def cargv(*words: str):
    arr = (ctypes.c_char_p * (len(words) + 1))(*[w.encode() for w in words], None)
    return arr


def c_system(command: str) -> None:
    libc.system(command.encode())


def c_fork_execv() -> None:
    argv = cargv(GCC, "-S", src, "-o", out("c_fork_execv"))
    pid = libc.fork()
    if pid == 0:
        libc.execv(GCC.encode(), argv)
        libc._exit(127)
    os.waitpid(pid, 0)


def c_posix_spawn() -> None:
    pid = ctypes.c_int(0)
    env = cargv(*[f"{k}={v}" for k, v in os.environ.items()])
    if libc.posix_spawn(ctypes.byref(pid), GCC.encode(), None, None, cargv(GCC, "-S", src, "-o", out("c_posix_spawn")),
                        env) == 0:
        os.waitpid(pid.value, 0)


def py_child_execv() -> None:
    code = f"import os; os.execv({GCC!r}, [{GCC!r}, '-S', {src!r}, '-o', {out('py_child_execv')!r}])"
    subprocess.run([sys.executable, "-c", code], capture_output=True)


def ld_so_cc1() -> None:
    """The dynamic loader runs cc1 as a library it maps (not an exec): outside what Landlock checks."""
    import glob

    loader = (glob.glob("/lib64/ld-linux-*.so.*") + glob.glob("/lib/ld-linux-*.so.*"))[:1]
    cc1 = glob.glob("/usr/lib/gcc/*/*/cc1")[:1]
    if loader and cc1:
        c_system(f"{loader[0]} {cc1[0]} -quiet {src} -o {out('ld_so_cc1')} 2>/dev/null")


gcclib = open(os.path.join(work, "gcclib")).read().strip()
inst = install(bundle, kernels=set(), allow_mismatch=frozenset(MISMATCH_FACTS))
forms = {
    "c_system_abs": lambda: c_system(f"{GCC} -S {src} -o {out('c_system_abs')} 2>/dev/null"),
    "c_fork_execv": c_fork_execv,
    "c_posix_spawn": c_posix_spawn,
    "py_child_execv": py_child_execv,
    "shell_variable": lambda: c_system(f"x={GCC}; $x -S {src} -o {out('shell_variable')} 2>/dev/null"),
    "shell_glob": lambda: c_system(f"/usr/bin/gc? -S {src} -o {out('shell_glob')} 2>/dev/null"),
    # a whole copied toolchain (driver, cc1, as, collect2, ld) builds and links a program; gcc's own folder only
    # gives crtbegin.o and libgcc
    "copied_gcc_as_ld": lambda: c_system(f"{work}/cp/mycc -B {work}/cp/ -B {gcclib}/ -fno-use-linker-plugin {src} "
                                         f"-o {out('copied_gcc_as_ld')} 2>/dev/null"),
    "symlinked_gcc": lambda: c_system(f"{work}/ln/mycc -S {src} -o {out('symlinked_gcc')} 2>/dev/null"),
    # the copy itself is refused (identity by content): it cannot even answer -dumpversion
    "copy_in_allowed_folder": lambda: c_system(f"v=$({work}/allowed/mycc -dumpversion 2>/dev/null) && [ -n \"$v\" ] && "
                                               f"echo $v > {out('copy_in_allowed_folder')}"),
    "ld_so_cc1": ld_so_cc1,
}
for form in forms.values():
    try:
        form()
    except OSError:  # refused before it started (the exec guard without Landlock): it made no file
        pass
results = {name: os.path.exists(out(name)) for name in forms}
tool = subprocess.run([f"{work}/allowed/mytool"], capture_output=True).returncode if os.path.exists(
    f"{work}/allowed/mytool") else None
# the orphan: a shell in its own session that compiles after this process has exited, by name and by path
c_system(f"setsid sh -c 'sleep 2; gcc -S {src} -o {out('orphan_by_name')}; "
         f"{GCC} -S {src} -o {out('orphan_by_path')}' >/dev/null 2>&1 < /dev/null &")
from nojit.loader.strict import landlock

child = subprocess.run([sys.executable, "-c", "from nojit.loader.strict import landlock; print(landlock.enforce(None, None).state)"],
                       capture_output=True, text=True).stdout.strip()  # a spawned child inherits, stacks nothing

from nojit.loader.strict import exec_guard

r = landlock.report()
eg = exec_guard.report()
print("RESULT " + json.dumps({"compiled": results, "allowed_tool_exit": tool, "mode": inst.mode.value, "child": child,
                              "exec_guard": None if eg is None else eg.summary(),
                              "landlock": None if r is None else {"state": r.state, "abi": r.abi, "rules": r.rules,
                                                                  "ms": r.ms, "tsync": r.tsync, "steps": r.steps}}),
      flush=True)
