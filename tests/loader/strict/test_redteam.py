"""Red team of strict mode's exec side (issue 21), each attempt written as the attack in a fresh strict-mode process
set up as the loader sets it up (tests/probes/probe_redteam.py: install() of a small real bundle, Landlock on), against a
Python environment the test makes (a venv owned by the serving user, as a deployment's often is) and, where root,
a second user made with useradd. A form compiles when cc1 (gcc's compiler proper) turns x.c into assembly, or gcc
answers -dumpversion.

Refused forms have their permissive control (the same form compiles there). Holes are `xfail(strict=True)`: each
asserts what strict mode should do and fails today; the attack working is the xfail's own positive control, since
the same process shows cc1 refused when it is started from its own path (fd_of_cc1_execveat).
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

from tests.support.common import ROOT
from nojit.loader.strict import landlock

PROBE = os.path.join(ROOT, "tests", "probes", "probe_redteam.py")
HAVE_GCC = all(os.path.exists(p) for p in ("/usr/bin/gcc", "/usr/bin/as", "/usr/bin/ld"))
pytestmark = [pytest.mark.skipif(not HAVE_GCC, reason="gcc is needed to show the attacks work"),
              pytest.mark.skipif(landlock.abi_version() is None, reason="this kernel has no Landlock")]

REFUSED = ("fd_of_cc1_execveat", "opath_of_cc1_proc", "shebang_gcc", "spawnp_reset_path", "gcc_abs",
           "raw_syscall_execve", "deleted_copy_proc_fd")


@pytest.fixture(scope="module")
def other_user():
    if os.geteuid() != 0:
        pytest.skip("needs root: the test makes a second user with useradd")
    name = f"nojit-red-{secrets.token_hex(3)}"
    made = subprocess.run(["useradd", "-r", "-M", "-U", "-s", "/usr/sbin/nologin", name], capture_output=True,
                          text=True)
    if made.returncode != 0:
        pytest.skip(f"useradd failed: {made.stderr.strip()[:200]}")
    try:
        yield pwd.getpwnam(name)
    finally:
        subprocess.run(["userdel", name], capture_output=True)


@pytest.fixture(scope="module")
def work():
    """x.c, cc1's path, allowed/ (NOJIT_EXEC_ALLOW) with a tool and a `#!/usr/bin/gcc` script, a venv, a bundle;
    in a folder of /tmp mode 0755 (pytest's own is 0700), so the second user reaches what is theirs in it."""
    w = pathlib.Path(tempfile.mkdtemp(prefix="nojit-red-", dir="/tmp"))
    os.chmod(w, 0o755)
    try:
        yield _make(w)
    finally:
        shutil.rmtree(w, ignore_errors=True)


def _make(w: pathlib.Path) -> pathlib.Path:
    (w / "x.c").write_text("int main(void) { return 0; }\n")
    cc1 = subprocess.run(["gcc", "-print-prog-name=cc1"], capture_output=True, text=True, check=True).stdout.strip()
    (w / "cc1").write_text(cc1)
    (w / "allowed").mkdir()
    (w / "xdg").mkdir(mode=0o700)
    (w / "allowed" / "script").write_text("#!/usr/bin/gcc -dumpversion\n")
    os.chmod(w / "allowed" / "script", 0o755)
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(w / "venv")],
                   check=True)
    import site

    purelib = subprocess.run([str(w / "venv" / "bin" / "python"), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], capture_output=True, text=True,
                             check=True).stdout.strip()
    with open(os.path.join(purelib, "parent.pth"), "w") as f:  # this environment's packages (cffi, zstandard, and
        # nojit itself: addsitedir runs their .pth files too, so an editable install's finder is there as well)
        f.write("".join(f"import site; site.addsitedir({d!r})\n" for d in site.getsitepackages()))
    from tests.support.bundle_bytes import seal
    from tests.loader.bundle.test_schema_rules import valid

    (w / "b.nojit").write_bytes(seal(*valid()))
    return w


