"""Writes a small plan of real vLLM FLA autotuned kernels (tests/loader/runtimes/triton/test_autotune.py): run as a script, since
enumeration installs the deployment platform into its process. Usage: autotune_plan.py PLAN.json"""

from __future__ import annotations

import os
import sys

os.environ["CUDA_VISIBLE_DEVICES"] = ""

CUMSUM = "vllm.third_party.flash_linear_attention.ops.cumsum"
SCALAR = f"{CUMSUM}:chunk_local_cumsum_scalar_kernel"
VECTOR = f"{CUMSUM}:chunk_local_cumsum_vector_kernel"


def calls(cumsum) -> list:
    """The call sites the test serves: FLA's public function on a scalar and a vector gate (two tuning keys each
    way of H), as vLLM's GDN prefill calls it (chunk size 64, float32 output)."""
    import torch

    return [
        lambda: cumsum.chunk_local_cumsum(torch.zeros(1, 128, 4, dtype=torch.float32), 64),
        lambda: cumsum.chunk_local_cumsum(torch.zeros(1, 128, 8, dtype=torch.bfloat16), 64),
        lambda: cumsum.chunk_local_cumsum(torch.zeros(1, 128, 4, 32, dtype=torch.float32), 64),
    ]


def main(path: str) -> None:
    from nojit.aot.plan import Plan
    from nojit.aot.runtimes.triton.compiler import install_offline_driver
    from nojit.aot.runtimes.triton.enumeration import enumerate_calls
    from nojit.aot.runtimes.triton.planner import add_requests
    from nojit.aot.vllm_env import PlatformFacts, import_kernel_module, install_deployment_platform
    from nojit.loader.bundle.versions import installed_version

    install_deployment_platform(PlatformFacts())
    install_offline_driver()
    cumsum = import_kernel_module(CUMSUM)
    plan = Plan({"name": "fla-autotune-test", "platform": PlatformFacts().as_dict()}, installed_version("vllm"))
    for i, call in enumerate(calls(cumsum)):
        add_requests(plan, enumerate_calls(call, f"test:call{i}"), None, "tests/probes/probe_autotune_plan.py")
    plan.write(path)


if __name__ == "__main__":
    main(sys.argv[1])
