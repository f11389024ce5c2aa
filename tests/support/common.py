"""What many tests share, importable from every test folder as `tests.support.common` (the repository root is on
sys.path: pytest puts it there because tests/ is a package; a probe run as a script inserts it itself)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TESTS = os.path.join(ROOT, "tests")
PROBES = os.path.join(TESTS, "probes")
GPU_CHECKS = os.path.join(TESTS, "gpu", "checks")
HAS_GPU = os.path.exists("/dev/nvidiactl")


def have(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


needs_vllm = pytest.mark.skipif(not have("vllm"), reason="vLLM is not installed (install with the README's test command)")


def run_cli(*args: str, env: dict | None = None, check: bool = True) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    p = subprocess.run([sys.executable, "-m", "nojit.aot.cli", *args], capture_output=True, text=True, env=full_env)
    if check and p.returncode != 0:
        raise AssertionError(f"nojit {' '.join(args)} exited {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr[-4000:]}")
    return p


def need_deepgemm_toolkit() -> None:
    """Skip where DeepGEMM's enumeration cannot run: no CUDA toolkit (cuda.h, nvcc --version) or no C compiler."""
    import shutil

    from nojit.aot.runtimes.deepgemm import enumerate as en

    try:
        en.find_nvcc()
    except Exception:  # noqa: BLE001
        pytest.skip("no CUDA toolkit (cuda.h, nvcc --version) on this box")
    if not shutil.which(os.environ.get("CC", "cc")):
        pytest.skip("no C compiler")


# Three report kernels with 13 keys between them: small enough to build in about a minute.
SMALL_KERNELS = "BuildC128ATopkMetadataKernel,MTPSharedHeadRMSNormKernel,ComputePrefillMetadataKernel"
