"""Strict mode's compiler firewall: no compiler binary can run, whoever asks, in whatever language.

The in-process guards (guards.py) see Python. DeepGEMM and TensorRT-LLM's DeepGEMM call nvcc
through libc `popen`, ninja starts nvcc and c++, a shell started by anything starts gcc: none of
that passes through Python. So, before anything else runs, `activate()` makes a folder of
stand-ins, puts it first on PATH and points every variable the installed libraries use to
find a compiler at it. A stand-in is one POSIX shell script (no compiler, no Python) linked
under every compiler name. It answers a version probe (`--version`, `-V`, `-v`, `-dumpversion`,
`-dumpfullversion`, the argument alone) with the exact text the bundle recorded at build time
(`producer.toolchain`, see toolchain.py), so version checks pass in an image with no toolkit,
and refuses anything else: exit 126, one line on stderr naming the tool, its arguments, the
calling process and the fix, and one JSON line appended to the event log (NOJIT_EVENT_LOG,
default <runtime dir>/events.jsonl).

A bundle without a toolchain record: the stand-ins answer with the versions the tools on PATH
(and CUDA_HOME) print at activation, probed before the firewall goes up; a tool found nowhere
refuses its version probe too (exit 127, "no recorded version"), which FlashInfer and Triton
treat as an absent tool.

Where the stand-ins live: <runtime dir>/toolkit-<digest>/ (built under a temporary name, mode 0700,
and renamed into place whole; shared by every process of this user with the same toolchain, never removed, so
a child that outlives its parent still finds it), where <runtime dir> is $XDG_RUNTIME_DIR/nojit if that exists, else <tmp>/nojit-<uid>
(0700, must be owned by this user). The folder is also a fake CUDA toolkit root: bin/ holds the
stand-ins, nvvm/bin/cicc is one, and every other entry of the real toolkit (include, lib64,
targets, nvvm/libdevice, version.json, ...) is a symlink to it, so libraries that read headers
or libraries through CUDA_HOME keep working. Child processes inherit the environment
(NOJIT_FIREWALL_DIR names the folder) and reuse it.

Variables pointed at the firewall (read from the installed vLLM 0.33.0 and its dependencies;
paths relative to site-packages):

| variable | set to | read by |
|---|---|---|
| PATH | <fw>/bin first | every name lookup: libc execvp/popen (DeepGEMM, TRT-LLM DeepGEMM `nvcc` default), /bin/sh, ninja, triton/runtime/build.py (`shutil.which` clang/gcc), torch cpp_extension (`ninja --version`), tilelang/env.py:131 (`which nvcc`) |
| CUDA_HOME | <fw> | flashinfer/jit/cpp_ext.py:49 ($cuda_home/bin/nvcc), compiler.cuh:106 (TRT-LLM DeepGEMM), vllm/third_party/deep_gemm (`CUDA_HOME`/bin/nvcc in _C), humming/utils/jit.py:142,155 and utils/cuda.py:240, tilelang/env.py:128, cutlass base_dsl/env_manager.py:511, vllm/utils/flashinfer.py, torch/utils/cpp_extension.py:163 |
| CUDA_PATH | <fw> | the same readers' second choice (flashinfer, humming, tilelang, cutlass, torch, tvm contrib/nvcc.py) |
| TRITON_PTXAS_PATH, TRITON_PTXAS_BLACKWELL_PATH, TRITON_CUOBJDUMP_PATH, TRITON_NVDISASM_PATH | <fw>/bin/<tool> | triton/knobs.py:194-218,501-504 (else Triton runs its own bundled ptxas by absolute path) |
| CUTE_DSL_PTXAS_PATH | <fw>/bin/ptxas | vllm/vllm_flash_attn/cute/cute_dsl_ptxas.py, vllm/third_party/tml_fa4 |
| DG_JIT_NVCC_COMPILER | <fw>/bin/nvcc | vllm/third_party/deep_gemm/_C (`JIT_NVCC_COMPILER` with the DG_ prefix) |
| TRTLLM_DG_NVCC_COMPILER | <fw>/bin/nvcc | flashinfer/data/csrc/nv_internal/tensorrt_llm/deep_gemm/compiler.cuh:101 |
| FLASHINFER_NVCC | <fw>/bin/nvcc | flashinfer/jit/cpp_ext.py:289, jit/core.py:658 |
| CUDA_NVCC_PATH | <fw>/bin/nvcc | humming/utils/jit.py:152 (`CUDA_{NAME}_PATH`) |
| CC | <fw>/bin/gcc | triton/runtime/build.py, flashinfer/jit/cpp_ext.py:123,207, tilelang/contrib/cc.py, tvm contrib/cc.py |
| CXX | <fw>/bin/g++ | flashinfer/jit/cpp_ext.py:288, jit/core.py:657, humming/utils/jit.py:33, tilelang/contrib/cc.py |
| NVCC | <fw>/bin/nvcc | convention only: no installed package reads it |
| HUMMING_DISABLE_PARALLEL_BUILD | 1 | humming/utils/nvrtc.py:145-158: at import Humming starts `python -c ...may_build_nvrtc_compile_binary()` in the background (a g++ build when its prebuilt helper does not match); with this set no process starts at import |
| NOJIT_FIREWALL_DIR | <fw> | nojit: children reuse the folder |

Values captured at import before `activate()` are re-pointed too when their module is already
loaded: `torch.utils.cpp_extension.CUDA_HOME`, `tilelang.env.Environment.CUDA_HOME`. What stays
open: a library that captured the real toolkit path before activation and then execs it by
absolute path from C (none known in vLLM 0.33.0's process; Python execs are caught by the audit
hook in guards.py whatever the path); Landlock (landlock.py) refuses that exec, or where it is not applied the exec
guard in libc's exec entries (exec_guard.py).
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from nojit.loader import private_dir
from nojit.loader.strict import toolchain as toolchain_mod
from nojit.loader.errors import NoJitError, UnsafePathError
from nojit.loader.settings import settings

FIX = (
    "NOJIT_MODE=strict forbids compilers in this process: serve the kernel from the bundle (NOJIT_MODE=record, "
    "then `nojit build --add-keys`), switch the library's JIT off (README, Use with vLLM), or run with "
    "NOJIT_MODE=permissive"
)

BASE_NAMES = (
    "gcc", "g++", "cc", "c++", "clang", "clang++", "nvcc", "ptxas", "ptxas-blackwell", "cicc", "nvlink",
    "fatbinary", "cuobjdump", "nvdisasm", "ninja", "ld", "ld.gold", "ld.bfd", "ld.lld", "as",
)
GCC_VERSIONS = tuple(str(v) for v in range(9, 16))
CLANG_VERSIONS = tuple(str(v) for v in range(11, 21))
TARGET_PREFIXES = ("x86_64-linux-gnu", "aarch64-linux-gnu", "x86_64-pc-linux-gnu")

# a compiler's file name: optional target prefix, the tool, optional version suffix
_COMPILER_NAME = re.compile(
    r"^(?:[A-Za-z0-9_]+(?:-[A-Za-z0-9_.]+)*?-)?"
    r"(gcc|g\+\+|cc|c\+\+|clang|clang\+\+|nvcc|ptxas|cicc|nvlink|fatbinary|ninja|ld(?:\.gold|\.bfd|\.lld)?|as|"
    r"cuobjdump|nvdisasm)"
    r"(?:-blackwell)?(?:-[0-9]+(?:\.[0-9]+)*)?$"
)
_FAMILY = {"cc": "gcc", "c++": "g++", "ld.gold": "ld", "ld.bfd": "ld", "ld.lld": "ld"}
VERSION_PROBES = frozenset({"--version", "-V", "-v", "-dumpversion", "-dumpfullversion"})


def family_of(name: str) -> str | None:
    """The tool family whose version a stand-in of this file name answers with, or None for a non-compiler."""
    m = _COMPILER_NAME.match(os.path.basename(name))
    if m is None:
        return None
    return _FAMILY.get(m.group(1), m.group(1))


def is_version_probe(argv: list[str]) -> bool:
    """`tool --version` and its kin: the only call a stand-in answers."""
    return len(argv) == 2 and argv[1] in VERSION_PROBES


def stand_in_names() -> tuple[str, ...]:
    """Every file name the firewall puts on PATH: fixed names plus compilers found on this PATH."""
    names = set(BASE_NAMES)
    for v in GCC_VERSIONS:
        names.update((f"gcc-{v}", f"g++-{v}", f"cpp-{v}"))
    for v in CLANG_VERSIONS:
        names.update((f"clang-{v}", f"clang++-{v}"))
    for prefix in TARGET_PREFIXES:
        for tool in ("gcc", "g++", "ld", "ld.gold", "ld.bfd", "as"):
            names.add(f"{prefix}-{tool}")
        for v in GCC_VERSIONS:
            names.update((f"{prefix}-gcc-{v}", f"{prefix}-g++-{v}"))
    seen: set[str] = set()
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        real = os.path.realpath(directory or ".")  # /bin and /usr/bin are often one folder: list it once
        if real in seen:
            continue
        seen.add(real)
        try:
            entries = os.listdir(real)
        except OSError:
            continue
        names.update(filter(_COMPILER_NAME.match, entries))  # family_of(e) is not None, looped in C
    return tuple(sorted(filter(_COMPILER_NAME.match, names)))


def runtime_dir() -> str:
    """This user's nojit folder: $XDG_RUNTIME_DIR/nojit, else <tmp>/nojit-<uid>; 0700 and ours, or an error.
    Walked with no symlink, every folder above it checked too (loader/private_dir.py)."""
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    base = os.path.join(xdg, "nojit") if xdg and os.path.isdir(xdg) else os.path.join(
        tempfile.gettempdir(), f"nojit-{os.getuid()}")
    try:
        with private_dir.open_private(base, deny=private_dir.PRIVATE):
            pass
    except UnsafePathError as exc:
        raise UnsafePathError(f"nojit runtime folder {base} is not a private folder of this user ({exc.message})",
                              fix=f"remove {base} (or set XDG_RUNTIME_DIR to a private folder) and start again") from None
    return os.path.abspath(base)


def event_log_path() -> str:
    """NOJIT_EVENT_LOG, else <runtime dir>/events.jsonl, made here (O_EXCL) when absent and refused unless a
    regular file of this user in a folder nobody else can change: the stand-ins append to it with the shell's
    `>>`, which would follow a symlink, so what they find there must already be ours (private_dir.open_append)."""
    path = settings.event_log or os.path.join(runtime_dir(), "events.jsonl")
    os.close(private_dir.open_append(path))
    return os.path.abspath(path)


def log_event(event: dict[str, Any]) -> None:
    """Append one JSON line to the event log; never raises (the refusal itself must stay the error), never
    follows a symlink and writes only to a regular file of this user (private_dir.open_append)."""
    line = json.dumps({"time": time.time(), "pid": os.getpid(), **event}, sort_keys=True) + "\n"
    try:
        private_dir.append_line(event_log_path(), line.encode())
    except (OSError, NoJitError):
        pass


_SCRIPT = r"""#!/bin/sh
# nojit strict-mode compiler stand-in (loader/strict/firewall.py): answers version probes with the
# versions the bundle recorded, refuses everything else. Linked under every compiler name.
fw=@FW@
log=@LOG@
tool=${0##*/}
tab=$(printf '\t')
case $tool in
@CASES@
  *) fam=$tool ;;
