"""Issue 21, Build 2 and Must show 2 (process compilers): strict mode's exec allow-list (loader/strict/landlock.py) and
compiler identity (loader/strict/compilers.py).

Written as the attack: a fresh strict-mode process (Landlock on, as in production) starts gcc in every form the
audit hook and the PATH stand-ins cannot see (tests/probes/probe_exec_forms.py), and none of them makes its output file.
The positive control runs the very same forms in permissive mode: each one compiles, so the check can fail.
The pytest process itself never restricts itself (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from tests.support.common import ROOT
from nojit.loader.strict import compilers
from nojit.loader.strict import landlock

PROBE = os.path.join(ROOT, "tests", "probes", "probe_exec_forms.py")
HAVE_GCC = all(os.path.exists(p) for p in ("/usr/bin/gcc", "/usr/bin/as", "/usr/bin/ld"))
needs_gcc = pytest.mark.skipif(not HAVE_GCC, reason="gcc, as and ld are needed to show the attack works")
needs_landlock = pytest.mark.skipif(landlock.abi_version() is None, reason="this kernel has no Landlock")

FORMS = ("c_system_abs", "c_fork_execv", "c_posix_spawn", "py_child_execv", "shell_variable", "shell_glob",
         "copied_gcc_as_ld", "symlinked_gcc", "copy_in_allowed_folder", "ld_so_cc1")
ORPHANS = ("orphan_by_name", "orphan_by_path")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """x.c, a copied toolchain, a symlinked gcc, an allowed folder holding a renamed gcc, a bundle."""
    if not HAVE_GCC:
        pytest.skip("gcc, as and ld are needed")
    w = tmp_path_factory.mktemp("exec")
    (w / "x.c").write_text("int main(void) { return 0; }\n")
    cc1 = subprocess.run(["gcc", "-print-prog-name=cc1"], capture_output=True, text=True, check=True).stdout.strip()
    gcclib = os.path.dirname(cc1)
    (w / "gcclib").write_text(gcclib)
    for folder in ("cp", "ln", "allowed", "xdg"):
        (w / folder).mkdir()
    os.chmod(w / "xdg", 0o700)
    for src, name in (("/usr/bin/gcc", "mycc"), (cc1, "cc1"), (os.path.join(gcclib, "collect2"), "collect2"),
                      ("/usr/bin/as", "as"), ("/usr/bin/ld", "ld")):
        shutil.copy(os.path.realpath(src), w / "cp" / name)
    os.symlink("/usr/bin/gcc", w / "ln" / "mycc")
    shutil.copy(os.path.realpath("/usr/bin/gcc"), w / "allowed" / "mycc")
    shutil.copy(os.path.realpath("/bin/true"), w / "allowed" / "mytool")
    from tests.support.bundle_bytes import seal
    from tests.loader.bundle.test_schema_rules import valid

    (w / "b.nojit").write_bytes(seal(*valid()))
    return w


def run_probe(work, **env: str) -> dict:
    """The probe in a fresh process; its results, with the orphan's outputs looked for after it exited."""
    for p in work.glob("out_*"):
        p.unlink()
    full = {**os.environ, "NOJIT_EXEC_ALLOW": str(work / "allowed"), "XDG_RUNTIME_DIR": str(work / "xdg"),
            "NOJIT_EVENT_LOG": str(work / "events.jsonl"), **env}
    for name in ("NOJIT_FIREWALL_DIR", landlock.ACTIVE_ENV):
        full.pop(name, None)
    p = subprocess.run([sys.executable, PROBE, str(work / "b.nojit"), str(work)], capture_output=True, text=True,
                       env=full, timeout=600)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"the probe printed no result (exit {p.returncode})\n{p.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    time.sleep(6)  # the orphan compiles 2 s after the probe exited
    result["compiled"].update({name: (work / f"out_{name}").exists() for name in ORPHANS})
    result["stderr"] = p.stderr
    return result


