"""Strict mode's execution allow-list, enforced by the kernel (Linux Landlock, ABI 1 and later).

The audit hook (guards.py) sees only Python's own process calls and the stand-ins (firewall.py)
only names looked up through PATH. A compiler started by absolute path from C (`system`, `execv`,
`posix_spawn`), by a shell form no parser follows (`x=/usr/bin/gcc; $x`, `/usr/bin/gc?`), a copy
or a link of it under another name, or a child that outlives this process: the kernel refuses all
of them once `enforce()` ran. It handles EXECUTE (checked at execve for the program, its ELF
interpreter and a `#!` interpreter; not for dlopen or mmap of libraries) and READ_FILE, allowed
everywhere but at the compilers and NVRTC's builtins (unreadable.py: the dynamic loader maps a
compiler it can read, and a memfd holding its bytes is never checked). EXECUTE is allowed only beneath:
- the system folders executables live in (/usr/bin, /usr/sbin, /usr/lib, /usr/libexec, /usr/lib64,
  /usr/local/{bin,sbin,lib,libexec}) and the Python environment's prefixes, each only if no other
  user can write it or a folder above it (a sticky folder such as /tmp may hold one of ours);
- the Python interpreter and the private runtime folder's stand-in script;
- the folders named by NOJIT_EXEC_ALLOW (their files, not subfolders), under the same checks.
A folder that holds a compiler (compilers.py: by name, inode, or size and content) gets one rule per
file that is not a compiler, and its parent folders are listed the same way; every other folder gets
one rule for its whole tree. Nothing else (/tmp, /dev/shm, /var/tmp, ...) can be executed.
The domain is inherited by every child and cannot be lifted, so an orphan is restricted too. Any Landlock domain
also refuses to rename or link a file into another folder (EXDEV, Landlock's REFER right, never granted here).

`landlock_restrict_self` restricts the calling thread and what it creates later; threads that exist
already stay unrestricted unless the kernel has LANDLOCK_RESTRICT_SELF_TSYNC (ABI 8), which is used
when present. `enforce()` runs in install(), which vLLM's plugin calls before the model, the
executor and their threads exist. The pytest process exempts itself (tests/conftest.py): its later
tests build with gcc and nvcc.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import stat
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from nojit.loader.strict import compilers as compilers_mod
from nojit.loader.strict import driver_jit, nvrtc_builtins, unreadable as unreadable_mod
from nojit.loader.errors import NoJitError
from nojit.loader.settings import settings

ACCESS_FS_EXECUTE = 1 << 0
ACCESS_FS_READ_FILE = 1 << 2  # handled when files are made unreadable (unreadable.py: compilers, NVRTC builtins)
RULE_PATH_BENEATH = 1
CREATE_RULESET_VERSION = 1 << 0
RESTRICT_SELF_TSYNC = 1 << 3  # ABI 8: every thread of the process, not only the caller
PR_SET_NO_NEW_PRIVS = 38
_SYSCALLS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}  # create_ruleset, add_rule, restrict_self

SYSTEM_ROOTS = ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib32", "/usr/lib64", "/usr/libexec", "/usr/local/bin",
                "/usr/local/sbin", "/usr/local/lib", "/usr/local/libexec")
CACHE_VERSION = 2  # 2: files another user can write are left out
ACTIVE_ENV = "NOJIT_LANDLOCK_ACTIVE"  # set when enforced: a child (inheriting the domain) does not stack another


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


@dataclass
class Plan:
    """The rules: folders whose whole tree may be executed, single files that may, what was left out and why."""

    folders: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    refused_compilers: list[str] = field(default_factory=list)  # files left out because they are compilers
    unsafe: list[str] = field(default_factory=list)  # roots left out: another user can write them
    listed: dict[str, list[int]] = field(default_factory=dict)  # folder listed -> _stamp (the cache's key)
    file_stats: dict[str, list[int]] = field(default_factory=dict)  # every file and folder ruled on -> _stamp
    from_cache: bool = False


@dataclass
class Report:
    """What `enforce()` did in this process, for the startup line and tests."""

    state: str  # "on" | "inherited" | "unavailable" | "off" | "exempt"
    abi: int | None = None
    rules: int = 0
    ms: float = 0.0
    tsync: bool = False
    threads_before: int = 0  # threads that existed when the domain was applied (unrestricted without TSYNC)
    other_threads: tuple[str, ...] = ()  # their names (/proc/self/task/*/comm), this thread left out
    reason: str = ""
    plan: Plan | None = None
    unreadable: list[str] = field(default_factory=list)  # NVRTC builtins no process of the tree can read
    kept_readable: list[str] = field(default_factory=list)  # copies left readable, with why
    compilers_unreadable: list[str] = field(default_factory=list)  # compilers no process of the tree can read
    compilers_readable: list[str] = field(default_factory=list)  # compilers left readable, with why
    ptx_jit_unreadable: list[str] = field(default_factory=list)  # the driver's PTX JIT library (opt-in), unreadable
    steps: dict[str, float] = field(default_factory=dict)  # ms: find (compilers by name), plan, read (rules), apply

    def summary(self) -> str:
        if self.state == "on":
            threads = ("all threads" if self.tsync or self.threads_before <= 1
                       else f"{self.threads_before - 1} earlier threads not covered: {', '.join(self.other_threads)}")
            builtins = (f"; NVRTC builtins unreadable ({len(self.unreadable)} copies)" if self.unreadable else "")
            if self.kept_readable:
                builtins += f"; NVRTC builtins left readable: {', '.join(self.kept_readable)}"
            builtins += f"; {len(self.compilers_unreadable)} compilers unreadable"
            if self.ptx_jit_unreadable:
                builtins += f"; the driver's PTX JIT library unreadable ({len(self.ptx_jit_unreadable)} copies)"
            if self.compilers_readable:
                builtins += (f" ({len(self.compilers_readable)} left readable, so the dynamic loader can run them: "
                             f"{', '.join(self.compilers_readable[:3])}{' ...' if len(self.compilers_readable) > 3 else ''})")
            return (f"exec allow-list on (Landlock ABI {self.abi}, {self.rules} rules, {self.ms:.0f} ms, "
                    f"{threads}){builtins}")
        if self.state == "inherited":
            return "exec allow-list inherited from the parent process"
        return f"exec allow-list {self.state}" + (f" ({self.reason})" if self.reason else "")


_report: Report | None = None
_exempt_pid: int | None = None


def exempt_this_process() -> None:
    """This process never restricts itself (the test runner: its later tests run gcc and nvcc). Children do."""
    global _exempt_pid
    _exempt_pid = os.getpid()


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def abi_version() -> int | None:
    """The kernel's Landlock ABI version, or None where there is none (another OS, gVisor, an old kernel, off)."""
    numbers = _SYSCALLS.get(platform.machine())
    if sys.platform != "linux" or numbers is None:
        return None
    v = _libc().syscall(ctypes.c_long(numbers[0]), None, ctypes.c_size_t(0), ctypes.c_uint32(CREATE_RULESET_VERSION))
    return int(v) if v > 0 else None