def _cc1(work) -> str:
    return os.path.realpath((work / "cc1").read_text().strip())


def run_probe(work, mode: str, user=None, forms: str = "", xdg: str = "xdg", allow: bool = True,
              apart: bool = False) -> dict:
    """`apart`: working, home and temporary folders of the probe's own (work/), so that none is above the Python
    environment's NVRTC builtins (a copy below one is left readable: nvrtc_builtins.py), wherever the suite runs."""
    for p in work.glob("out_*"):
        p.unlink()
    env = {**os.environ, "NOJIT_MODE": mode, "XDG_RUNTIME_DIR": str(work / xdg),
           "NOJIT_EVENT_LOG": str(work / "events.jsonl"), "REDTEAM_FORMS": forms}
    if apart:
        for name in ("home", "tmp"):
            (work / name).mkdir(mode=0o700, exist_ok=True)
        env.update(HOME=str(work / "home"), TMPDIR=str(work / "tmp"))
    env.pop("NOJIT_EXEC_ALLOW", None)
    if allow:  # overwrite_allowed_file leaves cc1's bytes in allowed/tool
        shutil.copy("/bin/true", work / "allowed" / "tool")
        env["NOJIT_EXEC_ALLOW"] = str(work / "allowed")
    if user is not None:
        env.update(REDTEAM_UID=str(user.pw_uid), REDTEAM_GID=str(user.pw_gid))
    for name in ("NOJIT_FIREWALL_DIR", landlock.ACTIVE_ENV):
        env.pop(name, None)
    p = subprocess.run([str(work / "venv" / "bin" / "python"), PROBE, str(work / "b.nojit"), str(work)],
                       capture_output=True, text=True, env=env, timeout=600, cwd=str(work) if apart else None)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"the probe printed no result (exit {p.returncode})\n{p.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    assert result["mode"] == mode and result["errors"] == {}, result
    return result


@pytest.fixture(scope="module")
def strict(work):
    r = run_probe(work, "strict")
    assert r["landlock"] == "on", r
    return r


def test_refused_fd_paths_shebang_and_a_reset_path(work, strict):
    """execveat(AT_EMPTY_PATH) and /proc/self/fd/N of cc1's own file (O_RDONLY and O_PATH), a `#!/usr/bin/gcc`
    script in an allowed folder, posix_spawnp("gcc") with PATH=/usr/bin:/bin, gcc by absolute path, gcc by the raw
    execve system call, a copy of cc1 opened, deleted and run as /proc/self/fd/N: refused."""
    assert {f: strict["compiled"][f] for f in REFUSED} == {f: False for f in REFUSED}, strict
    control = run_probe(work, "permissive")
    assert {f: control["compiled"][f] for f in REFUSED} == {f: True for f in REFUSED}, control


def test_the_dynamic_loader_cannot_run_a_compiler(work, strict):
    """Fixed: `ld-linux-x86-64.so.2 <compiler>` is an exec of ld.so (allowed: every dynamic program needs it as its
    interpreter, and Landlock checks the interpreter's exec the same way), which then maps the compiler as a library,
    unchecked; the gcc driver answered and cc1 compiled. Now no process of the tree can read a compiler
    (loader/strict/unreadable.py), and ld.so must read it to map it. Control: both run in permissive mode."""
    forms = ("ld_so_gcc_driver", "ld_so_cc1")
    assert {f: strict["compiled"][f] for f in forms} == {f: False for f in forms}, strict
    assert f"{len(strict['compilers_unreadable'])} compilers unreadable" in strict["summary"], strict["summary"]
    assert _cc1(work) in strict["compilers_unreadable"] and os.path.realpath("/usr/bin/gcc") in \
        strict["compilers_unreadable"]
    control = run_probe(work, "permissive", forms=",".join(forms))
    assert control["compiled"] == {f: True for f in forms}, control