esac
esc() {
  r=$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e "s/$tab/\\\\t/g" -e 's/$/\\n/' | tr -d '\001-\037')
  printf '%s' "${r%\\n}"
}
if [ $# -eq 1 ]; then
  case $1 in
    --version|-V|-v|-dumpversion|-dumpfullversion)
      a="$fw/answers/$fam/$1"
      if [ -f "$a.stdout" ]; then
        [ -s "$a.stdout" ] && while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done < "$a.stdout"
        [ -s "$a.stderr" ] && while IFS= read -r l || [ -n "$l" ]; do printf '%s\n' "$l"; done < "$a.stderr" >&2
        exit 0
      fi
      printf 'nojit: %s %s: no recorded version (the bundle has no toolchain record for %s and none was installed)\n' "$tool" "$1" "$fam" >&2
      what=version_unanswered; code=127 ;;
  esac
fi
what=${what:-compiler_refused}; code=${code:-126}
caller=$(tr '\000' ' ' < /proc/$PPID/cmdline 2>/dev/null)
if [ "$what" = compiler_refused ]; then
  printf 'nojit: strict mode refused to run %s %s (called by pid %s: %s); fix: %s\n' "$tool" "$*" "$PPID" "$caller" @FIX@ >&2
fi
argv="\"$(esc "$tool")\""
for x in "$@"; do argv="$argv, \"$(esc "$x")\""; done
now=$(date +%s 2>/dev/null)
printf '{"event": "%s", "tool": "%s", "family": "%s", "argv": [%s], "pid": %s, "ppid": %s, "caller": "%s", "cwd": "%s", "time": %s}\n' \
  "$what" "$(esc "$tool")" "$(esc "$fam")" "$argv" "$$" "$PPID" "$(esc "$caller")" "$(esc "$PWD")" "${now:-0}" >> "$log" 2>/dev/null
