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


def read_or_none(path: str) -> bytes | None:
    """A compiler's bytes, or None where this process may not read them (strict mode: unreadable.py)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except PermissionError:
        return None


def memfd_copy(path: str) -> int:
    data = read_or_none(path)
    if data is None:
        return -1
    fd = libc.memfd_create(b"notacompiler", 0)
    os.write(fd, data)
    return fd


def memfd_execveat(source: str = cc1, name: str = "memfd_execveat") -> None:
    fd = memfd_copy(source)
    if fd >= 0:
        in_child(lambda: execveat(fd, "", cc1_args(name), AT_EMPTY_PATH))
        os.close(fd)


def memfd_proc_path() -> None:
    fd = memfd_copy(cc1)
    if fd >= 0:
        in_child(lambda: libc.execv(f"/proc/self/fd/{fd}".encode(), cargv(*cc1_args("memfd_proc_path"))))
        os.close(fd)


def ld_so() -> str | None:
    import glob

    found = glob.glob("/lib64/ld-linux-*.so.*") + glob.glob("/lib/ld-linux-*.so.*")
    return found[0] if found else None


def ld_so_cc1() -> None:
    """The dynamic loader (an allowed program) maps cc1 as its program: Landlock checks the exec of ld.so only."""
    if ld_so():
        libc.system(f"{ld_so()} {cc1} -quiet {src} -o {out('ld_so_cc1')} 2>/dev/null".encode())


def stashed() -> str | None:
    """cc1's bytes copied by a process outside the strict tree (this user's other login, a download) to a file
    nojit never searched: bytes from elsewhere than the installed compilers."""
    target = os.path.join(work, f"stash-{os.getpid()}")
    outside("copy", cc1, target, as_other=False)
    return target if os.path.exists(target) else None


def stash_ld_so() -> None:
    target = stashed()
    if target and ld_so():
        libc.system(f"{ld_so()} {target} -quiet {src} -o {out('stash_ld_so')} 2>/dev/null".encode())


def stash_memfd() -> None:
    target = stashed()
    if target:
        memfd_execveat(target, "stash_memfd")


def fd_of_cc1_execveat() -> None:
    try:
        fd = os.open(cc1, os.O_RDONLY)
    except PermissionError:  # strict mode: compilers are unreadable too; a path descriptor needs no read right
        fd = os.open(cc1, os.O_PATH)
    in_child(lambda: execveat(fd, "", cc1_args("fd_of_cc1_execveat"), AT_EMPTY_PATH))
    os.close(fd)


def opath_of_cc1_proc() -> None:
    fd = os.open(cc1, os.O_PATH)
    in_child(lambda: libc.execv(f"/proc/self/fd/{fd}".encode(), cargv(*cc1_args("opath_of_cc1_proc"))))
    os.close(fd)


def raw_syscall_execve() -> None:
    """gcc through the execve system call itself, no libc wrapper (what the exec guard cannot see without Landlock)."""
    SYS_EXECVE = 59
    env = cargv(*[f"{k}={v}" for k, v in os.environ.items()])
    args = cargv("/usr/bin/gcc", "-S", src, "-o", out("raw_syscall_execve"))
    in_child(lambda: libc.syscall(ctypes.c_long(SYS_EXECVE), b"/usr/bin/gcc", args, env))


def deleted_copy_proc_fd() -> None:
    """cc1 copied to work/ by a process outside the tree, opened, deleted, then run as /proc/self/fd/N."""
    target = os.path.join(work, f"deleted-{os.getpid()}")
    outside("copy", cc1, target, as_other=False)
    if not os.path.exists(target):
        return
    fd = os.open(target, os.O_RDONLY)
    os.unlink(target)
    in_child(lambda: libc.execv(f"/proc/self/fd/{fd}".encode(), cargv(*cc1_args("deleted_copy_proc_fd"))))
    os.close(fd)


def uring_read_cc1() -> None:
    """cc1 opened and read through io_uring (IORING_OP_OPENAT, IORING_OP_READ: work done by the kernel's io-wq
    workers, not by a system call of this thread), by allowed/uring_open, which the test compiled."""
    tool = os.path.join(work, "allowed", "uring_open")
    if os.path.exists(tool):
        subprocess.run([tool, cc1, out("uring_read_cc1")], capture_output=True)


def read_ptx_jit_library() -> None:
    """A child that never installs nojit opens the driver's PTX JIT library (REDTEAM_PTXJIT, a stand-in file the test
    planted in LD_LIBRARY_PATH): what libcuda does before it JIT-compiles PTX."""
    path = os.environ.get("REDTEAM_PTXJIT", "")
    child = f"open({path!r}, 'rb').read(4); open({out('read_ptx_jit_library')!r}, 'w').close()"
    if path:
        subprocess.run([sys.executable, "-S", "-c", child], capture_output=True, env={"PATH": "/usr/bin:/bin"})


def writable_tree() -> str | None:
    """A folder of this Python environment (a venv the test made, as a serving user owns its venv) that the
    allow-list lets run as a whole tree and this user can write; system folders are never written to."""
    from nojit.loader.strict import landlock

    r = landlock.report()
    if r is None or r.plan is None:  # no allow-list (permissive): the environment itself, for the control
        return sys.prefix if os.access(sys.prefix, os.W_OK) else None
    for folder in r.plan.folders:
        if (folder + os.sep).startswith(sys.prefix + os.sep) and os.access(folder, os.W_OK):
            return folder
    return None


def copy_after_install() -> None:
    folder = writable_tree()
    if folder is None:
        return
    target = os.path.join(folder, f"nojit-redteam-{os.getpid()}")
    data = read_or_none(cc1)
    if data is None:
        return
    with open(target, "wb") as f:
        f.write(data)
    os.chmod(target, 0o755)
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
    data = read_or_none(cc1)
    if data is None:
        return
    with open(tool, "r+b") as t:
        t.truncate(0)
        t.write(data)
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


def _outside_helper() -> tuple[int, int]:
    """A process forked before install, so outside the strict tree (as another user's login is, or this user's
    other shell): it copies or rewrites files when asked, after install, as the second user (REDTEAM_UID, made by
    the test) or as this user. (write fd for requests, read fd for answers)"""
    req_r, req_w = os.pipe()
    ans_r, ans_w = os.pipe()
    if os.fork() == 0:
        os.close(req_w)
        os.close(ans_r)
        with os.fdopen(req_r) as requests:
            for line in requests:
                op, source, target, other = json.loads(line)
                pid = os.fork()
                if pid == 0:
                    try:
                        uid = int(os.environ.get("REDTEAM_UID", "-1"))
                        if other and uid >= 0:
                            os.setgroups([])
                            os.setgid(int(os.environ.get("REDTEAM_GID", uid)))
                            os.setuid(uid)
                        with open(source, "rb") as f:
                            data = f.read()
                        with open(target, "r+b" if op == "rewrite" else "wb") as t:
                            t.truncate(0)
                            t.write(data)
                        if op == "copy":
                            os.chmod(target, 0o755)
                    finally:
                        os._exit(0)
                os.waitpid(pid, 0)
                os.write(ans_w, b"k")
        os._exit(0)
    os.close(req_r)
    os.close(ans_w)
    return req_w, ans_r


def outside(op: str, source: str, target: str, as_other: bool = True) -> None:
    """`op` ("copy" or "rewrite") done by the helper outside the strict tree, waited for."""
    if as_other and int(os.environ.get("REDTEAM_UID", "-1")) < 0:
        return
    os.write(_helper[0], (json.dumps([op, source, target, as_other]) + "\n").encode())
    os.read(_helper[1], 1)


def others_file_in_allowed() -> None:
    """allowed/theirs, a tool of the second user in a folder of root's: they rewrite it as cc1 after install."""
    tool = os.path.join(work, "allowed", "theirs")
    if not os.path.exists(tool):
        return
    outside("rewrite", cc1, tool)
    libc.system(f"{tool} -quiet {src} -o {out('others_file_in_allowed')} 2>/dev/null".encode())