def test_outside_a_thread_that_existed_before_install_runs_gcc_without_tsync(strict):
    """README, outside the guarantee: without Landlock's TSYNC (ABI 8) a thread started before install is not
    restricted, and the startup line counts it (by its OS name: CPython 3.11 leaves that `python`)."""
    assert strict["compiled"]["thread_before_install"] is (not strict["tsync"]), strict
    if not strict["tsync"]:
        assert "1 earlier threads not covered" in strict["summary"], strict


_URING_OPEN = r"""
#include <linux/io_uring.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
static int ring; static struct io_uring_params p; static unsigned char *sq, *cq; static struct io_uring_sqe *sqes;
static int submit(const struct io_uring_sqe *e) { /* one request, waited for; its result */
  unsigned *tail = (unsigned *)(sq + p.sq_off.tail), mask = *(unsigned *)(sq + p.sq_off.ring_mask);
  unsigned t = *tail, i = t & mask;
  sqes[i] = *e; ((unsigned *)(sq + p.sq_off.array))[i] = i;
  __atomic_store_n(tail, t + 1, __ATOMIC_RELEASE);
  if (syscall(__NR_io_uring_enter, ring, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0) < 0) return -9999;
  unsigned *head = (unsigned *)(cq + p.cq_off.head), cmask = *(unsigned *)(cq + p.cq_off.ring_mask);
  int res = ((struct io_uring_cqe *)(cq + p.cq_off.cqes))[*head & cmask].res;
  __atomic_store_n(head, *head + 1, __ATOMIC_RELEASE);
  return res;
}
int main(int argc, char **argv) { /* uring_open FILE OUT: OUT is made when FILE's first bytes were read (ELF) */
  ring = syscall(__NR_io_uring_setup, 4, &p);
  if (ring < 0 || argc < 3) { perror("io_uring_setup"); return 2; }
  sq = mmap(0, p.sq_off.array + p.sq_entries * 4, PROT_READ | PROT_WRITE, MAP_SHARED, ring, IORING_OFF_SQ_RING);
  cq = mmap(0, p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe), PROT_READ | PROT_WRITE, MAP_SHARED, ring,
            IORING_OFF_CQ_RING);
  sqes = mmap(0, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE, MAP_SHARED, ring, IORING_OFF_SQES);
  struct io_uring_sqe e; char b[4] = {0};
  memset(&e, 0, sizeof e); e.opcode = IORING_OP_OPENAT; e.fd = AT_FDCWD; e.addr = (unsigned long)argv[1];
  e.open_flags = O_RDONLY;
  int fd = submit(&e);
  printf("openat %d\n", fd);
  if (fd < 0) return 1;
  memset(&e, 0, sizeof e); e.opcode = IORING_OP_READ; e.fd = fd; e.addr = (unsigned long)b; e.len = 4;
  if (submit(&e) == 4 && memcmp(b, "\x7f" "ELF", 4) == 0) close(open(argv[2], O_WRONLY | O_CREAT, 0644));
  return 0;
}
"""


def test_a_compiler_read_through_io_uring_is_refused(work):
    """io_uring opens and reads in the kernel's workers, under the submitter's credentials, which carry the Landlock
    domain: cc1 read that way is refused too. Control: the same tool reads it in permissive mode."""
    tool = work / "allowed" / "uring_open"
    (work / "uring_open.c").write_text(_URING_OPEN)
    made = subprocess.run(["gcc", "-O1", "-o", str(tool), str(work / "uring_open.c")], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"the io_uring tool did not build: {made.stderr[-300:]}")
    try:
        probe = subprocess.run([str(tool), _cc1(work), str(work / "out_uring_self")], capture_output=True, text=True)
        if probe.returncode == 2:
            pytest.skip(f"io_uring is not available here: {probe.stderr.strip()[:200]}")
        r = run_probe(work, "strict", forms="uring_read_cc1,gcc_abs")
        assert r["compiled"] == {"uring_read_cc1": False, "gcc_abs": False}, r
        control = run_probe(work, "permissive", forms="uring_read_cc1")
        assert control["compiled"] == {"uring_read_cc1": True}, control
    finally:
        tool.unlink()


