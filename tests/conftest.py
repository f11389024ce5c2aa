"""Shared fixtures. CPU tests build small real bundles once per session, through the CLI in a
subprocess (a build installs a deployment platform into its process; the test process stays clean)."""

from __future__ import annotations

import os

import pytest

# Landlock is irreversible: the test process itself never restricts itself (its later tests build with gcc and
# nvcc); the processes tests start do, in strict mode (loader/strict/landlock.py).
from nojit.loader.strict import landlock as _landlock  # noqa: E402

from tests.support.common import HAS_GPU, SMALL_KERNELS, have, run_cli  # noqa: E402

_landlock.exempt_this_process()

if not HAS_GPU:
    # vLLM keeps real Triton JITFunctions without a driver only with an empty device list.
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")


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


@pytest.fixture(autouse=True)
def _tritons_driver_is_left_as_found():
    """A test that leaves another Triton driver active (the build's offline driver, a stand-in) changes what every
    later test of this process meets; the leak is named here, at the test that made it, and undone."""
    try:
        from triton.runtime import driver
    except ImportError:
        yield
        return
    before = driver._active
    yield
    after = driver._active
    if after is not before and type(after).__name__ == "OfflineDriver":
        driver._active = before
        pytest.fail("this test left the build's offline Triton driver active: plan or compile in "
                    "`with offline_driver():` (aot/runtimes/triton/compiler.py)")