exit $code
"""


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def _script(fw: str, log: str, names: tuple[str, ...]) -> str:
    by_family: dict[str, list[str]] = {}
    for name in names:
        by_family.setdefault(family_of(name) or name, []).append(name)
    cases = "\n".join(f"  {'|'.join(_sh_quote(n) for n in sorted(ns))}) fam={fam} ;;" for fam, ns in sorted(by_family.items()))
    return (_SCRIPT.replace("@FW@", _sh_quote(fw)).replace("@LOG@", _sh_quote(log))
            .replace("@FIX@", _sh_quote(FIX)).replace("@CASES@", cases))


@dataclass
class FirewallReport:
    """What `activate()` set up: the folder, the names, the variables, where the versions came from."""

    root: str
    bin_dir: str
    event_log: str
    names: tuple[str, ...]
    env: dict[str, str]
    versions_from: str  # "bundle" | "installed tools" | "none" | "inherited"
    answered: tuple[str, ...]  # tool families whose version probes are answered
    real_toolkit: str | None
    created_here: bool
    # the real tool each family would have run without the firewall (None: not installed). vLLM's
    # has_flashinfer() takes an nvcc and a ninja on PATH as "FlashInfer's JIT can run": with the stand-ins it
    # always finds them, so a process whose host has none must switch FlashInfer's JIT off (README, Use with vLLM).
    host_tools: dict[str, str | None] = field(default_factory=dict)
    saved_env: dict[str, str | None] = field(default_factory=dict, repr=False)

    def summary(self) -> str:
        return (f"firewall on ({len(self.names)} stand-ins in {self.bin_dir}, versions from {self.versions_from}: "
                f"{', '.join(self.answered) or 'none'}; events -> {self.event_log})")


_lock = threading.Lock()
_active: FirewallReport | None = None
_MARK = ".nojit-firewall"


def _real_toolkit() -> str | None:
    """The CUDA toolkit the fake root mirrors (headers, libraries): CUDA_HOME, CUDA_PATH, nvcc's, /usr/local/cuda."""
    candidates = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        candidates.append(os.path.dirname(os.path.dirname(os.path.realpath(nvcc))))
    candidates.append("/usr/local/cuda")
    for root in candidates:
        if root and os.path.isfile(os.path.join(root, "include", "cuda.h")) and not os.path.exists(os.path.join(root, _MARK)):
            return root
    return None