def test_an_installed_compiler_copied_into_a_memfd_or_after_install_is_refused(work, strict):
    """Fixed: cc1's bytes copied into a memfd (Landlock never checks such a file) ran through execveat and
    /proc/self/fd/N; copied after install into a folder with a whole-tree rule (this user's venv), or written over a
    file with an inode rule, they ran too. Each copy needs to read cc1 first, and no process of the tree can now
    (unreadable.py). A hard link into the venv is refused by Landlock itself (a link to another folder, EXDEV).
    Control: in permissive mode each form compiles (the hard link where cc1 and the venv share a file system)."""
    assert strict["tree"], strict  # the venv is a whole-tree rule this user can write
    forms = ("memfd_execveat", "memfd_proc_path", "copy_after_install", "overwrite_allowed_file",
             "hardlink_after_install")
    assert {f: strict["compiled"][f] for f in forms} == {f: False for f in forms}, strict
    control = run_probe(work, "permissive", forms=",".join(forms))
    same_fs = os.stat(_cc1(work)).st_dev == os.stat(work).st_dev
    assert control["compiled"] == {f: f != "hardlink_after_install" or same_fs for f in forms}, control


@pytest.mark.xfail(strict=True, reason="hole: compiler bytes that are not an installed compiler's (copied by a process "
                   "outside the tree, unpacked from a package archive or a pip cache, downloaded) run through the "
                   "dynamic loader or a memfd: Landlock checks neither ld.so's mmap of its program nor a memfd, "
                   "vm.memfd_noexec=2 is a pid-namespace-wide sysctl that needs CAP_SYS_ADMIN, and a seccomp filter "
                   "refusing memfd_create without MFD_NOEXEC_SEAL would still leave ld.so on a readable file, while "
                   "refusing legitimate memfd users in the serving tree not shown safe on the GPU; not small")
def test_compiler_bytes_brought_from_outside_the_tree_never_run(strict):
    assert not strict["compiled"]["stash_ld_so"] and not strict["compiled"]["stash_memfd"], strict


def test_a_file_another_user_can_write_in_an_allowed_folder_never_runs(work, other_user):
    """Fixed: a tool of the second user in a folder of root's (NOJIT_EXEC_ALLOW) got an inode rule; they rewrote it
    as cc1 after install (from their own login, outside the strict tree) and the server ran it. Now such a file gets
    no rule (also 0666 files of root's)."""
    theirs = work / "allowed" / "theirs"
    shutil.copy("/bin/true", theirs)
    os.chown(theirs, other_user.pw_uid, other_user.pw_gid)
    try:
        r = run_probe(work, "strict", other_user, "others_file_in_allowed,gcc_abs")
        assert theirs.stat().st_size == os.stat(_cc1(work)).st_size  # the rewrite happened
        assert r["compiled"] == {"others_file_in_allowed": False, "gcc_abs": False}, r
        shutil.copy("/bin/true", theirs)
        os.chown(theirs, 0, 0)
        os.chmod(theirs, 0o777)
        comp = landlock.compilers_mod.find()
        p = landlock.plan(comp, [], [str(work / "allowed")])
        assert str(theirs) not in p.files and any(u.startswith(str(theirs)) for u in p.unsafe)
        os.chmod(theirs, 0o755)
        assert str(theirs) in landlock.plan(comp, [], [str(work / "allowed")]).files  # control: ours, it runs
    finally:
        theirs.unlink()


def test_positive_control_the_other_users_rewrite_runs_without_the_check(work, other_user, monkeypatch):
    """The rewrite itself works: in permissive mode the second user's rewritten tool compiles."""
    theirs = work / "allowed" / "theirs"
    shutil.copy("/bin/true", theirs)
    os.chown(theirs, other_user.pw_uid, other_user.pw_gid)
    try:
        assert run_probe(work, "permissive", other_user, "others_file_in_allowed")["compiled"] == \
            {"others_file_in_allowed": True}
    finally:
        theirs.unlink()


