"""On the GPU: nojit's torch-answered Triton driver gives the answers Triton's own driver gives, and with an
empty TRITON_CACHE_DIR deriving a kernel's key (Triton's own binder, as vLLM's warmup registry does) builds
no `cuda_utils` and creates no real driver. Each side runs in a fresh process (a driver is per process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = '''
import json, os, sys
import torch, triton
import triton.language as tl
if sys.argv[1] == "answered":
    from nojit.loader.runtimes.triton.driver import answer_from_torch
    answered = answer_from_torch()

@triton.jit
def kernel(x_ptr, n, BLOCK: tl.constexpr):
    pass

torch.cuda.set_device(0)
drv = triton.runtime.driver.active
dev = drv.get_current_device()
binder = kernel.device_caches[dev][-1]  # Triton's create_binder: asks get_current_target()
_, spec, options = binder(torch.empty(16, device="cuda"), 16, BLOCK=64, debug=False, instrumentation_mode="")
out = {"device": dev, "target": repr(drv.get_current_target()), "capability": list(drv.get_device_capability(dev)),
       "stream_is_torch": drv.get_current_stream(dev) == torch.cuda.current_stream().cuda_stream,
       "spec": repr(spec),
       "real_driver_created": triton.runtime.driver._default is not None,
       "cache": sorted(os.listdir(os.environ["TRITON_CACHE_DIR"]))}
print("RESULT " + json.dumps(out))
'''


def run(tmp_path, side: str) -> dict:
    script = tmp_path / "driver_check.py"
    script.write_text(SCRIPT)
    cache = tmp_path / f"cache-{side}"
    cache.mkdir()
    p = subprocess.run([sys.executable, str(script), side], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "TRITON_CACHE_DIR": str(cache)})
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, p.stderr[-3000:]
    return json.loads(line[0].removeprefix("RESULT "))


def test_torch_answers_are_tritons_and_build_no_cuda_utils(tmp_path):
    real = run(tmp_path, "real")
    answered = run(tmp_path, "answered")
    for field in ("device", "target", "capability", "stream_is_torch", "spec"):
        assert answered[field] == real[field], field
    assert real["real_driver_created"] and real["cache"], "Triton's own driver built cuda_utils into its cache"
    assert answered["real_driver_created"] is False and answered["cache"] == []
