"""Strict mode's compiler firewall, with real processes: Python's subprocess/os forms, a C program's
popen/execvp, FlashInfer's own CUDA-version probe, Triton's ptxas knob, guards applied on import
after install, and (with strace) an exec trace showing no real compiler ran.

The recorded toolchain is made up here (CUDA 12.8, gcc 11.4) and differs from the tools on this
machine (CUDA 13.0, gcc 12), so an answer can only come from the record, never from a real tool.
"""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from nojit.loader.strict import firewall
from nojit.loader.strict import guards
from nojit.loader.errors import CompileForbiddenError

NVCC = ("nvcc: NVIDIA (R) Cuda compiler driver\nCopyright (c) 2005-2025 NVIDIA Corporation\n"
        "Built on Tue_Mar_4_00:00:00_PST_2025\nCuda compilation tools, release 12.8, V12.8.93\n"
        "Build cuda_12.8.r12.8/compiler.35583870_0\n")
PTXAS = NVCC.replace("nvcc: NVIDIA (R) Cuda compiler driver", "ptxas: NVIDIA (R) Ptx optimizing assembler")
GCC = "gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0\nCopyright (C) 2021 Free Software Foundation, Inc.\n"
TOOLCHAIN = {
    "nvcc": {"--version": {"stdout": NVCC, "stderr": ""}},
    "ptxas": {"--version": {"stdout": PTXAS, "stderr": ""}},
    "gcc": {"--version": {"stdout": GCC, "stderr": ""}, "-dumpfullversion": {"stdout": "11.4.0\n", "stderr": ""}},
    "g++": {"--version": {"stdout": GCC.replace("gcc", "g++", 1), "stderr": ""}},
}

C_CALLER = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
/* caller popen "CMD"  |  caller execvp NAME ARGS...: how DeepGEMM and TRT-LLM's DeepGEMM start nvcc */
int main(int argc, char **argv) {
  if (argc >= 3 && !strcmp(argv[1], "popen")) {
    FILE *p = popen(argv[2], "r");
    if (!p) return 90;
    char buf[4096]; size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) fwrite(buf, 1, n, stdout);
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 91;
  }
  if (argc >= 3 && !strcmp(argv[1], "execvp")) {
    pid_t pid = fork();
    if (pid == 0) { execvp(argv[2], argv + 2); _exit(92); }
    int st; waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 93;
  }
  return 2;
}
"""


@pytest.fixture(scope="module")
def caller(tmp_path_factory):
    """The C program, built with the real gcc before strict mode goes up."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the C caller")
    folder = tmp_path_factory.mktemp("caller")
    (folder / "caller.c").write_text(C_CALLER)
    subprocess.run(["gcc", "-O1", "-o", str(folder / "caller"), str(folder / "caller.c")], check=True)
    return str(folder / "caller")


@pytest.fixture
def strict(caller, tmp_path, monkeypatch):
    monkeypatch.setenv("NOJIT_EVENT_LOG", str(tmp_path / "events.jsonl"))
    monkeypatch.delenv("NOJIT_FIREWALL_DIR", raising=False)
    report = firewall.activate(TOOLCHAIN)
    guards.install_strict_guards()
    try:
        yield report
    finally:
        guards.deactivate()
    assert firewall.active() is None
    assert os.path.isfile(os.path.join(report.root, ".nojit-firewall"))  # kept: children (orphans too) may use it


def events(report) -> list[dict]:
    if not os.path.exists(report.event_log):
        return []
    from nojit.loader.strict.inprocess_guard import STATUS_EVENTS  # what strict mode reports at start, not a refusal

    with open(report.event_log) as f:
        return [e for e in map(json.loads, f) if e.get("event") not in STATUS_EVENTS]


def test_firewall_points_every_variable_at_the_stand_ins(strict):
    b = strict.bin_dir
    assert os.environ["PATH"].split(os.pathsep)[0] == b
    assert os.environ["CUDA_HOME"] == os.environ["CUDA_PATH"] == strict.root
    for var, tool in [("TRITON_PTXAS_PATH", "ptxas"), ("DG_JIT_NVCC_COMPILER", "nvcc"), ("TRTLLM_DG_NVCC_COMPILER", "nvcc"),
                      ("FLASHINFER_NVCC", "nvcc"), ("CC", "gcc"), ("CXX", "g++"), ("CUTE_DSL_PTXAS_PATH", "ptxas")]:
        assert os.environ[var] == os.path.join(b, tool)
    for name in ("gcc", "gcc-12", "x86_64-linux-gnu-gcc-12", "as", "ld.gold", "ld.bfd", "nvcc", "ptxas", "cicc",
                 "nvlink", "fatbinary", "ninja", "clang", "clang++", "c++", "cc"):
        assert name in strict.names and shutil.which(name) == os.path.join(b, name)
    assert os.path.isfile(os.path.join(strict.root, "nvvm", "bin", "cicc"))
    assert os.stat(strict.root).st_mode & 0o777 == 0o700