def _mirror(real: str | None, fw: str) -> None:
    """Symlink every entry of the real toolkit except the compilers (bin/, nvvm/bin/)."""
    if real is None:
        return
    for entry in os.listdir(real):
        if entry in ("bin", "nvvm"):
            continue
        os.symlink(os.path.join(real, entry), os.path.join(fw, entry))
    nvvm = os.path.join(real, "nvvm")
    if os.path.isdir(nvvm):
        for entry in os.listdir(nvvm):
            if entry != "bin":
                os.symlink(os.path.join(nvvm, entry), os.path.join(fw, "nvvm", entry))


def _toolchain_of(source: Any) -> tuple[dict, str]:
    if isinstance(source, dict):
        return source, "bundle"
    producer = getattr(source, "producer", source)
    recorded = getattr(producer, "toolchain", None)
    if recorded:
        return recorded, "bundle"
    if source is not None:  # a bundle without a record: strict mode starts no process to find versions
        return {}, "none"
    found = toolchain_mod.probe()
    return found, "installed tools" if found else "none"


def _write_answers(fw: str, toolchain: dict) -> tuple[str, ...]:
    answered = []
    for family, probes in toolchain.items():
        if not re.fullmatch(r"[A-Za-z0-9_.+-]+", family):
            continue
        folder = os.path.join(fw, "answers", family)
        os.makedirs(folder, exist_ok=True)
        for args, streams in probes.items():
            if args not in VERSION_PROBES:
                continue
            for stream in ("stdout", "stderr"):
                with open(os.path.join(folder, f"{args}.{stream}"), "w") as f:
                    f.write(streams.get(stream, ""))
        answered.append(family)
    return tuple(sorted(answered))


