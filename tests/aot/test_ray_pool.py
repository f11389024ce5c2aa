"""`nojit build --ray`: the compile jobs on a Ray cluster give the bundle the process pool gives.

The test starts a local Ray head (`ray start --head --block`, 2 CPUs, on 127.0.0.1) in its own
process group and stops that group afterwards; it is skipped where Ray is not installed
(`pip install 'nojit[ray]'`).
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.support.common import SMALL_KERNELS, run_cli

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not importlib.util.find_spec("ray"), reason="Ray is not installed (nojit[ray])"),
              pytest.mark.skipif(not importlib.util.find_spec("vllm"), reason="vLLM is not installed")]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    port = _free_port()
    ray_cli = os.path.join(os.path.dirname(sys.executable), "ray")
    tmp = tmp_path_factory.mktemp("ray")
    # Ray >= 2.5x turns token authentication on for `ray start`; a private test cluster on 127.0.0.1 opts out
    saved_auth = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"  # inherited by the head and by the builds run_cli starts
    head = subprocess.Popen([ray_cli, "start", "--head", "--block", "--num-cpus", "2", "--node-ip-address", "127.0.0.1",
                             "--port", str(port), "--include-dashboard", "false", "--disable-usage-stats",
                             "--temp-dir", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while subprocess.run([ray_cli, "status", "--address", address], capture_output=True).returncode != 0:
            if head.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the Ray head did not start (exit {head.poll()})")
            time.sleep(2)
        yield address
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the head and the processes it started, nothing else
        try:
            head.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
        if saved_auth is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = saved_auth


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_ray_build_equals_the_process_pool_build(small_build, ray_cluster, tmp_path):
    out = str(tmp_path / "ray.nojit")
    run_cli("build", "--runtime", "triton", "--kernels", SMALL_KERNELS, "-o", out, "--ray", ray_cluster, "-j", "2",
            "--cache-dir", str(tmp_path / "cache"), "--quiet")
    assert _read(out) == _read(small_build["bundle"])


def test_two_deployments_at_once_share_compiles_and_equal_separate_builds(ray_cluster, tmp_path):
    text = run_cli("build", "--print-default-deployment").stdout
    other = text.replace('name = "', 'name = "other-', 1)
    other_path = tmp_path / "other.toml"
    other_path.write_text(_with_max_num_seqs(other, 64))
    default_path = tmp_path / "default.toml"
    default_path.write_text(text)
    kernels = "MTPSharedHeadRMSNormKernel,BuildC128ATopkMetadataKernel"
    common = ["--runtime", "triton", "--kernels", kernels, "-j", "2", "--quiet"]
    t0 = time.monotonic()
    both = run_cli("build", "--deployment", str(default_path), "--deployment", str(other_path), "-o",
                   str(tmp_path / "both"), "--ray", ray_cluster, "--cache-dir", str(tmp_path / "c-both"), *common)
    together_s = time.monotonic() - t0
    t1 = time.monotonic()
    alone = []
    for name, path in (("default", default_path), ("other", other_path)):
        out = str(tmp_path / f"{name}.nojit")
        run_cli("build", "--deployment", str(path), "-o", out, "--cache-dir", str(tmp_path / f"c-{name}"), *common)
        alone.append(out)
    separate_s = time.monotonic() - t1
    outputs = both.stdout.strip().splitlines()[:2]
    assert [_read(p) for p in outputs] == [_read(p) for p in alone]
    print(f"\n{both.stdout.strip().splitlines()[-1]}\ntwo deployments at once on Ray {together_s:.1f}s, "
          f"separately with the process pool {separate_s:.1f}s")


def _with_max_num_seqs(text: str, value: int) -> str:
    lines = []
    for line in text.splitlines():
        if line.strip().startswith("max_num_seqs"):
            line = f"max_num_seqs = {value}"
        lines.append(line)
    return "\n".join(lines) + "\n"