@needs_gcc
@needs_landlock
def test_every_process_compiler_form_is_refused_by_the_kernel(work):
    first = run_probe(work, NOJIT_MODE="strict")
    assert first["landlock"]["state"] == "on" and first["mode"] == "strict", first
    assert first["exec_guard"] is None  # libc left as it is where the kernel refuses
    compiled = first["compiled"]
    assert [f for f in (*FORMS, *ORPHANS) if compiled[f]] == [], compiled
    assert first["allowed_tool_exit"] == 0  # a non-compiler in an allowed folder still runs
    assert first["child"] == "inherited"
    # ld_so_cc1: Landlock does not check ld.so's mapping of cc1, but cc1 is unreadable (loader/strict/unreadable.py)
    again = run_probe(work, NOJIT_MODE="strict")  # the plan comes from the runtime folder's exec-plan.json now
    print(f"allow-list install: first process {first['landlock']['ms']:.0f} ms, later process "
          f"{again['landlock']['ms']:.0f} ms ({again['landlock']['rules']} rules, ABI {again['landlock']['abi']}, "
          f"tsync {again['landlock']['tsync']})")
    assert [f for f in (*FORMS, *ORPHANS) if again["compiled"][f]] == []
    # the split the H200 check reports (check_one_process.py's landlock_split_ms); whether a plan comes from the
    # runtime folder's cache depends on what the probe changed in the allowed folder, so either name is accepted
    for r in (first, again):
        steps = list(r["landlock"]["steps"])
        assert steps[0] == "find" and steps[1] in ("plan", "plan (cached)") and steps[2:] == ["read rules", "apply"], r
        assert sum(r["landlock"]["steps"].values()) <= r["landlock"]["ms"] + 1


@needs_gcc
def test_positive_control_the_same_forms_compile_without_strict_mode(work):
    control = run_probe(work, NOJIT_MODE="permissive")
    assert control["landlock"] is None
    assert {f: control["compiled"][f] for f in (*FORMS, *ORPHANS) if f != "copy_in_allowed_folder"} == \
        {f: True for f in (*FORMS, *ORPHANS) if f != "copy_in_allowed_folder"}
    assert control["compiled"]["copy_in_allowed_folder"] is True  # the copy answers -dumpversion: it is gcc


# what the exec guard (loader/strict/exec_guard.py) cannot see without Landlock: a path the shell builds at run time
WITHOUT_LANDLOCK_OPEN = ("shell_glob",)


@needs_gcc
def test_without_landlock_the_exec_guard_refuses_the_same_forms(work):
    """NOJIT_LANDLOCK=0 (what a kernel without Landlock gets): libc's exec entries are patched (Build 2b), so gcc by
    absolute path from C (system, fork+execv, posix_spawn), a copy, a symlink, a child Python's execv and the orphan
    are refused, each with an exec-guard event line; the stand-ins still catch the orphan by name. A glob the shell
    expands is not seen (README). The positive control is test_positive_control_the_same_forms_compile_..."""
    log = work / "events.jsonl"
    log.write_text("")
    off = run_probe(work, NOJIT_MODE="strict", NOJIT_LANDLOCK="0")
    assert off["landlock"]["state"] == "off"
    compiled = off["compiled"]
    print("without Landlock, compiled:", sorted(f for f, v in compiled.items() if v))
    assert sorted(f for f in (*FORMS, *ORPHANS) if compiled[f]) == sorted(WITHOUT_LANDLOCK_OPEN), compiled
    assert compiled["ld_so_cc1"] is False  # cc1 named in ld.so's argv
    assert off["allowed_tool_exit"] == 0  # a non-compiler still runs under the guard
    assert off["exec_guard"].startswith("exec guard on libc's execve, execveat, fexecve ("), off  # the startup phrase
    events = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    guard = [e for e in events if e.get("via") == "exec-guard"]
    assert guard and all(e["event"] == "compile_forbidden" for e in guard), events
    what = " ".join(e["what"] for e in guard)
    for shown in ("/usr/bin/gcc", "/cp/mycc", "/ln/mycc", "/allowed/mycc"):
        assert shown in what, what


def test_no_landlock_is_said_in_one_line():
    code = ("from nojit.loader.strict import landlock; landlock.abi_version = lambda: None; "
            "r = landlock.enforce(None, None); print(r.state)")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={k: v for k, v in os.environ.items() if k != landlock.ACTIVE_ENV})
    assert p.stdout.split() == ["unavailable"], p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Landlock is not available" in lines[0] and "audit hook" in lines[0]