def _build(toolchain: dict, log: str) -> tuple[str, tuple[str, ...], tuple[str, ...], str | None]:
    """The firewall folder (a fake CUDA toolkit root): bin/, nvvm/bin/ and the script link to the shared stand-ins
    (_stand_ins), the real toolkit is mirrored around them, and the mark is written last. Named by the digest of
    all it holds and never removed, like the stand-ins: a child that outlives the process that made it (an orphan)
    still finds every stand-in at the paths its environment names, so it can never fall through to a real compiler
    on PATH. Built under a temporary name and renamed into place whole."""
    import hashlib

    names = stand_in_names()
    real = _real_toolkit()
    shared, answered = _stand_ins(names, toolchain, log)
    listing = _toolkit_listing(real)
    digest = hashlib.sha256(json.dumps([shared, real, listing]).encode()).hexdigest()
    fw = os.path.join(runtime_dir(), f"toolkit-{digest[:32]}")
    if _toolkit_complete(fw, digest):
        return fw, names, answered, real
    tmp = tempfile.mkdtemp(prefix="toolkit-tmp-", dir=runtime_dir())
    try:
        os.makedirs(os.path.join(tmp, "nvvm"))
        os.symlink(os.path.join(shared, "bin"), os.path.join(tmp, "bin"))
        os.symlink(os.path.join(shared, "nvvm-bin"), os.path.join(tmp, "nvvm", "bin"))
        os.symlink(os.path.join(shared, STAND_IN), os.path.join(tmp, STAND_IN))
        _mirror(real, tmp)
        with open(os.path.join(tmp, _MARK), "w") as f:
            f.write(digest + "\n")
        try:
            os.rename(tmp, fw)
            tmp = ""
        except OSError:  # another process put it there first (or a stale one is in the way)
            if not _toolkit_complete(fw, digest):
                shutil.rmtree(fw, ignore_errors=True)
                os.rename(tmp, fw)
                tmp = ""
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    return fw, names, answered, real


def _toolkit_listing(real: str | None) -> list[list[str]]:
    if real is None:
        return []
    nvvm = os.path.join(real, "nvvm")
    return [sorted(e for e in os.listdir(real) if e not in ("bin", "nvvm")),
            sorted(e for e in os.listdir(nvvm) if e != "bin") if os.path.isdir(nvvm) else []]


