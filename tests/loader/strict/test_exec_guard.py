"""Issue 21, Build 2b: without Landlock's exec allow-list, strict mode's exec guard (loader/strict/exec_guard.py)
refuses gcc started by absolute path from C, written as the attack (tests/probes/probe_exec_guard.py): system(),
popen(), fork+execv, posix_spawn, a copied gcc, a symlinked gcc, execveat on a descriptor, fexecve. Each makes no
output file and writes an exec-guard event line; the positive control runs the very same forms without the guard and
each compiles; non-compilers (`true`, `sh -c`) still run under the guard. The probe-based form list of a whole strict
install with NOJIT_LANDLOCK=0 is in test_exec_allowlist.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.common import ROOT
from nojit.loader.strict import exec_guard

PROBE = os.path.join(ROOT, "tests", "probes", "probe_exec_guard.py")
HAVE_GCC = all(os.path.exists(p) for p in ("/usr/bin/gcc", "/usr/bin/as"))
pytestmark = [pytest.mark.skipif(not HAVE_GCC, reason="gcc and as are needed to show the attack works"),
              pytest.mark.skipif(os.uname().machine != "x86_64", reason="the exec guard patches x86-64 libc")]
FORMS = ("system_abs", "popen_abs", "fork_execv", "posix_spawn", "copied_gcc", "symlinked_gcc", "execveat_fd",
         "fexecve")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    w = tmp_path_factory.mktemp("execguard")
    (w / "x.c").write_text("int main(void) { return 0; }\n")
    cc1 = subprocess.run(["gcc", "-print-prog-name=cc1"], capture_output=True, text=True, check=True).stdout.strip()
    (w / "gcclib").write_text(os.path.dirname(cc1))
    (w / "cp").mkdir()
    (w / "ln").mkdir()
    shutil.copy(os.path.realpath("/usr/bin/gcc"), w / "cp" / "mycc")
    os.symlink("/usr/bin/gcc", w / "ln" / "mycc")
    return w


def run(work, which: str) -> dict:
    log = work / f"events_{which}.jsonl"
    log.write_text("")
    env = {**os.environ, "NOJIT_EVENT_LOG": str(log), "XDG_RUNTIME_DIR": str(work)}
    p = subprocess.run([sys.executable, PROBE, which, str(work)], capture_output=True, text=True, env=env, timeout=300)
    lines = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert lines, f"the probe printed no result (exit {p.returncode})\n{p.stderr[-3000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    result["events"] = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
    return result


def test_every_form_of_gcc_by_absolute_path_is_refused_by_the_exec_guard(work):
    r = run(work, "guard")
    assert [f for f in FORMS if r["compiled"][f]] == [], r["compiled"]
    assert r["allowed"] == {"system_true": 0, "system_sh_c": 0, "spawn_true": 0, "fork_execv_true": 0}
    guard = [e for e in r["events"] if e.get("via") == "exec-guard"]
    assert len(guard) >= len(FORMS) and all(e["event"] == "compile_forbidden" for e in guard), r["events"]
    assert {e["symbol"] for e in guard} >= {"execve", "execveat", "fexecve"}
    # counted in this process's memory: the forms whose child shares it (posix_spawn's CLONE_VM, which system() and
    # popen() use too), not a fork()ed child's copy
    assert r["refusals"] == 4


def test_positive_control_each_form_compiles_without_the_guard(work):
    r = run(work, "none")
    assert [f for f in FORMS if not r["compiled"][f]] == [], r["compiled"]
    assert r["allowed"] == {"system_true": 0, "system_sh_c": 0, "spawn_true": 0, "fork_execv_true": 0}
    assert r["events"] == []


@pytest.mark.parametrize("state", ["on", "inherited", "exempt"])
def test_nothing_is_patched_where_landlock_applies(state):
    """Where the allow-list is applied (or this process exempted itself) libc is left as it is."""
    assert exec_guard.activate(state) is None
    assert exec_guard.report() is None


def test_the_check_names_copies_links_and_words(work, tmp_path):
    """The C check itself (no patch): a copy by content, a link by its target, a path in a shell command."""
    code = ("import sys; from nojit.loader.strict import exec_guard, compilers; from nojit.loader import _inproc as n; "
            "c = compilers.find(); "
            "n.exec_guard_set(sorted({(d, i) for d, i, _, _ in c.files.values()}), "
            "sorted({(s, p) for p, (_, _, s, _) in c.files.items()}), -1); "
            "w = sys.argv[1]; "
            "print([n.exec_guard_check(p) for p in (w + '/cp/mycc', w + '/ln/mycc', '/bin/true')]); "
            "print(n.exec_guard_check('/bin/sh', ['-c', 'x=/usr/bin/gcc; $x'])); "
            "print(n.exec_guard_check('/bin/sh', ['-c', 'ls /usr/bin']))")
    p = subprocess.run([sys.executable, "-c", code, str(work)], capture_output=True, text=True,
                       env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    lines = p.stdout.splitlines()
    assert lines == [f"['{work}/cp/mycc', '{work}/ln/mycc', None]", "/usr/bin/gcc", "None"], p.stderr


def test_a_libc_whose_exec_body_is_not_the_expected_wrapper_is_left_alone(tmp_path):
    """The stubs never return into libc, so only a body known to be the plain syscall wrapper is replaced."""
    code = ("from nojit.loader.strict import exec_guard as g; g._WRAPPERS['execve'] = b'\\x90' * 7; "
            "r = g.activate('off'); print(r.patched); print(r.skipped); print(r.summary())")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "XDG_RUNTIME_DIR": str(tmp_path)})
    lines = p.stdout.splitlines()
    assert lines[0] == "['execveat', 'fexecve']", p.stderr
    assert "execve: not the syscall wrapper expected" in lines[1] and "not patched:" in lines[2]