def writable_by_others(path: str) -> str | None:
    """The first folder on `path` (resolved) another user could write or replace, or None: every folder must
    belong to root or this user and not be group/other-writable, except a sticky folder (/tmp) above one of ours."""
    real = os.path.realpath(path)
    me = os.getuid()
    parts = real.split(os.sep)
    for i in range(1, len(parts) + 1):
        current = os.sep.join(parts[:i]) or os.sep
        try:
            st = os.lstat(current)
        except OSError:
            return current
        if st.st_uid not in (0, me):
            return current
        if st.st_mode & 0o022 and not (st.st_mode & stat.S_ISVTX and i < len(parts)):
            return current
    return None


def plan(comp: compilers_mod.Compilers, roots: Sequence[str], extra_folders: Sequence[str] = (),
         extra_files: Sequence[str] = ()) -> Plan:
    """The rules for these roots: one per folder tree without a compiler, one per non-compiler file elsewhere."""
    p = Plan()
    below = set()  # every folder that holds a compiler, and the folders above it
    for folder in comp.folders:
        d = folder
        while d not in below and d != os.sep:
            below.add(d)
            d = os.path.dirname(d)
    done: set[str] = set()
    for root in roots:
        real = os.path.realpath(root)
        if real in done or not os.path.isdir(real):
            continue
        done.add(real)
        bad = writable_by_others(real)
        if bad is not None:
            p.unsafe.append(f"{real} ({bad})")
            continue
        _plan_folder(comp, real, below, p)
    for folder in extra_folders:
        real = os.path.realpath(folder)
        if real in done:
            continue
        done.add(real)
        _plan_files(comp, real, p)
    for f in extra_files:
        real = os.path.realpath(f)
        if os.path.isfile(real) and real not in p.files:
            _plan_file(comp, real, os.stat(real), p)
    return p