def _toolkit_complete(fw: str, digest: str) -> bool:
    try:
        with open(os.path.join(fw, _MARK)) as f:
            return f.read().strip() == digest and os.path.islink(os.path.join(fw, "bin"))
    except OSError:
        return False


_COMPLETE = ".complete"
STAND_IN = "nojit-stand-in"  # the one script every compiler name of the firewall links to


def is_stand_in(path: str) -> bool:
    """Whether `path` (a tool a library was pointed at, e.g. DG_JIT_NVCC_COMPILER) resolves to the firewall's stand-in
    script, whatever folder or name it is reached through."""
    return os.path.basename(os.path.realpath(path)) == STAND_IN and os.path.isfile(path)


def _stand_ins(names: tuple[str, ...], toolchain: dict, log: str) -> tuple[str, tuple[str, ...]]:
    """The stand-in script, one link per compiler name and the recorded version answers, in a folder of
    the runtime folder named by the digest of all of it: built once per user and content, then shared by
    every process (a TP4 server starts six), since 125 links per process cost most of install().
    Built under a temporary name and renamed into place whole; reused only when it is complete, its links
    are exactly `names` and its script is the one this process would write. Never removed (it is small;
    a different bundle toolchain or event log makes another)."""
    import hashlib

    answers = {fam: {a: {k: v for k, v in st.items() if k in ("stdout", "stderr")} for a, st in probes.items()
                     if a in VERSION_PROBES}
               for fam, probes in toolchain.items() if re.fullmatch(r"[A-Za-z0-9_.+-]+", fam)}
    digest = hashlib.sha256(json.dumps([_SCRIPT, FIX, log, names, answers], sort_keys=True).encode()).hexdigest()
    shared = os.path.join(runtime_dir(), f"stand-ins-{digest[:32]}")
    script = _script(shared, log, names)
    if not _stand_ins_complete(shared, names, script):
        tmp = tempfile.mkdtemp(prefix="stand-ins-tmp-", dir=runtime_dir())
        try:
            os.makedirs(os.path.join(tmp, "bin"))
            os.makedirs(os.path.join(tmp, "nvvm-bin"))
            path = os.path.join(tmp, STAND_IN)
            with open(path, "w") as f:
                f.write(script)
            os.chmod(path, 0o755)
            target = os.path.join(shared, STAND_IN)  # where it will be once renamed
            for name in names:
                os.symlink(target, os.path.join(tmp, "bin", name))
            os.symlink(target, os.path.join(tmp, "nvvm-bin", "cicc"))
            _write_answers(tmp, answers)
            with open(os.path.join(tmp, _COMPLETE), "w") as f:
                f.write(digest + "\n")
            try:
                os.rename(tmp, shared)
                tmp = ""
            except OSError:  # another process put it there first (or a stale one is in the way)
                if not _stand_ins_complete(shared, names, script):
                    shutil.rmtree(shared, ignore_errors=True)
                    os.rename(tmp, shared)
                    tmp = ""
        finally:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
    return shared, tuple(sorted(answers))


def _stand_ins_complete(shared: str, names: tuple[str, ...], script: str) -> bool:
    try:
        if not os.path.isfile(os.path.join(shared, _COMPLETE)):
            return False
        if sorted(os.listdir(os.path.join(shared, "bin"))) != sorted(names):
            return False
        if not os.path.islink(os.path.join(shared, "nvvm-bin", "cicc")):
            return False
        with open(os.path.join(shared, STAND_IN)) as f:
            return f.read() == script
    except OSError:
        return False