@pytest.mark.xfail(strict=True, reason="hole: a whole-tree rule covers folders below it that another user owns "
                   "(only the root and the folders above it are checked), and that user copies a compiler there from "
                   "their own login, outside the strict tree (its unreadable compilers do not bind them); walking "
                   "every tree costs seconds and the cached plan would not see a later chown deep inside, not small")
def test_a_folder_of_another_user_below_a_whole_tree_root_never_runs(work, other_user):
    theirs = work / "venv" / "theirs"
    theirs.mkdir()
    os.chown(theirs, other_user.pw_uid, other_user.pw_gid)
    try:
        r = run_probe(work, "strict", other_user, "others_folder_in_tree,gcc_abs")
        assert (theirs / "tool").stat().st_size == os.stat(_cc1(work)).st_size  # the copy happened
        assert r["compiled"]["gcc_abs"] is False  # the same process refuses gcc itself
        assert r["compiled"]["others_folder_in_tree"] is False, r
    finally:
        shutil.rmtree(theirs)


@pytest.mark.xfail(strict=True, reason="hole: a compiler copied under another name before install into a folder "
                   "with a whole-tree rule (the venv) runs: compilers are found by name in the search folders, and "
                   "only folders holding one are checked file by file (inode, size and content); checking every file "
                   "of every root by size means walking /usr/lib and site-packages whole, seconds, not small")
def test_a_renamed_compiler_placed_before_install_in_a_whole_tree_folder_never_runs(work):
    pre = work / "venv" / "pre"
    pre.mkdir()
    shutil.copy(_cc1(work), pre / "mycc")
    try:
        r = run_probe(work, "strict", forms="renamed_copy_in_tree,gcc_abs", allow=False)
        assert r["compiled"]["gcc_abs"] is False  # the same process refuses gcc itself
        assert r["compiled"]["renamed_copy_in_tree"] is False, r
    finally:
        shutil.rmtree(pre)


def test_a_rewritten_cached_plan_does_not_widen_the_allow_list(work):
    """Fixed: exec-plan.json in the runtime folder was trusted; a process of this user that appended a folder rule
    for "/" (the key and every stamp unchanged) widened the next strict process's allow-list, and gcc ran. Now a
    cached plan that names what plan() could not (a rule outside the roots, on a folder above a compiler, or for
    a compiler) is planned again. compilers.json is no longer read (test_exec_allowlist.py)."""
    (work / "xdg-cache").mkdir(mode=0o700)
    first = run_probe(work, "strict", forms="gcc_abs", xdg="xdg-cache", allow=False)
    assert first["compiled"] == {"gcc_abs": False}
    cached = work / "xdg-cache" / "nojit" / "exec-plan.json"
    data = json.loads(cached.read_text())
    data["folders"].append("/")  # same key, every listed stamp unchanged: the next process reuses it
    cached.write_text(json.dumps(data))
    os.chmod(cached, stat.S_IRUSR | stat.S_IWUSR)
    again = run_probe(work, "strict", forms="gcc_abs", xdg="xdg-cache", allow=False)
    assert again["compiled"] == {"gcc_abs": False}, again