def others_folder_in_tree() -> None:
    """<venv>/theirs, a folder of the second user inside a whole-tree root: they put cc1 there after install."""
    folder = os.path.join(sys.prefix, "theirs")
    if not os.path.isdir(folder):
        return
    outside("copy", cc1, os.path.join(folder, "tool"))
    libc.system(f"{folder}/tool -quiet {src} -o {out('others_folder_in_tree')} 2>/dev/null".encode())


def renamed_copy_in_tree() -> None:
    """<venv>/pre/mycc, cc1 copied under another name before install by the test (this user, before the start):
    the venv gets one whole-tree rule, and only folders holding a compiler by name are checked file by file."""
    tool = os.path.join(sys.prefix, "pre", "mycc")
    if os.path.exists(tool):
        libc.system(f"{tool} -quiet {src} -o {out('renamed_copy_in_tree')} 2>/dev/null".encode())


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


_UNDO = r"""
import ctypes, glob, os, sys
import nvidia.cu13
from nojit.loader.strict import inprocess_guard
lib = os.path.join(list(nvidia.cu13.__path__)[0], "lib")
link = ctypes.CDLL(sorted(glob.glob(os.path.join(lib, "libnvJitLink.so.*")))[0])
rtc = ctypes.CDLL(sorted(glob.glob(os.path.join(lib, "libnvrtc.so.*")))[0])
inprocess_guard.deactivate()  # what code in the process can do: the patched entries are its own memory
"""


