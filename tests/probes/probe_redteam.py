"""Run by tests/loader/strict/test_redteam.py in a fresh process: install a bundle (NOJIT_MODE from the environment, Landlock on
as in production), then try the red-team forms of issue 21's strict mode on the exec side, and print which of them
ran a compiler (cc1 turning x.c into assembly, or gcc answering -dumpversion).

    probe_redteam.py BUNDLE WORKDIR

WORKDIR holds x.c, cc1 (the path of gcc's cc1) and allowed/ (NOJIT_EXEC_ALLOW: /bin/true copied as `tool` and a
script `script` whose `#!` line names gcc), made by the test.
"""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys

from nojit.loader.install import install
from nojit.loader.settings import MISMATCH_FACTS

bundle, work = sys.argv[1], sys.argv[2]
src = os.path.join(work, "x.c")
cc1 = open(os.path.join(work, "cc1")).read().strip()
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_EXECVEAT, AT_EMPTY_PATH, MFD_CLOEXEC = 322, 0x1000, 1


def out(name: str) -> str:
    return os.path.join(work, f"out_{name}")


def cargv(*words: str):
    return (ctypes.c_char_p * (len(words) + 1))(*[w.encode() for w in words], None)


def cc1_args(name: str) -> list[str]:
    return ["cc1", "-quiet", src, "-o", out(name)]


def in_child(fn) -> None:
    """fn() in a forked child (C fork, no Python exec event), waited for."""
    pid = libc.fork()
    if pid == 0:
        try:
            fn()
        finally:
            libc._exit(127)
    os.waitpid(pid, 0)


def execveat(fd: int, path: str, args: list[str], flags: int) -> None:
    env = cargv(*[f"{k}={v}" for k, v in os.environ.items()])
    libc.syscall(ctypes.c_long(SYS_EXECVEAT), ctypes.c_int(fd), path.encode(), cargv(*args), env, ctypes.c_int(flags))


def memfd_copy(path: str) -> int:
    fd = libc.memfd_create(b"notacompiler", 0)
    with open(path, "rb") as f:
        os.write(fd, f.read())
    return fd


def memfd_execveat() -> None:
    fd = memfd_copy(cc1)
    in_child(lambda: execveat(fd, "", cc1_args("memfd_execveat"), AT_EMPTY_PATH))
    os.close(fd)


def memfd_proc_path() -> None:
    fd = memfd_copy(cc1)
    in_child(lambda: libc.execv(f"/proc/self/fd/{fd}".encode(), cargv(*cc1_args("memfd_proc_path"))))
    os.close(fd)


def fd_of_cc1_execveat() -> None:
    fd = os.open(cc1, os.O_RDONLY)
    in_child(lambda: execveat(fd, "", cc1_args("fd_of_cc1_execveat"), AT_EMPTY_PATH))
    os.close(fd)


def opath_of_cc1_proc() -> None:
    fd = os.open(cc1, os.O_PATH)
    in_child(lambda: libc.execv(f"/proc/self/fd/{fd}".encode(), cargv(*cc1_args("opath_of_cc1_proc"))))
    os.close(fd)


def writable_tree() -> str | None:
    """A folder of this Python environment (a venv the test made, as a serving user owns its venv) that the
    allow-list lets run as a whole tree and this user can write; system folders are never written to."""
    from nojit.loader.strict import landlock

    r = landlock.report()
    for folder in (r.plan.folders if r and r.plan else []):
        if (folder + os.sep).startswith(sys.prefix + os.sep) and os.access(folder, os.W_OK):
            return folder
    return None


def copy_after_install() -> None:
    folder = writable_tree()
    if folder is None:
        return
    target = os.path.join(folder, f"nojit-redteam-{os.getpid()}")
    shutil.copy(cc1, target)
    try:
        libc.system(f"{target} -quiet {src} -o {out('copy_after_install')} 2>/dev/null".encode())
    finally:
        os.unlink(target)