def test_positive_control_a_rewritten_plan_is_reused_without_the_check(tmp_path, monkeypatch):
    """Without the check, the rewritten plan is taken from the cache as it is, a folder rule on "/" with it (which
    lets everything run: the red team's run before the fix compiled). Also: a rule for gcc itself is refused."""
    comp = landlock.compilers_mod.find()
    roots = landlock.default_roots()
    landlock.cached_plan(comp, roots, [], [], str(tmp_path))
    cached = tmp_path / "exec-plan.json"
    data = json.loads(cached.read_text())
    for tamper in ({"folders": [*data["folders"], "/"]}, {"files": [*data["files"], os.path.realpath("/usr/bin/gcc")]}):
        cached.write_text(json.dumps({**data, **tamper}))
        checked = landlock.cached_plan(comp, roots, [], [], str(tmp_path))
        assert not checked.from_cache and "/" not in checked.folders
        assert os.path.realpath("/usr/bin/gcc") not in checked.files
        cached.write_text(json.dumps({**data, **tamper}))
        with monkeypatch.context() as m:
            m.setattr(landlock, "_could_be_planned", lambda *a: True)
            trusted = landlock.cached_plan(comp, roots, [], [], str(tmp_path))
        assert trusted.from_cache and (("/" in trusted.folders) or os.path.realpath("/usr/bin/gcc") in trusted.files)
    cached.write_text(json.dumps(data))
    assert landlock.cached_plan(comp, roots, [], [], str(tmp_path)).from_cache  # control: an untouched plan is reused


@pytest.mark.skipif(importlib.util.find_spec("nvidia") is None or importlib.util.find_spec("cuda") is None,
                    reason="needs the nvidia-cuda-nvrtc wheel")
def test_a_python_child_that_never_installs_nojit_cannot_use_nvrtc(work):
    """Fixed: the in-process guards are per process, and a Python child that never installs nojit compiled CUDA C++
    with a ctypes-loaded libnvrtc. Now NVRTC's builtins library (which NVRTC opens only to compile) cannot be read by
    any process of the strict tree (Landlock, loader/strict/nvrtc_builtins.py): the child's compile fails. Control:
    the same child compiles in permissive mode. (nvJitLink and the driver's PTX JIT in such a child: README.)"""
    r = run_probe(work, "strict", forms="child_nvrtc,gcc_abs", allow=False, apart=True)
    assert r["compiled"]["gcc_abs"] is False  # the child's process compilers are refused
    assert r["compiled"]["child_nvrtc"] is False, r
    assert "NVRTC builtins unreadable" in r["summary"], r["summary"]
    control = run_probe(work, "permissive", forms="child_nvrtc", allow=False, apart=True)
    assert control["compiled"]["child_nvrtc"] is True, control


@pytest.mark.skipif(importlib.util.find_spec("nvidia") is None, reason="needs the nvidia-nvjitlink wheel")
@pytest.mark.xfail(strict=True, reason="hole: a Python child that never installs nojit links PTX to a cubin with a "
                   "ctypes-loaded nvJitLink; the in-process guards are per process, and unlike NVRTC's builtins "
                   "nvJitLink cannot be made unreadable to the process tree (torch's libcusparse links it, so every "
                   "worker's import torch maps it); it carries its own PTX compiler, so the driver's JIT library made "
                   "unreadable (NOJIT_UNREADABLE_PTX_JIT) does not stop it; an environment-carried guard (LD_PRELOAD, "
                   "sitecustomize) is dropped by a child started with an environment of its own")
def test_a_python_child_that_never_installs_nojit_cannot_use_nvjitlink(work):
    r = run_probe(work, "strict", forms="child_nvjitlink,gcc_abs", allow=False, apart=True)
    assert r["compiled"]["gcc_abs"] is False  # the same process tree refuses gcc
    assert r["compiled"]["child_nvjitlink"] is False, r


@pytest.mark.skipif(importlib.util.find_spec("nvidia") is None, reason="needs the nvidia-nvjitlink and -nvrtc wheels")
def test_outside_code_in_the_process_can_undo_the_in_process_guards(work):
    """README, outside the guarantee: the in-process guards stop libraries that would compile, not code that attacks
    them; the patched entries are the process's own memory (here put back with inprocess_guard.deactivate()), and
    nvJitLink then links PTX. NVRTC still fails: its builtins are unreadable to the whole tree (Landlock)."""
    r = run_probe(work, "strict", forms="undo_guards_nvjitlink,undo_guards_nvrtc", allow=False, apart=True)
    assert r["compiled"] == {"undo_guards_nvjitlink": True, "undo_guards_nvrtc": False}, r
    control = run_probe(work, "permissive", forms="undo_guards_nvrtc", allow=False, apart=True)
    assert control["compiled"] == {"undo_guards_nvrtc": True}, control  # the NVRTC form can compile