def test_a_copied_marker_is_not_an_inherited_domain():
    """NOJIT_LANDLOCK_ACTIVE naming an ancestor is not enough: without no_new_privs the process is not restricted."""
    code = "from nojit.loader.strict import landlock; print(landlock._enforced_by_ancestor())"
    env = {**os.environ, landlock.ACTIVE_ENV: str(os.getpid())}
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env).stdout.strip() == "False"
    nnp = "import ctypes; ctypes.CDLL(None).prctl(38, 1, 0, 0, 0); " + code  # the positive control
    assert subprocess.run([sys.executable, "-c", nnp], capture_output=True, text=True, env=env).stdout.strip() == "True"


def test_compilers_are_known_by_content_and_inode_not_by_name(tmp_path):
    if not HAVE_GCC:
        pytest.skip("gcc is needed")
    comp = compilers.find()
    gcc = os.path.realpath("/usr/bin/gcc")
    assert gcc in comp.files and os.path.dirname(gcc) in comp.folders
    cc1 = subprocess.run(["gcc", "-print-prog-name=cc1"], capture_output=True, text=True).stdout.strip()
    assert os.path.realpath(cc1) in comp.files
    copy = tmp_path / "notes"
    shutil.copy(gcc, copy)
    assert comp.is_compiler(str(copy))  # same size and sha256
    tool = tmp_path / "tool"
    shutil.copy(os.path.realpath("/bin/true"), tool)
    assert not comp.is_compiler(str(tool))
    with open(copy, "r+b") as f:  # one byte changed: no longer gcc
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 1]))
    assert not compilers.Compilers(comp.files, comp.folders).is_compiler(str(copy))
    try:
        os.link(gcc, tmp_path / "hard")
    except OSError:
        return
    assert comp.is_compiler(str(tmp_path / "hard"))  # same inode


def test_plan_never_covers_a_compiler_or_a_folder_others_can_write(tmp_path):
    comp = compilers.find()
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    p = landlock.plan(comp, [*landlock.default_roots(), str(shared), "/tmp"])
    assert any(u.startswith(str(shared)) for u in p.unsafe) and any(u.startswith("/tmp ") for u in p.unsafe)
    for path in comp.files:
        assert path not in p.files
        assert not any(path == f or path.startswith(f + os.sep) for f in p.folders), path
    assert os.path.realpath("/bin/sh") in p.files or any(os.path.realpath("/bin/sh").startswith(f + os.sep)
                                                         for f in p.folders)
    assert landlock.writable_by_others("/tmp") == "/tmp"
    assert landlock.writable_by_others(str(tmp_path)) is None  # ours, under sticky /tmp
    assert landlock.writable_by_others(str(shared)) == str(shared)
    os.chmod(shared, 0o755)
    assert landlock.writable_by_others(str(shared / "x")) == str(shared / "x")  # missing: refused


def test_an_allowed_folder_others_can_write_is_a_typed_error(tmp_path):
    from nojit.loader.errors import NoJitError

    bad = tmp_path / "bad"
    bad.mkdir()
    os.chmod(bad, 0o777)
    with pytest.raises(NoJitError, match="another user can write") as e:
        landlock.plan(compilers.find(), [], [str(bad)])
    assert "NOJIT_EXEC_ALLOW" in e.value.fix
    assert stat.S_IMODE(os.stat(bad).st_mode) == 0o777


def test_cached_plan_is_redone_when_a_listed_folder_changes(tmp_path):
    """A later process reuses the plan only while every folder it listed and every file it ruled on is unchanged:
    a gcc copied into an allowed folder afterwards is found and refused, not let through from the cache."""
    if not HAVE_GCC:
        pytest.skip("gcc is needed")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copy(os.path.realpath("/bin/true"), allowed / "tool")
    comp = compilers.find()
    first = landlock.cached_plan(comp, [], [str(allowed)], [], str(cache))
    again = landlock.cached_plan(compilers.find(), [], [str(allowed)], [], str(cache))
    assert not first.from_cache and again.from_cache and again.files == first.files == [str(allowed / "tool")]
    shutil.copy(os.path.realpath("/usr/bin/gcc"), allowed / "newtool")
    changed = landlock.cached_plan(compilers.find(), [], [str(allowed)], [], str(cache))
    assert not changed.from_cache and str(allowed / "newtool") in changed.refused_compilers
    assert str(allowed / "newtool") not in changed.files
    with open(allowed / "tool", "r+b") as f:  # replaced in place by gcc's bytes: same inode and entries
        f.write(open(os.path.realpath("/usr/bin/gcc"), "rb").read())
    replaced = landlock.cached_plan(compilers.find(), [], [str(allowed)], [], str(cache))
    assert not replaced.from_cache and str(allowed / "tool") in replaced.refused_compilers