def _stamp(st: os.stat_result) -> list[int]:
    """What a cached plan compares: ctime changes with the content, the mode, the owner and the entries."""
    return [st.st_ino, st.st_size, st.st_ctime_ns]


def _plan_folder(comp: compilers_mod.Compilers, folder: str, below: set[str], p: Plan) -> None:
    if folder not in below:
        try:
            p.file_stats[folder] = _stamp(os.stat(folder))
        except OSError:
            return
        p.folders.append(folder)
        return
    try:
        entries = list(os.scandir(folder))
        st = os.stat(folder)
    except OSError:
        return
    p.listed[folder] = _stamp(st)
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            continue  # its target gets (or lacks) a rule where it lies
        if stat.S_ISDIR(st.st_mode):
            if st.st_uid in (0, os.getuid()) and not st.st_mode & 0o022:
                _plan_folder(comp, e.path, below, p)
            else:
                p.unsafe.append(f"{e.path} ({e.path})")
        elif stat.S_ISREG(st.st_mode):
            _plan_listed_file(comp, e.path, st, p)


def _plan_files(comp: compilers_mod.Compilers, folder: str, p: Plan) -> None:
    bad = writable_by_others(folder)
    if bad is not None:
        raise NoJitError(f"NOJIT_EXEC_ALLOW names {folder}, which another user can write ({bad})",
                         fix=f"make {bad} writable only by its owner (root or this user), or remove {folder} from "
                         "NOJIT_EXEC_ALLOW")
    try:
        entries = list(os.scandir(folder))
    except OSError as exc:
        raise NoJitError(f"NOJIT_EXEC_ALLOW names {folder}, which cannot be listed ({exc.strerror})",
                         fix=f"create {folder} or remove it from NOJIT_EXEC_ALLOW") from None
    p.listed[folder] = _stamp(os.stat(folder))
    for e in entries:
        try:
            st = e.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            _plan_listed_file(comp, e.path, st, p)


def _plan_listed_file(comp: compilers_mod.Compilers, path: str, st: os.stat_result, p: Plan) -> None:
    """A file found in a listed folder: left out when another user owns it or may write it, since its rule is on
    the inode and whoever can rewrite the file chooses what runs (tests/loader/strict/test_redteam.py)."""
    if st.st_uid not in (0, os.getuid()) or st.st_mode & 0o022:
        p.file_stats[path] = _stamp(st)
        p.unsafe.append(f"{path} ({path})")
        return
    _plan_file(comp, path, st, p)


def _plan_file(comp: compilers_mod.Compilers, path: str, st: os.stat_result, p: Plan) -> None:
    p.file_stats[path] = _stamp(st)
    if comp.is_compiler(path, st):
        p.refused_compilers.append(path)
    else:
        p.files.append(path)


_PLAN_FIELDS = ("folders", "files", "refused_compilers", "unsafe", "listed", "file_stats")