def test_the_driver_jit_library_is_unreadable_to_a_child_on_request(work, monkeypatch):
    """NOJIT_UNREADABLE_PTX_JIT=1 (loader/strict/driver_jit.py): a child that never installs nojit cannot open the
    driver's PTX JIT library (here a stand-in file in LD_LIBRARY_PATH; that libcuda then JIT-compiles nothing is for the
    GPU test). Control: without the setting the same child reads it."""
    lib = pathlib.Path(tempfile.mkdtemp(prefix="nojit-ptxjit-", dir="/var/tmp"))  # below no folder where files are made
    try:
        (lib / "libnvidia-ptxjitcompiler.so.580.159.04").write_bytes(b"\x7fELF")
        monkeypatch.setenv("LD_LIBRARY_PATH", str(lib))
        monkeypatch.setenv("REDTEAM_PTXJIT", str(lib / "libnvidia-ptxjitcompiler.so.580.159.04"))
        monkeypatch.setenv("NOJIT_UNREADABLE_PTX_JIT", "1")
        r = run_probe(work, "strict", forms="read_ptx_jit_library,gcc_abs", allow=False, apart=True)
        assert r["compiled"] == {"read_ptx_jit_library": False, "gcc_abs": False}, r
        assert "the driver's PTX JIT library unreadable (1 copies)" in r["summary"], r["summary"]
        monkeypatch.setenv("NOJIT_UNREADABLE_PTX_JIT", "0")
        control = run_probe(work, "strict", forms="read_ptx_jit_library", allow=False, apart=True)
        assert control["compiled"] == {"read_ptx_jit_library": True}, control
    finally:
        shutil.rmtree(lib)


def test_a_pinned_bundle_changed_in_place_after_open_serves_nothing_unpinned(tmp_path):
    """TOCTOU on the pin after open: the pin covers the header and index only; sections and cubins are read later
    by pread from the descriptor opened at open. A writer flipping every byte after the header in place (same
    inode, as a shared mapping of the file would see it) gets a BundleCorruptError at each later read, never its
    bytes served; a file renamed over the path is never read (the descriptor holds the old inode)."""
    import hashlib

    from tests.support.bundle_bytes import seal
    from tests.loader.bundle.test_schema_rules import CUBIN_A, SHA_A, valid

    from nojit.loader.bundle.file import HEADER, Bundle
    from nojit.loader.errors import BundleCorruptError

    raw = seal(*valid())
    path = tmp_path / "b.nojit"
    path.write_bytes(raw)
    pin = hashlib.sha256(raw).hexdigest()
    control = Bundle.open(str(path), expected_sha256=pin)
    assert control.read_blob(SHA_A) == CUBIN_A and control.entries("vllm.m:k")  # control: the reads work
    renamed = Bundle.open(str(path), expected_sha256=pin)
    other = tmp_path / "other"
    other.write_bytes(raw[:HEADER.size] + bytes(len(raw) - HEADER.size))
    os.replace(other, path)  # a redeploy renamed over the path: the open bundles keep the old inode
    assert renamed.read_blob(SHA_A) == CUBIN_A
    path.write_bytes(raw)
    flipped = Bundle.open(str(path), expected_sha256=pin)
    with open(path, "r+b") as f:  # in place: same inode
        f.seek(HEADER.size)
        f.write(bytes(b ^ 0xFF for b in raw[HEADER.size:]))
    with pytest.raises(BundleCorruptError):
        flipped.read_blob(SHA_A)
    with pytest.raises(BundleCorruptError):
        flipped.entries("vllm.m:k")