def test_a_cached_plan_that_lost_a_compiler_copy_still_makes_it_unreadable(tmp_path, monkeypatch):
    """Attack (session 9's review): a process of this user shortens exec-plan.json's refused_compilers (and the
    copy's stamp) to drop a renamed gcc copy; every stamp still matches, so the next start reused the plan and left
    the copy readable (ld.so or a memfd runs a readable compiler). Now the refused list is found again from the
    files and a listed folder's entry missing from the plan means planning again. Control: with the cache's list
    trusted as written, the copy is missing from it."""
    if not HAVE_GCC:
        pytest.skip("gcc is needed")
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    shutil.copy(os.path.realpath("/bin/true"), allowed / "tool")
    shutil.copy(os.path.realpath("/usr/bin/gcc"), allowed / "notes")
    copy = str(allowed / "notes")
    first = landlock.cached_plan(compilers.find(), [], [str(allowed)], [], str(cache))
    assert copy in first.refused_compilers and copy not in first.files
    data = json.loads((cache / "exec-plan.json").read_text())
    dropped = {**data, "refused_compilers": []}
    forgotten = {**dropped, "file_stats": {k: v for k, v in data["file_stats"].items() if k != copy}}
    for tampered in (dropped, forgotten):
        (cache / "exec-plan.json").write_text(json.dumps(tampered))
        again = landlock.cached_plan(compilers.find(), [], [str(allowed)], [], str(cache))
        assert copy in again.refused_compilers and copy not in again.files, tampered
    (cache / "exec-plan.json").write_text(json.dumps(dropped))
    with monkeypatch.context() as m:  # control: the defence off, the cache's list as written
        m.setattr(landlock, "_refused", lambda comp, p, stats: p.refused_compilers)
        trusted = landlock.cached_plan(compilers.find(), [], [str(allowed)], [], str(cache))
    assert trusted.from_cache and copy not in trusted.refused_compilers
    (cache / "exec-plan.json").write_text(json.dumps(forgotten))
    with monkeypatch.context() as m:
        m.setattr(landlock, "_every_entry_ruled", lambda p: True)
        trusted = landlock.cached_plan(compilers.find(), [], [str(allowed)], [], str(cache))
    assert trusted.from_cache and copy not in trusted.refused_compilers
    (cache / "exec-plan.json").write_text(json.dumps(data))
    assert landlock.cached_plan(compilers.find(), [], [str(allowed)], [], str(cache)).from_cache  # untouched: reused


def test_a_rewritten_compiler_list_cannot_widen_the_allow_list(tmp_path):
    """Attack (sessions 7-8 read <runtime dir>/compilers.json as it was): a process of this user drops cc1's folder
    from the list. Control: a plan built on that list gives cc1 a whole-tree exec rule (it would run). Now the list
    is found by name in each process and no file is read: the plan refuses cc1 whatever the runtime folder holds."""
    if not HAVE_GCC:
        pytest.skip("gcc is needed")
    cc1 = os.path.realpath(subprocess.run(["gcc", "-print-prog-name=cc1"], capture_output=True, text=True,
                                          check=True).stdout.strip())
    comp = compilers.find()
    assert cc1 in comp.files
    dropped = os.path.dirname(cc1)
    tampered = compilers.Compilers({p: v for p, v in comp.files.items() if not p.startswith(dropped + os.sep)},
                                   [f for f in comp.folders if f != dropped])
    roots = landlock.default_roots()
    widened = landlock.plan(tampered, roots)
    assert any(cc1.startswith(f + os.sep) for f in widened.folders)  # control: the tampered list lets cc1 run
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    (cache / "compilers.json").write_text(json.dumps({"key": comp.cache_key, "files": {
        p: list(v) for p, v in tampered.files.items()}, "folders": tampered.folders, "digests": {}}))
    found = compilers.find()
    assert cc1 in found.files and dropped in found.folders
    p = landlock.cached_plan(found, roots, [], [], str(cache))
    assert not any(cc1.startswith(f + os.sep) for f in p.folders) and cc1 not in p.files