def cached_plan(comp: compilers_mod.Compilers, roots: list[str], extra: list[str], files: list[str],
                cache_dir: str | None) -> Plan:
    """`plan()`, reused from <cache_dir>/exec-plan.json while the compilers, every folder it listed (inode, mtime)
    and every file it ruled on (inode, size, mtime) are unchanged: a later process stats them instead of listing
    and checking every file again."""
    safety = [writable_by_others(r) for r in (*roots, *extra)]  # a folder above a root made writable: plan again
    key = json.loads(json.dumps([CACHE_VERSION, getattr(comp, "cache_key", None), comp.files, roots, extra, safety]))
    path = os.path.join(cache_dir, "exec-plan.json") if cache_dir else None
    cached = compilers_mod.read_private_json(path)
    if cached is not None and cached.get("key") == key:
        p = Plan(**{f: cached[f] for f in _PLAN_FIELDS})
        stats = _still(p)
        if stats is not None and _could_be_planned(comp, p, [*roots, *extra], stats) and _every_entry_ruled(p):
            p.refused_compilers = _refused(comp, p, stats)
            p.from_cache = True
            return _with_files(comp, p, files)
    p = plan(comp, roots, extra)
    if path:
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                json.dump({"key": key, **{name: getattr(p, name) for name in _PLAN_FIELDS}}, f)
            os.replace(tmp, path)
        except OSError:
            pass
    return _with_files(comp, p, files)


def _with_files(comp: compilers_mod.Compilers, p: Plan, files: list[str]) -> Plan:
    """The single files (interpreter, stand-in script) on top: not cached, a bundle's stand-ins differ per toolchain."""
    for f in files:
        real = os.path.realpath(f)
        if os.path.isfile(real) and real not in p.file_stats:
            _plan_file(comp, real, os.stat(real), p)
    return p


def _could_be_planned(comp: compilers_mod.Compilers, p: Plan, tops: list[str],
                      stats: dict[str, os.stat_result] | None = None) -> bool:
    """Whether a cached plan names only what plan() could have: every folder rule and file rule lies under a root
    or an allowed folder, no folder rule holds a compiler's folder, no file rule is a compiler. The cache is this
    user's file: a process of this user that rewrote it (a folder rule on "/", a rule for gcc) gets a fresh plan,
    not a wider allow-list (tests/loader/strict/test_redteam.py)."""
    tops = [os.path.realpath(t).rstrip(os.sep) or os.sep for t in tops]

    def under(path: Any) -> bool:
        return isinstance(path, str) and any(path == t or path.startswith(t + os.sep) or t == os.sep for t in tops)

    holding = set()  # compiler folders and the folders above them: plan() lists those, never rules them whole
    for folder in comp.folders:
        while folder not in holding and folder not in (os.sep, ""):
            holding.add(folder)
            folder = os.path.dirname(folder)
    if any(not under(f) or f in holding or f == os.sep for f in p.folders):
        return False
    stats = stats or {}
    try:
        return all(under(f) and not comp.is_compiler(f, stats.get(f)) for f in p.files)
    except OSError:
        return False


def _every_entry_ruled(p: Plan) -> bool:
    """Whether every file and folder in each folder the plan listed was ruled on (allowed, refused or unsafe). The
    folders' stamps say their entries did not change since planning; this says the cached plan still names them
    all: a process of this user that deleted a compiler copy's entry from exec-plan.json would otherwise leave that
    copy readable (and so runnable through ld.so or a memfd) in the next start. Names only: no stat per entry."""
    known = {*p.file_stats, *p.listed, *(u.partition(" (")[0] for u in p.unsafe)}
    try:
        for folder in p.listed:
            with os.scandir(folder) as entries:
                for e in entries:
                    if e.path not in known and (e.is_file(follow_symlinks=False) or e.is_dir(follow_symlinks=False)):
                        return False
    except OSError:
        return False
    return True


def _refused(comp: compilers_mod.Compilers, p: Plan, stats: dict[str, os.stat_result]) -> list[str]:
    """The compilers among the files the plan ruled on, found again from the files (never read from the cache, whose
    list a process of this user can shorten): every file ruled on that is neither allowed nor unsafe."""
    ruled_out = {*p.files, *p.folders, *p.listed, *(u.partition(" (")[0] for u in p.unsafe)}
    refused = []
    for path, st in stats.items():
        if path not in ruled_out and stat.S_ISREG(st.st_mode) and comp.is_compiler(path, st):
            refused.append(path)
    return refused