def hardlink_after_install() -> None:
    folder = writable_tree()
    if folder is None:
        return
    target = os.path.join(folder, f"nojit-redteam-ln-{os.getpid()}")
    try:
        os.link(os.path.realpath(cc1), target)
    except OSError:
        return  # another file system
    try:
        libc.system(f"{target} -quiet {src} -o {out('hardlink_after_install')} 2>/dev/null".encode())
    finally:
        os.unlink(target)


def overwrite_allowed_file() -> None:
    """allowed/tool was /bin/true when the rule was made; the rule is on its inode, whatever it holds later."""
    tool = os.path.join(work, "allowed", "tool")
    with open(cc1, "rb") as f, open(tool, "r+b") as t:
        t.truncate(0)
        t.write(f.read())
    libc.system(f"{tool} -quiet {src} -o {out('overwrite_allowed_file')} 2>/dev/null".encode())


def shebang_gcc() -> None:
    script = os.path.join(work, "allowed", "script")
    libc.system(f"{script} > {out('shebang_gcc')}.txt 2>/dev/null; "
                f"[ -s {out('shebang_gcc')}.txt ] && mv {out('shebang_gcc')}.txt {out('shebang_gcc')}".encode())


def spawnp_reset_path() -> None:
    """posix_spawnp by name with an environment whose PATH skips the stand-ins."""
    pid = ctypes.c_int(0)
    args = cargv("gcc", "-S", src, "-o", out("spawnp_reset_path"))
    if libc.posix_spawnp(ctypes.byref(pid), b"gcc", None, None, args, cargv("PATH=/usr/bin:/bin")) == 0:
        os.waitpid(pid.value, 0)


def as_other_user(fn) -> None:
    """fn() in a child that became the second user (REDTEAM_UID, made by the test): what that user does later."""
    uid = int(os.environ.get("REDTEAM_UID", "-1"))
    if uid < 0:
        return
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(int(os.environ.get("REDTEAM_GID", uid)))
            os.setuid(uid)
            fn()
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def others_file_in_allowed() -> None:
    """allowed/theirs, a tool of the second user in a folder of root's: they rewrite it as cc1 after install."""
    tool = os.path.join(work, "allowed", "theirs")
    if not os.path.exists(tool):
        return

    def rewrite() -> None:
        with open(cc1, "rb") as f, open(tool, "r+b") as t:
            t.truncate(0)
            t.write(f.read())

    as_other_user(rewrite)
    libc.system(f"{tool} -quiet {src} -o {out('others_file_in_allowed')} 2>/dev/null".encode())


def others_folder_in_tree() -> None:
    """<venv>/theirs, a folder of the second user inside a whole-tree root: they put cc1 there after install."""
    folder = os.path.join(sys.prefix, "theirs")
    if not os.path.isdir(folder):
        return
    as_other_user(lambda: shutil.copy(cc1, os.path.join(folder, "tool")))
    libc.system(f"{folder}/tool -quiet {src} -o {out('others_folder_in_tree')} 2>/dev/null".encode())


def child_nvrtc() -> None:
    """A Python child that never installs nojit compiles CUDA C++ with a ctypes-loaded libnvrtc: the in-process
    guards are per process, and Landlock checks only exec (tests/probes/probe_inprocess_compilers.py, its unguarded form)."""
    import importlib.util

    if importlib.util.find_spec("nvidia") is None:
        return
    probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_inprocess_compilers.py")
    p = subprocess.run([sys.executable, probe, "nvrtc-ctypes", "off"], capture_output=True, text=True)
    try:
        sm = json.loads(p.stdout.strip().splitlines()[-1])["result"]["sm"]
    except (IndexError, ValueError, KeyError):
        return
    if sm == 90:
        open(out("child_nvrtc"), "w").close()


