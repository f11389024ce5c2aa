"""Air-gapped install: a wheelhouse installed with `pip install --no-index` and no compiler anywhere.

Build box part (compilers allowed): the nojit wheel (`pip wheel --no-deps`: the abi3 cffi
launcher compiled here), a small real bundle and its wheel (`nojit package`), and the wheels
of their needs (cffi, pycparser, zstandard) in one folder.

Serving image part (PATH is a folder of symlinks to a few shell tools only, so gcc, cc,
c++, nvcc and ptxas are unreachable, and CC/CXX are unset): a fresh virtual environment,
`pip install --no-index --find-links WHEELHOUSE <bundle wheel>` (which pulls the pinned nojit
wheel and its needs from the wheelhouse), then tests/probes/probe_offline_install.py finds the
installed bundle with no configuration, checks its sha256, installs it in strict mode and
resolves every key of the plan.

vLLM, torch and Triton are what a serving image already has, and 9 GB is no test fixture:
the fresh environment sees them through a folder of symlinks to the build environment's
site-packages entries *minus* nojit, cffi, pycparser and zstandard (and every .pth), so pip
must satisfy the bundle wheel's exact vllm/triton pins from them and must take nojit and
its needs from the wheelhouse, and the kernels the loader patches are vLLM's real ones.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

from tests.support.common import ROOT, run_cli

pytestmark = pytest.mark.offline_install

NEEDS = ("cffi", "pycparser", "zstandard")
NOT_LAYERED = ("nojit", "_nojit", "__editable__", "cffi", "_cffi_backend", "pycparser", "zstandard")
SHELL_TOOLS = ("sh", "bash", "env", "uname", "cat", "ls", "ldconfig")


def _sh(cmd: list[str], env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p


def _build_nojit_wheel(wheelhouse: str) -> None:
    base = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheelhouse, ROOT]
    try:
        _sh(base[:4] + ["--no-build-isolation"] + base[4:])  # the environment's setuptools and cffi
    except AssertionError:
        _sh(base)  # an environment whose setuptools cannot build wheels: pip's isolated build


def _compiler_free_path(folder: str) -> str:
    os.makedirs(folder)
    for tool in SHELL_TOOLS:
        found = shutil.which(tool) or shutil.which(tool, path="/sbin:/usr/sbin")
        if found:
            os.symlink(found, os.path.join(folder, tool))
    return folder


def _layer_of_serving_packages(folder: str) -> str:
    """Symlinks to the site-packages entries holding vLLM, minus nojit and its needs."""
    site = str(importlib.metadata.distribution("vllm").locate_file(""))
    os.makedirs(folder)
    for name in sorted(os.listdir(site)):
        if name.endswith(".pth") or name.lower().startswith(NOT_LAYERED):
            continue
        os.symlink(os.path.join(site, name), os.path.join(folder, name))
    return folder


@pytest.mark.skipif(not importlib.util.find_spec("vllm"), reason="vLLM is not installed")
def test_wheelhouse_installs_offline_and_serves_with_no_compiler(small_build, tmp_path):
    from nojit.loader.bundle.installed import file_sha256

    t0 = time.monotonic()
    wheelhouse = str(tmp_path / "wheelhouse")
    _build_nojit_wheel(wheelhouse)
    out = run_cli("package", small_build["bundle"], "-o", wheelhouse).stdout
    versions = [f"{n}=={importlib.metadata.version(n)}" for n in NEEDS]
    _sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", "-d", wheelhouse, *versions])
    wheels = {w: os.path.getsize(os.path.join(wheelhouse, w)) for w in sorted(os.listdir(wheelhouse))}
    nojit_wheel = next(w for w in wheels if w.startswith("nojit-"))
    bundle_wheel = next(w for w in wheels if w.startswith("nojit_bundle_"))
    assert "abi3" in nojit_wheel, nojit_wheel
    with zipfile.ZipFile(os.path.join(wheelhouse, bundle_wheel)) as zf:
        meta = zf.read(next(n for n in zf.namelist() if n.endswith("METADATA"))).decode()
    for dist in ("nojit", "vllm", "triton"):
        assert f"Requires-Dist: {dist}=={importlib.metadata.version(dist)}" in meta, meta
    build_box_s = time.monotonic() - t0

    # serving image: no compiler from here on
    env = {k: v for k, v in os.environ.items() if k not in ("CC", "CXX", "CUDA_HOME", "NOJIT_BUNDLE", "PYTHONPATH")}
    env["PATH"] = _compiler_free_path(str(tmp_path / "bin"))
    env["PIP_NO_INDEX"] = "1"
    venv = tmp_path / "serving-venv"
    t1 = time.monotonic()
    _sh([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], env=env)  # pip: the image's (layer)
    py = str(venv / "bin" / "python")
    site = _sh([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], env=env).stdout.strip()
    with open(os.path.join(site, "zz_serving_image.pth"), "w") as f:
        f.write(_layer_of_serving_packages(str(tmp_path / "serving-image-packages")) + "\n")
    t2 = time.monotonic()
    pip = _sh([py, "-m", "pip", "install", "--no-index", "--find-links", wheelhouse, "--no-cache-dir",
               os.path.join(wheelhouse, bundle_wheel)], env=env)
    install_s = time.monotonic() - t2
    installed = _sh([py, "-m", "pip", "list", "--path", site, "--format", "json"], env=env).stdout
    names = {d["name"].lower().replace("_", "-") for d in json.loads(installed)}
    assert {"nojit", "cffi", "pycparser", "zstandard"} <= names, names  # from the wheelhouse, not the layer

    probe = _sh([py, os.path.join(ROOT, "tests", "probes", "probe_offline_install.py"), small_build["plan"]], env=env,
                timeout=600)
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    plan = json.load(open(small_build["plan"]))
    assert report["resolved"]["exact"] + report["resolved"]["generic"] == len(plan["requests"])
    assert report["bundle"]["sha256"] == file_sha256(small_build["bundle"])
    assert "sha256" in report["tampered"]
    print(f"\nwheelhouse: " + ", ".join(f"{w} {s / 1e6:.2f} MB" for w, s in wheels.items()))
    print(f"build box {build_box_s:.1f}s, venv {t2 - t1:.1f}s, pip install --no-index {install_s:.1f}s, "
          f"resolved {report['resolved']}, {report['verified_cubins']} cubins verified\n{out}")
    print(json.dumps({k: report[k] for k in ("compilers_on_path", "nojit_from", "launcher", "bundle", "tampered")}))