def _variables(fw: str) -> dict[str, str]:
    b = os.path.join(fw, "bin")
    path = os.environ.get("PATH", "")
    parts = [p for p in path.split(os.pathsep) if p and p != b]
    return {
        "PATH": os.pathsep.join([b, *parts]),
        "CUDA_HOME": fw,
        "CUDA_PATH": fw,
        "TRITON_PTXAS_PATH": f"{b}/ptxas",
        "TRITON_PTXAS_BLACKWELL_PATH": f"{b}/ptxas-blackwell",
        "TRITON_CUOBJDUMP_PATH": f"{b}/cuobjdump",
        "TRITON_NVDISASM_PATH": f"{b}/nvdisasm",
        "CUTE_DSL_PTXAS_PATH": f"{b}/ptxas",
        "DG_JIT_NVCC_COMPILER": f"{b}/nvcc",
        "TRTLLM_DG_NVCC_COMPILER": f"{b}/nvcc",
        "FLASHINFER_NVCC": f"{b}/nvcc",
        "CUDA_NVCC_PATH": f"{b}/nvcc",
        "CC": f"{b}/gcc",
        "CXX": f"{b}/g++",
        "NVCC": f"{b}/nvcc",
        "HUMMING_DISABLE_PARALLEL_BUILD": "1",
        "NOJIT_FIREWALL_DIR": fw,
    }


def _repoint_loaded(fw: str) -> None:
    """Module-level copies of CUDA_HOME taken at import, for modules already imported."""
    cpp_ext = sys.modules.get("torch.utils.cpp_extension")
    if cpp_ext is not None and hasattr(cpp_ext, "CUDA_HOME"):
        cpp_ext.CUDA_HOME = fw
    tl_env = sys.modules.get("tilelang.env")
    if tl_env is not None:
        for holder in (getattr(tl_env, "Environment", None), getattr(tl_env, "env", None), tl_env):
            if holder is not None and hasattr(holder, "CUDA_HOME"):
                try:
                    setattr(holder, "CUDA_HOME", fw)
                except (AttributeError, TypeError):
                    pass


def _inherited() -> str | None:
    fw = os.environ.get("NOJIT_FIREWALL_DIR")
    if fw and os.path.isfile(os.path.join(fw, _MARK)) and os.stat(fw).st_uid == os.getuid():
        return fw
    return None


def activate(source: Any = None) -> FirewallReport:
    """Put the firewall up for this process and its children (idempotent).

    source: the bundle's Index or Manifest (its producer.toolchain is used), a toolchain dict
    (toolchain.Toolchain), or None (probe the installed tools now, before the stand-ins go up).
    """
    global _active
    with _lock:
        if _active is not None:
            return _active
        log = event_log_path()
        os.makedirs(os.path.dirname(log) or ".", exist_ok=True)
        fw = _inherited()
        created = fw is None
        if created:
            toolchain, versions_from = _toolchain_of(source)
            fw, names, answered, real = _build(toolchain, log)
        else:
            names = tuple(sorted(os.listdir(os.path.join(fw, "bin"))))
            answers = os.path.join(os.path.dirname(os.path.realpath(os.path.join(fw, "bin"))), "answers")
            answered = tuple(sorted(os.listdir(answers))) if os.path.isdir(answers) else ()
            versions_from, real = "inherited", None
        host = {t: toolchain_mod.find_tool(t) for t in ("nvcc", "ptxas", "ninja", "gcc", "g++", "cc", "c++")} if created else {}
        env = _variables(fw)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        _repoint_loaded(fw)
        _active = FirewallReport(fw, os.path.join(fw, "bin"), log, names, env, versions_from, answered, real,
                                 created, host, saved)
        return _active


def active() -> FirewallReport | None:
    return _active


F = TypeVar("F", bound=Callable[..., Any])


def lowered_if_raises(fn: F) -> F:
    """Decorator for install(): a firewall this call raised comes down again when the call fails
    (a refused bundle must not leave PATH and CUDA_HOME pointing at stand-ins)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        was_up = _active is not None
        try:
            return fn(*args, **kwargs)
        except BaseException:
            if not was_up:
                deactivate()
            raise

    return call  # type: ignore[return-value]


def deactivate() -> None:
    """Take the firewall down (tests, uninstall): the variables get their old values. The folder stays (children
    may still use it; it is shared by every process of this user with the same toolchain)."""
    global _active
    with _lock:
        report, _active = _active, None
        if report is None:
            return
        for name, value in report.saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