_NVJITLINK_CHILD = r"""
import ctypes, glob, os, sys
import nvidia.cu13
lib = ctypes.CDLL(sorted(glob.glob(os.path.join(list(nvidia.cu13.__path__)[0], "lib", "libnvJitLink.so.*")))[0])
ptx = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k(.param .u64 x) { ret; }\n"
handle = ctypes.c_void_p()
lib.nvJitLinkCreate(ctypes.byref(handle), 1, (ctypes.c_char_p * 1)(b"-arch=sm_90"))
if lib.nvJitLinkAddData(handle, 2, ptx, len(ptx), b"k.ptx") == 0 and lib.nvJitLinkComplete(handle) == 0:
    size = ctypes.c_size_t()
    lib.nvJitLinkGetLinkedCubinSize(handle, ctypes.byref(size))
    buf = ctypes.create_string_buffer(size.value)
    lib.nvJitLinkGetLinkedCubin(handle, buf)
    if buf.raw[:4] == b"\x7fELF":
        open(sys.argv[1], "w").close()
"""


def child_nvjitlink() -> None:
    """A Python child that never installs nojit links hand-written PTX to an sm_90 cubin with a ctypes-loaded
    nvJitLink (torch needs that library: libcusparse links it, so Landlock cannot make it unreadable)."""
    import importlib.util

    if importlib.util.find_spec("nvidia") is None:
        return
    subprocess.run([sys.executable, "-c", _NVJITLINK_CHILD, out("child_nvjitlink")], capture_output=True)


def gcc_abs() -> None:
    libc.system(f"/usr/bin/gcc -S {src} -o {out('gcc_abs')} 2>/dev/null".encode())


def ld_so_gcc_driver() -> None:
    """The dynamic loader maps the driver; the driver then execs cc1 (refused) -- only the driver runs."""
    import glob

    loader = (glob.glob("/lib64/ld-linux-*.so.*") + glob.glob("/lib/ld-linux-*.so.*"))[:1]
    if loader:
        libc.system(f"{loader[0]} /usr/bin/gcc -dumpversion > {out('ld_so_gcc_driver')}.txt 2>/dev/null; "
                    f"[ -s {out('ld_so_gcc_driver')}.txt ] && mv {out('ld_so_gcc_driver')}.txt "
                    f"{out('ld_so_gcc_driver')}".encode())


import threading

_go = threading.Event()


def _early() -> None:
    _go.wait(600)
    libc.system(f"/usr/bin/gcc -S {src} -o {out('thread_before_install')} 2>/dev/null".encode())


_early_thread = threading.Thread(target=_early, name="redteam-early", daemon=True)
_early_thread.start()  # before install: README says such a thread is outside the allow-list without TSYNC


def thread_before_install() -> None:
    _go.set()
    _early_thread.join(600)


inst = install(bundle, kernels=set(), allow_mismatch=frozenset(MISMATCH_FACTS))
forms = {name: fn for name, fn in list(globals().items())
         if name in ("memfd_execveat", "memfd_proc_path", "fd_of_cc1_execveat", "opath_of_cc1_proc",
                     "copy_after_install", "hardlink_after_install", "overwrite_allowed_file", "shebang_gcc",
                     "spawnp_reset_path", "ld_so_gcc_driver", "gcc_abs",
                     "others_file_in_allowed", "others_folder_in_tree", "child_nvrtc", "child_nvjitlink",
                     "thread_before_install")}
only = os.environ.get("REDTEAM_FORMS")
forms = {n: f for n, f in forms.items() if not only or n in only.split(",")}
errors = {}
for name, fn in forms.items():
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - a form that raises did not compile; say why
        errors[name] = f"{type(exc).__name__}: {exc}"[:300]
from nojit.loader.strict import landlock

r = landlock.report()
print("RESULT " + json.dumps({"compiled": {n: os.path.exists(out(n)) for n in forms}, "errors": errors,
                              "mode": inst.mode.value, "tree": writable_tree(),
                              "landlock": None if r is None else r.state, "tsync": r is not None and r.tsync,
                              "summary": None if r is None else r.summary()}), flush=True)