def undo_guards_nvjitlink() -> None:
    """Code in the serving process puts the patched entries back, then links PTX with nvJitLink (run alone: it
    leaves this process unguarded)."""
    import importlib.util

    if importlib.util.find_spec("nvidia") is None:
        return
    exec(compile(_UNDO + _NVJITLINK_CHILD.replace("sys.argv[1]", repr(out("undo_guards_nvjitlink"))), "undo", "exec"),
         {})


def undo_guards_nvrtc() -> None:
    """The same, then NVRTC: its builtins stay unreadable (Landlock), so the compile still fails."""
    import importlib.util

    if importlib.util.find_spec("nvidia") is None:
        return
    ns: dict = {}
    exec(compile(_UNDO, "undo", "exec"), ns)
    rtc, prog = ns["rtc"], ctypes.c_void_p()
    rtc.nvrtcCreateProgram(ctypes.byref(prog), b'extern "C" __global__ void k() {}', b"k.cu", 0, None, None)
    if rtc.nvrtcCompileProgram(prog, 1, (ctypes.c_char_p * 1)(b"-arch=sm_90")) == 0:
        open(out("undo_guards_nvrtc"), "w").close()


def gcc_abs() -> None:
    libc.system(f"/usr/bin/gcc -S {src} -o {out('gcc_abs')} 2>/dev/null".encode())


def ld_so_gcc_driver() -> None:
    """The dynamic loader maps the driver; the driver then execs cc1 (refused) -- only the driver runs."""
    loader = [ld_so()] if ld_so() else []
    if loader:
        libc.system(f"{loader[0]} /usr/bin/gcc -dumpversion > {out('ld_so_gcc_driver')}.txt 2>/dev/null; "
                    f"[ -s {out('ld_so_gcc_driver')}.txt ] && mv {out('ld_so_gcc_driver')}.txt "
                    f"{out('ld_so_gcc_driver')}".encode())


import threading

_go = threading.Event()


def _early() -> None:
    _go.wait(600)
    libc.system(f"/usr/bin/gcc -S {src} -o {out('thread_before_install')} 2>/dev/null".encode())


_helper = _outside_helper()  # before the thread below and before install
_early_thread = threading.Thread(target=_early, name="redteam-early", daemon=True)
_early_thread.start()  # before install: README says such a thread is outside the allow-list without TSYNC


def thread_before_install() -> None:
    _go.set()
    _early_thread.join(600)


inst = install(bundle, kernels=set(), allow_mismatch=frozenset(MISMATCH_FACTS))
forms = {name: fn for name, fn in list(globals().items())
         if name in ("memfd_execveat", "memfd_proc_path", "fd_of_cc1_execveat", "opath_of_cc1_proc",
                     "copy_after_install", "hardlink_after_install", "overwrite_allowed_file", "shebang_gcc",
                     "spawnp_reset_path", "ld_so_gcc_driver", "ld_so_cc1", "raw_syscall_execve", "deleted_copy_proc_fd",
                     "uring_read_cc1", "read_ptx_jit_library", "stash_ld_so", "stash_memfd", "gcc_abs",
                     "others_file_in_allowed", "others_folder_in_tree", "renamed_copy_in_tree", "child_nvrtc",
                     "undo_guards_nvjitlink", "undo_guards_nvrtc", "child_nvjitlink", "thread_before_install")}
only = os.environ.get("REDTEAM_FORMS")
forms = {n: f for n, f in forms.items()  # the undo forms leave the process unguarded: only when named
         if (n in only.split(",") if only else not n.startswith("undo_"))}
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
                              "summary": None if r is None else r.summary(),
                              "compilers_unreadable": [] if r is None else r.compilers_unreadable}), flush=True)