def test_version_probes_answer_with_the_recorded_toolchain(strict, caller):
    assert subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout == NVCC
    assert subprocess.run(["ptxas", "--version"], capture_output=True, text=True, check=True).stdout == PTXAS
    assert subprocess.run(["gcc", "--version"], capture_output=True, text=True, check=True).stdout == GCC
    assert subprocess.run("x86_64-linux-gnu-gcc-12 -dumpfullversion", shell=True, capture_output=True,
                          text=True, check=True).stdout == "11.4.0\n"
    # DeepGEMM's way: libc popen through /bin/sh, CUDA_HOME/bin/nvcc
    done = subprocess.run([caller, "popen", f"{os.environ['CUDA_HOME']}/bin/nvcc --version 2>&1"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout == NVCC
    # a tool with no record refuses its probe too, so callers fall back as if it were absent
    done = subprocess.run([caller, "execvp", "fatbinary", "--version"], capture_output=True, text=True)
    assert done.returncode == 127 and "no recorded version" in done.stderr
    assert events(strict)[-1]["event"] == "version_unanswered"


def test_flashinfer_cuda_version_probe_answers_the_recorded_version(strict):
    cpp_ext = pytest.importorskip("flashinfer.jit.cpp_ext")
    import torch

    cpp_ext.get_cuda_version.cache_clear()
    try:
        assert str(cpp_ext.get_cuda_version()) == "12.8" != torch.version.cuda
    finally:
        cpp_ext.get_cuda_version.cache_clear()


def test_triton_finds_the_stand_in_ptxas(strict):
    triton = pytest.importorskip("triton")
    tool = triton.knobs.nvidia.ptxas
    assert tool.path == os.path.join(strict.bin_dir, "ptxas") and tool.version == "12.8"


def test_every_stand_in_refuses_from_c_execvp(strict, caller):
    """libc execvp through PATH, the calling process named on stderr and in the event log."""
    for name in strict.names:
        p = subprocess.Popen([caller, "execvp", name, "-c", "k.cu", "-o", "k o"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 126, (name, err)
        assert err.startswith(f"nojit: strict mode refused to run {name} -c k.cu -o k o (called by pid {p.pid}: {caller} execvp")
        assert "fix: NOJIT_MODE=strict forbids compilers" in err and err.count("\n") == 1
    logged = events(strict)
    assert [e["tool"] for e in logged] == list(strict.names)
    assert all(e["event"] == "compiler_refused" and e["argv"][1:] == ["-c", "k.cu", "-o", "k o"] for e in logged)


@pytest.mark.parametrize("command", [
    "nvcc -cubin -o /tmp/x.cubin x.cu", "cd /tmp && nvcc -O3 x.cu", "gcc-12 -c a.c", "x86_64-linux-gnu-gcc-12 -c a.c",
    "as -o a.o a.s", "ld.gold -o a a.o", "env gcc -c a.c", "sh -c 'g++ -c a.cc'", "ninja -C build",
    "\"$CUDA_HOME/nvvm/bin/cicc\" x.ii", "$CC -shared -o m.so m.c",
])
def test_c_popen_shell_forms_refused(strict, caller, command):
    done = subprocess.run([caller, "popen", command], capture_output=True, text=True, timeout=30)
    assert done.returncode == 126 and "nojit: strict mode refused to run" in done.stderr
    assert events(strict)[-1]["event"] == "compiler_refused"


def test_every_stand_in_refused_by_python_forms(strict, tmp_path):
    """subprocess (list, shell=True, env= with its own PATH), os.system, os.popen: refused before a process starts."""
    for name in strict.names:
        forms = [
            lambda: subprocess.run([name, "-c", "x.c"]),
            lambda: subprocess.run(f"{name} -c x.c", shell=True),
            lambda: subprocess.run([name, "-c", "x.c"], env={"PATH": "/usr/bin:/usr/local/cuda/bin"}),
            lambda: os.system(f"FOO=1 env {name} -c x.c"),
            lambda: os.popen(f"true && {name} -c x.c"),
        ]
        for form in forms:
            before = len(guards.compile_attempts)
            with pytest.raises(CompileForbiddenError, match=f"about to start: {re.escape(name)} -c x.c") as info:
                form()
            assert info.value.fix and len(guards.compile_attempts) == before + 1
    logged = [e for e in events(strict) if e["event"] == "compile_forbidden"]
    assert len(logged) == 5 * len(strict.names) and {e["tool"] for e in logged} == set(strict.names)
    assert subprocess.run(["gcc", "--version"], env={"PATH": "/usr/bin"}, capture_output=True).returncode == 0
    assert os.system("true") == 0


IMPORT_AFTER_INSTALL = textwrap.dedent("""
    import sys
    from nojit.loader.strict import guards
    from nojit.loader.errors import CompileForbiddenError
    assert "triton" not in sys.modules and "tilelang" not in sys.modules
    guards.install_strict_guards()
    import triton, triton.compiler, triton.compiler.compiler
    from triton.runtime.jit import JITFunction
    refused = []
    for f in (triton.compile, triton.compiler.compile, triton.compiler.compiler.compile):
        try:
            f(None)
        except CompileForbiddenError:
            refused.append(f)
    if "no_do_compile" in JITFunction._do_compile.__qualname__:
        refused.append("JITFunction._do_compile")
    import tilelang
    try:
        tilelang.compile(None)
    except CompileForbiddenError:
        refused.append("tilelang")
    print("REFUSED", len(refused), refused[-2:])
""")


def test_guards_apply_to_libraries_imported_after_install():
    pytest.importorskip("triton")
    pytest.importorskip("tilelang")
    done = subprocess.run([sys.executable, "-c", IMPORT_AFTER_INSTALL], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REFUSED 5 ['JITFunction._do_compile', 'tilelang']" in done.stdout, done.stdout


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed (apt-get install -y strace)")
def test_exec_trace_shows_no_real_compiler(strict, caller, tmp_path):
    """strace -f -e execve,execveat: every compiler-named exec is the stand-in script, never a real binary."""
    trace = tmp_path / "trace"
    script = "; ".join([
        f"{caller} popen 'nvcc -cubin x.cu; gcc-12 -c a.c; as a.s; ld.gold a.o'",
        f"{caller} execvp x86_64-linux-gnu-gcc-12 -c a.c",
        f"{caller} popen 'nvcc --version'",
        "ninja -C build", "$CXX -c a.cc", "\"$CUDA_HOME/bin/ptxas\" x.ptx",
    ])
    done = subprocess.run(["strace", "-f", "-qq", "-e", "trace=execve,execveat", "-o", str(trace), "/bin/sh", "-c",
                           script], capture_output=True, text=True, timeout=120)
    if not trace.exists() or "ptrace" in done.stderr.lower():
        pytest.skip(f"strace cannot trace here: {done.stderr.strip()[:200]}")
    execs = []
    for line in trace.read_text().splitlines():
        if "execve(" in line and "= -1" not in line and "resumed" not in line:
            execs.append(line.split('"')[1])
    compilers = [p for p in execs if firewall.family_of(p) is not None]
    assert len(compilers) >= 9, execs
    stand_in = os.path.realpath(os.path.join(strict.root, "nojit-stand-in"))
    assert all(os.path.realpath(p) == stand_in for p in compilers), compilers


def test_bundle_without_toolchain_starts_no_process_and_refuses_probes(tmp_path, monkeypatch):
    """No record in the manifest: strict startup runs no tool to learn versions (the GPU check counts processes);
    the stand-ins refuse version probes (exit 127), which FlashInfer and Triton read as an absent tool. Without a
    bundle (activate()) the installed tools are probed before the stand-ins go up."""
    from nojit.loader.bundle.manifest import Producer

    real = shutil.which("nvcc")
    if real is None:
        pytest.skip("no nvcc installed")
    expected = subprocess.run([real, "--version"], capture_output=True, text=True, check=True).stdout
    monkeypatch.setenv("NOJIT_EVENT_LOG", str(tmp_path / "events.jsonl"))
    monkeypatch.delenv("NOJIT_FIREWALL_DIR", raising=False)
    producer = Producer(nojit="0", vllm=None, triton=None, tilelang=None, ptxas=None, nvcc=None, python="3.11",
                        torch=None)
    import nojit.loader.strict.toolchain as toolchain_mod

    with monkeypatch.context() as m:
        m.setattr(toolchain_mod.subprocess, "run", lambda *a, **k: pytest.fail(f"a process was started: {a}"))
        report = firewall.activate(producer)
    try:
        assert report.versions_from == "none" and report.host_tools["nvcc"]
        assert shutil.which("nvcc") == os.path.join(report.bin_dir, "nvcc")
        probe = subprocess.run(["nvcc", "--version"], capture_output=True, text=True)
        assert probe.returncode == 127 and "no recorded version" in probe.stderr
    finally:
        firewall.deactivate()
    report = firewall.activate()  # no bundle: the installed tools answer
    try:
        assert report.versions_from == "installed tools"
        assert subprocess.run(["nvcc", "--version"], capture_output=True, text=True, check=True).stdout == expected
        # a child process reuses the folder (vLLM's spawned workers)
        child = subprocess.run([sys.executable, "-c", "from nojit.loader.strict import firewall; r = firewall.activate(); "
                                "print(r.root, r.versions_from)"], capture_output=True, text=True, check=True)
        assert child.stdout.split() == [report.root, "inherited"]
    finally:
        firewall.deactivate()
    assert shutil.which("nvcc") == real and "NOJIT_FIREWALL_DIR" not in os.environ


def test_manifest_toolchain_round_trip_and_validation():
    from nojit.loader.errors import BundleCorruptError
    from nojit.loader.bundle.manifest import Producer, _Fields

    base = dict(nojit="0", vllm=None, triton=None, tilelang=None, ptxas=None, nvcc=None, python="3.11", torch=None)
    assert "toolchain" not in Producer(**base).to_json()  # older bundles' bytes stay the same
    with_record = Producer(**base, toolchain=TOOLCHAIN)
    assert Producer.from_json(_Fields(json.loads(json.dumps(with_record.to_json())), "producer", "b")) == with_record
    bad = {**base, "toolchain": {"nvcc": {"--version": "text, not streams"}}}
    with pytest.raises(BundleCorruptError, match="producer.toolchain.nvcc"):
        Producer.from_json(_Fields(bad, "producer", "b"))


def test_a_failed_install_takes_its_firewall_down(tmp_path, monkeypatch):
    from nojit.loader.install import install

    monkeypatch.setenv("NOJIT_EVENT_LOG", str(tmp_path / "events.jsonl"))
    calls = []

    @firewall.lowered_if_raises
    def failing_install():
        calls.append(firewall.activate(TOOLCHAIN))
        raise RuntimeError("bundle refused")

    path_before = os.environ["PATH"]
    with pytest.raises(RuntimeError):
        failing_install()
    assert calls and firewall.active() is None and os.environ["PATH"] == path_before
    assert "NOJIT_FIREWALL_DIR" not in os.environ
    assert getattr(install, "__wrapped__", None) is not None  # install() carries the decorator


CUTE_HUMMING_AFTER_INSTALL = textwrap.dedent("""
    import sys
    from nojit.loader.strict import guards
    from nojit.loader.errors import CompileForbiddenError
    assert "cutlass" not in sys.modules and "humming" not in sys.modules
    guards.install_strict_guards()
    import cutlass.cute as cute
    import humming.jit.compiler as hc
    refused = []
    for name, call in [("cute", lambda: cute.compile(None)),
                       *[(c.__name__, lambda c=c: c._compile("k.cu", "/nonexistent", 90, "k", []))
                         for c in (hc.Compiler, hc.NVRTCCompiler, hc.NVCCCompiler)]]:
        try:
            call()
        except CompileForbiddenError:
            refused.append(name)
    print("REFUSED", refused)
""")


def test_cutedsl_and_humming_guarded_when_imported_after_install():
    """cutlass.cute.compile and Humming's compile step (a cache miss) raise; Humming's cache hits stay served."""
    pytest.importorskip("cutlass.cute")
    pytest.importorskip("humming.jit.compiler")
    done = subprocess.run([sys.executable, "-c", CUTE_HUMMING_AFTER_INSTALL], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "REFUSED ['cute', 'Compiler', 'NVRTCCompiler', 'NVCCCompiler']" in done.stdout, done.stdout