def _still(p: Plan) -> dict[str, os.stat_result] | None:
    """Every folder and file of the plan as it was planned: their stats (reused by _could_be_planned, one stat
    per file a later start), or None where one changed or is gone."""
    stats: dict[str, os.stat_result] = {}
    try:
        for path, stamp in (*p.listed.items(), *p.file_stats.items()):
            st = stats[path] = os.stat(path)
            if _stamp(st) != stamp:
                return None
    except (OSError, ValueError, TypeError):
        return None
    return stats


def default_roots() -> list[str]:
    """SYSTEM_ROOTS and the Python environment's prefixes (the venv and the interpreter's installation)."""
    prefixes = (sys.prefix, sys.base_prefix, os.path.dirname(os.path.dirname(os.path.realpath(sys.executable))))
    return [*SYSTEM_ROOTS, *dict.fromkeys(prefixes)]


def extra_folders() -> list[str]:
    raw = settings.exec_allow
    return [p for p in raw.split(os.pathsep) if p] if raw else []


def apply(p: Plan, abi: int, read: Sequence[str] = ()) -> tuple[int, bool]:
    """Create the ruleset, add the rules, set no_new_privs and restrict this process; (rules added, tsync). With
    `read` (unreadable.read_rules), reading files is handled too and allowed only beneath those paths."""
    libc = _libc()
    create, add, restrict = _SYSCALLS[platform.machine()]
    attr = _RulesetAttr(ACCESS_FS_EXECUTE | (ACCESS_FS_READ_FILE if read else 0))
    ruleset = libc.syscall(ctypes.c_long(create), ctypes.byref(attr), ctypes.c_size_t(ctypes.sizeof(attr)),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise _os_error("landlock_create_ruleset", ctypes.get_errno())
    added = 0
    try:
        # the call's arguments made once: thousands of rules (the read rules) cost a ctypes conversion each otherwise
        syscall, c_add, c_ruleset = libc.syscall, ctypes.c_long(add), ctypes.c_int(ruleset)
        c_beneath, c_flags = ctypes.c_int(RULE_PATH_BENEATH), ctypes.c_uint32(0)
        flags = os.O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW
        for access, paths in ((ACCESS_FS_EXECUTE, (*p.folders, *p.files)), (ACCESS_FS_READ_FILE, read)):
            rule = _PathBeneathAttr(access, -1)
            ref = ctypes.byref(rule)
            for path in paths:
                try:
                    fd = os.open(path, flags)
                except OSError:
                    continue  # gone since it was listed (or a link): it gets no rule
                try:
                    rule.parent_fd = fd
                    if syscall(c_add, c_ruleset, c_beneath, ref, c_flags) == 0:
                        added += 1
                finally:
                    os.close(fd)
        if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise _os_error("prctl(PR_SET_NO_NEW_PRIVS)", ctypes.get_errno())
        tsync = abi >= 8
        rc = libc.syscall(ctypes.c_long(restrict), ctypes.c_int(ruleset),
                          ctypes.c_uint32(RESTRICT_SELF_TSYNC if tsync else 0))
        if rc != 0 and tsync:
            tsync = False
            rc = libc.syscall(ctypes.c_long(restrict), ctypes.c_int(ruleset), ctypes.c_uint32(0))
        if rc != 0:
            raise _os_error("landlock_restrict_self", ctypes.get_errno())
    finally:
        os.close(ruleset)
    return added, tsync


def _os_error(call: str, errno: int) -> NoJitError:
    return NoJitError(f"strict mode could not apply its exec allow-list: {call} failed ({os.strerror(errno)})",
                      fix="run where Landlock is allowed (a seccomp profile may block it), or set NOJIT_LANDLOCK=0 to "
                      "rely on the audit hook and the stand-ins alone (README, What strict mode guarantees)")


def enforce(stand_in: str | None, runtime_dir: str | None) -> Report:
    """Apply the allow-list to this process and its children once (strict mode). Never in an exempt process;
    says in one line on stderr when Landlock is unavailable."""
    global _report
    if _report is not None:
        return _report
    if os.getpid() == _exempt_pid:
        _report = Report("exempt", reason="this process exempted itself (test runner)")
        return _report
    if not settings.landlock:
        _report = Report("off", reason="NOJIT_LANDLOCK=0")
        return _report
    if _enforced_by_ancestor():
        _report = Report("inherited")
        return _report
    abi = abi_version()
    if abi is None:
        _report = Report("unavailable", reason=f"no Landlock in kernel {platform.release()}")
        if not settings.quiet:
            print(f"nojit[pid {os.getpid()}]: Landlock is not available (kernel {platform.release()}): strict mode "
                  "refuses compiler processes with the audit hook, the PATH stand-ins and libc's exec entries "
                  "(exec guard); a raw exec syscall or a path a shell builds at run time is not refused", file=sys.stderr, flush=True)
        return _report
    t = time.perf_counter()
    steps: dict[str, float] = {}
    last = t

    def step(name: str) -> None:
        nonlocal last
        now = time.perf_counter()
        steps[name] = round((now - last) * 1e3, 2)
        last = now

    comp = compilers_mod.find()
    step("find")
    files = [sys.executable] + ([stand_in] if stand_in else [])
    p = cached_plan(comp, default_roots(), extra_folders(), files, runtime_dir)
    step("plan (cached)" if p.from_cache else "plan")
    others = _other_threads()
    builtins = nvrtc_builtins.find()
    ptx_jit = driver_jit.find() if settings.unreadable_ptx_jit else []
    builtins += [c for c in ptx_jit if c not in builtins]  # said apart below; left readable in a busy folder as these
    compilers = sorted({*comp.files, *p.refused_compilers} - set(builtins))
    read, denied, kept = unreadable_mod.read_rules([*builtins, *compilers])
    step("read rules")
    added, tsync = apply(p, abi, read)
    step("apply")
    os.environ[ACTIVE_ENV] = str(os.getpid())
    _report = Report("on", abi, added, (time.perf_counter() - t) * 1e3, tsync, len(others) + 1, others, plan=p, steps=steps,
                     unreadable=[d for d in denied if d in builtins and d not in ptx_jit],
                     ptx_jit_unreadable=[d for d in denied if d in ptx_jit],
                     kept_readable=[k for k in kept if k.partition(" (below ")[0] in builtins],
                     compilers_unreadable=[d for d in denied if d not in builtins],
                     compilers_readable=[k for k in kept if k.partition(" (below ")[0] not in builtins])
    return _report


def _enforced_by_ancestor() -> bool:
    """Whether NOJIT_LANDLOCK_ACTIVE names a process this one descends from and no_new_privs is set (so the domain
    is inherited); a value copied into an unrelated process's environment is ignored."""
    raw = os.environ.get(ACTIVE_ENV, "")
    if not raw.isdigit() or not _no_new_privs():
        return False  # the enforcing process set no_new_privs, which every descendant keeps and cannot clear
    pid, target = os.getpid(), int(raw)
    for _ in range(64):
        if pid == target:
            return True
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if pid <= 1:
            return False
    return False


def _other_threads() -> tuple[str, ...]:
    me = str(threading.get_native_id())
    names = []
    try:
        for tid in os.listdir("/proc/self/task"):
            if tid != me:
                try:
                    with open(f"/proc/self/task/{tid}/comm") as f:
                        names.append(f.read().strip())
                except OSError:
                    names.append(tid)
    except OSError:
        pass
    return tuple(sorted(names))


def _no_new_privs() -> bool:
    try:
        with open("/proc/self/status") as f:
            return any(line.split() == ["NoNewPrivs:", "1"] for line in f)
    except OSError:
        return False


def report() -> Report | None:
    return _report
