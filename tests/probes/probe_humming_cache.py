"""Run by tests/loader/runtimes/humming/test_cache.py in a subprocess: Humming's key is machine-bound, nojit's seed is not.

1. Build box: one kernel compiled with Humming's own NVRTC path (its `nvrtc_compile` child, NVRTC from the
   nvidia-cuda-nvrtc wheel) into a scratch cache; its key (the cache folder name) and cubin are kept.
2. Serving machine, simulated in the same process by what differs between two installs: the headers'
   mtimes (pip writes install time) and the install path the mtime table names. Humming's key changes, so a
   copied cache would miss. nojit's seed lets Humming compute the key and write its layout with the bundled
   cubin; Humming's own lookup then hits while its compile step (`_compile`, which starts the NVRTC child)
   is replaced by a function that fails the probe, and the audit hook sees no process start.

Prints one JSON line. usage: probe_humming_cache.py SCRATCH_DIR
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import types

scratch = sys.argv[1]
os.environ["HUMMING_DISABLE_PARALLEL_BUILD"] = "1"  # Humming's import-time background build of its helper
import humming.device as hd  # noqa: E402

hd.current_device._value = types.SimpleNamespace(is_ppu=False, sm_version=90)  # no GPU here: an sm_90 stand-in
from humming.jit.compiler import Compiler, NVRTCCompiler  # noqa: E402

from nojit.loader.runtimes.humming import cache as humming_cache  # noqa: E402

CODE = r'''
extern "C" __global__ void nojit_probe_kernel(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = x[i] * 2.0f + 1.0f;
}
'''
out: dict = {"nvrtc": NVRTCCompiler.signature(), "headers_digest": humming_cache.headers_digest()}

# 1. build box
os.environ["HUMMING_CACHE_DIR"] = os.path.join(scratch, "build-cache")
built = NVRTCCompiler.compile(CODE, sm_version="90a", kernel_expr=None)
cubin = open(built, "rb").read()
digest = hashlib.sha256(cubin).hexdigest()
out["build_key"] = os.path.basename(os.path.dirname(built))
out["cubin_bytes"] = len(cubin)
out["cubin_is_elf"] = cubin[:4] == b"\x7fELF"

# 2. serving machine: other mtimes, other install path
real_mtimes = Compiler.cuh_last_update_time
real_include = Compiler.humming_include_dir


def other_mtimes() -> str:
    data = json.loads(real_mtimes())
    return json.dumps({k.replace(real_include(), "/srv/venv/humming/include"): v + 86400.0 for k, v in data.items()})


Compiler.cuh_last_update_time = staticmethod(other_mtimes)
os.environ["HUMMING_CACHE_DIR"] = os.path.join(scratch, "serving-cache")
events: list[str] = []
sys.addaudithook(lambda e, a: events.append(e) if e in ("subprocess.Popen", "os.exec", "os.posix_spawn") else None)
seeded = humming_cache.seed(NVRTCCompiler, CODE, "90a", None, False, False, cubin, digest)
out["serving_key"] = os.path.basename(os.path.dirname(seeded))
out["seeded_read_only"] = not os.access(seeded, os.W_OK) or os.geteuid() == 0 and (os.stat(seeded).st_mode & 0o222) == 0


def refuse(*args, **kwargs):
    raise RuntimeError("Humming tried to compile (cache miss)")


NVRTCCompiler._compile = classmethod(refuse)
hit = NVRTCCompiler.compile(CODE, sm_version="90a", kernel_expr=None)  # Humming's own lookup, as prepare() does
out["hit_path_is_seeded"] = hit == seeded
out["hit_sha256_is_bundled"] = hashlib.sha256(open(hit, "rb").read()).hexdigest() == digest
out["processes_while_serving"] = events
try:  # a kernel the seed did not place: Humming's compile step is reached (refused here)
    NVRTCCompiler.compile(CODE + "\n// other\n", sm_version="90a", kernel_expr=None)
    out["miss"] = "compiled"
except RuntimeError as exc:
    out["miss"] = str(exc)
print(json.dumps(out))
