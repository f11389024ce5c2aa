"""Shared fixtures. CPU tests build small real bundles once per session, through the CLI in a
subprocess (a build installs a deployment platform into its process; the test process stays clean)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HAS_GPU = os.path.exists("/dev/nvidiactl")

# Landlock is irreversible: the test process itself never restricts itself (its later tests build with gcc and
# nvcc); the processes tests start do, in strict mode (loader/strict/landlock.py).
from nojit.loader.strict import landlock as _landlock  # noqa: E402

_landlock.exempt_this_process()

if not HAS_GPU:
    # vLLM keeps real Triton JITFunctions without a driver only with an empty device list.
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


def have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


needs_vllm = pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed (install with the README's test command)")


def run_cli(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    p = subprocess.run([sys.executable, "-m", "nojit.aot.cli", *args], capture_output=True, text=True, env=full_env)
    if check and p.returncode != 0:
        raise AssertionError(f"nojit {' '.join(args)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr[-4000:]}")
    return p


# Three report kernels with 13 keys between them: small enough to build in about a minute.
SMALL_KERNELS = "BuildC128ATopkMetadataKernel,MTPSharedHeadRMSNormKernel,ComputePrefillMetadataKernel"


@pytest.fixture(scope="session")
def small_build(tmp_path_factory):
    """A real Triton bundle of three report kernels (exact + generic entries) and its plan."""
    if not have("vllm"):
        pytest.skip("vLLM is not installed")
    d = tmp_path_factory.mktemp("small")
    bundle, plan = str(d / "small.nojit"), str(d / "small.plan.json")
    run_cli("build", "--runtime", "triton", "--kernels", SMALL_KERNELS, "-o", bundle, "--emit-plan", plan,
            "--cache-dir", str(d / "cache"), "--quiet")
    return {"bundle": bundle, "plan": plan, "dir": d}
