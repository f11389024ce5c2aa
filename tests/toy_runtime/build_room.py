"""The toy runtime's build face (as aot/runtimes/<runtime>/ exports one): two keys of one kernel, each
"compiled" into a blob that names its key."""

from __future__ import annotations

import hashlib
import json

from nojit.aot.faces import CompileResult, Runtime
from nojit.aot.plan import PlanKernel, PlanRequest

from toy_launch import ToyLaunch

KERNEL = "toy_kernels:scale"
SIZES = (64, 128)
SOURCE_HASH = hashlib.sha256(b"toy kernel source").hexdigest()


def plan(p, deployment, model, selection) -> None:
    if not selection.wants(KERNEL):
        return
    p.add_kernel(KERNEL, PlanKernel("toy", SOURCE_HASH, ["n"], {}))
    for n in SIZES:
        p.add(PlanRequest(KERNEL, {"n": n}, "exact", "toy:sizes"))


def compile(request, kernel_id, kernel, settings) -> CompileResult:
    n = request.key["n"]
    blob = b"TOYCUBIN" + json.dumps(request.key, sort_keys=True).encode()
    return CompileResult(cubin=blob, launch=ToyLaunch(f"scale_{n}", n // 32), source_hash=kernel.source_hash)


RUNTIME = Runtime(name="toy", plan=plan, prepare_worker=lambda settings: None, compile=compile)
