"""The C launcher: its ABI declarations against the real cuda.h, and what it hands the driver.

A stand-in libcuda.so.1 (tests/csrc/fake_libcuda.c) records every launch: grid, block,
shared memory, stream, launch attributes and the bytes of each kernel parameter.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CSRC = os.path.join(os.path.dirname(os.path.dirname(HERE)), "csrc")
CUDA_INCLUDE = next((d for d in ("/usr/local/cuda/include", "/usr/include") if os.path.exists(f"{d}/cuda.h")), None)


@pytest.mark.skipif(CUDA_INCLUDE is None or shutil.which("cc") is None, reason="needs cuda.h and a C compiler")
def test_abi_declarations_match_cuda_h(tmp_path):
    out = tmp_path / "abi"
    p = subprocess.run(["cc", "-std=c11", "-I", CUDA_INCLUDE, "-I", CSRC, os.path.join(HERE, "abi_check.c"),
                        "-o", str(out)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    if shutil.which("cc") is None:
        pytest.skip("needs a C compiler to build the stand-in driver")
    d = tmp_path_factory.mktemp("fakecuda")
    lib = d / "libcuda.so.1"
    subprocess.run(["cc", "-shared", "-fPIC", "-I", CSRC, os.path.join(HERE, "fake_libcuda.c"), "-o", str(lib)],
                   check=True)
    return d


def run_with_fake(fake_driver, tmp_path, body: str) -> list[str]:
    log = tmp_path / "launch.log"
    script = textwrap.dedent(
        """
        from nojit.loader.launch.cuda_launch import CudaLauncher
        L = CudaLauncher()
        """
    ) + textwrap.dedent(body)
    env = {**os.environ, "LD_LIBRARY_PATH": str(fake_driver), "FAKE_CUDA_LOG": str(log)}
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stderr
    return log.read_text().splitlines() if log.exists() else []


def bits(x: float) -> int:
    import struct

    return struct.unpack("<Q", struct.pack("<d", x))[0]


def test_arguments_reach_the_driver_byte_exact(fake_driver, tmp_path):
    lines = run_with_fake(fake_driver, tmp_path, f"""
        f = L.function(0, "blob", lambda: b"FAKE kern 8,4,4,8,2,1,4,2,2,8,8\\0", "kern", 70000)
        L.launch(f.function, (6, 2, 1), (128, 1, 1), 70000, 77, b"piulhcfebpp",
                 [0xdead0000beef, (-16) & 0xFFFFFFFFFFFFFFFF, 0xFFFFFFFF, 2**40 + 3, 65535, 1,
                  {bits(1.5)}, {bits(1.5)}, {bits(-2.0)}, 0, 0], (1, 1, 1), True, False)
        L.launch(f.function, (4, 1, 1), (64, 1, 1), 0, 0, b"piulhcfebpp", [0] * 11, (2, 1, 1), False, True)
        L.launch(f.function, (0, 1, 1), (64, 1, 1), 0, 0, b"piulhcfebpp", [0] * 11, (1, 1, 1), False, False)
    """)
    assert lines[0] == "setattr 8=70000"  # >48 KiB dynamic shared memory is opted into at load
    first = lines[1]
    assert "grid=6,2,1 block=128,1,1 smem=70000 stream=77 nattrs=1 attrs=6:1," in first
    params = first.split("params=")[1].split(",")
    assert params == ["0000dead0000beef", "fffffff0", "ffffffff", "0000010000000003", "ffff", "01",
                      "3fc00000", "3e00", "c000", "0000000000000000", "0000000000000000"]
    second = lines[2]
    assert "grid=4,1,1" in second and "nattrs=3" in second and "4:2.1.1," in second and "5:1," in second and "2:1," in second
    assert len(lines) == 3  # a zero-sized grid launches nothing


def test_driver_errors_are_typed_and_named(fake_driver, tmp_path):
    lines = run_with_fake(fake_driver, tmp_path, """
        from nojit.loader.errors import LaunchError
        try:
            L.function(0, "b", lambda: b"\\x7fELF not a fake cubin", "kern", 0)
        except LaunchError as e:
            assert "cuModuleLoadData failed: CUDA_ERROR_INVALID_IMAGE" in str(e), e
            assert "another GPU architecture" in e.fix
        else:
            raise SystemExit("no error")
        f = L.function(0, "ok", lambda: b"FAKE kern 8\\0", "kern", 0)
        try:
            L.launch(f.function, (1, 1, 1), (32, 1, 1), 0, 0, b"pq", [0, 0], (1, 1, 1), False, False)
        except LaunchError as e:
            assert "unknown type code 'q'" in str(e), e
        else:
            raise SystemExit("no error")
    """)
    assert lines == []


def test_no_driver_is_a_clear_error(tmp_path):
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path)}
    code = textwrap.dedent("""
        from nojit.loader.launch.cuda_launch import CudaLauncher
        from nojit.loader.errors import LaunchError
        try:
            CudaLauncher().driver_version()
        except LaunchError as e:
            print(e)
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if "libcuda.so.1" not in p.stdout:
        pytest.skip("a real libcuda.so.1 is installed here")
    assert "cannot open libcuda.so.1" in p.stdout and "fix: run on a machine with the NVIDIA driver" in p.stdout


def test_a_cluster_out_of_range_is_refused_not_dropped(fake_driver, tmp_path):
    """(65536, 65536, 1) wraps to 0 in 32 bits: the launch must fail, never go out without its cluster."""
    lines = run_with_fake(fake_driver, tmp_path, """
        from nojit.loader.errors import LaunchError
        f = L.function(0, "ok", lambda: b"FAKE kern 8\\0", "kern", 0)
        for cluster in ((65536, 65536, 1), (0, 1, 1), (17, 1, 1), (4, 4, 2)):
            try:
                L.launch(f.function, (1, 1, 1), (32, 1, 1), 0, 0, b"p", [0], cluster, False, False)
            except LaunchError as e:
                assert "cluster" in str(e), e
            else:
                raise SystemExit(f"cluster {cluster} launched")
        L.launch(f.function, (2, 1, 1), (32, 1, 1), 0, 0, b"p", [0], (2, 1, 1), False, False)
    """)
    assert len(lines) == 1 and "4:2.1.1," in lines[0]


def test_a_bundled_function_loads_once_per_device_checks_its_threads_and_names_its_entry(fake_driver, tmp_path):
    """The Python side of the launcher (cuda_launch.BundledFunction): one module load per device however often it
    is asked, the device check once per device, a block larger than the cubin allows refused (equal is fine),
    and a driver refusal that names the kernel, the variant, the key (sorted) and the bundle, with the right fix."""
    launches = run_with_fake(fake_driver, tmp_path, """
        from nojit.loader.launch.cuda_launch import BundledFunction, launcher, _fix_for
        from nojit.loader.errors import LaunchError

        assert launcher() is launcher() and launcher().loads == 0
        assert L.driver_version() == 13000

        class Entry:
            kernel, variant, key, blob = "m:k", "exact", {"b": 2, "a": 1}, "blob-1"

        class Bundle:
            path = "/b/served.nojit"
            reads = 0
            def __init__(self, image):
                self.image = image
            def read_blob(self, blob):
                Bundle.reads += 1
                return self.image

        checked = []
        launcher().device_check = checked.append
        good = Bundle(b"FAKE kern 8\\0")
        for threads in (None, 512, 1024):  # the fake cubin allows 1024 threads per block
            fn = BundledFunction(good, Entry(), "kern", 0, threads)
            assert fn.load(0) == fn.load(0) != 0
        assert launcher().loads == 1 and Bundle.reads == 1 and checked == [0]  # cached per (device, blob)
        try:
            BundledFunction(good, Entry(), "kern", 0, 2048).load(0)
        except LaunchError as e:
            assert "m:k: 2048 threads per block, the cubin allows 1024" in str(e), e
        else:
            raise SystemExit("2048 threads accepted")

        class Other(Entry):
            blob = "blob-2"
        try:
            BundledFunction(Bundle(b"\\x7fELF not a fake cubin"), Other(), "kern", 0, None).load(0)
        except LaunchError as e:
            text = str(e)
            assert 'kernel m:k, exact key {"a":1,"b":2}, bundle /b/served.nojit' in text, text
            assert "CUDA_ERROR_INVALID_IMAGE" in text and "another GPU architecture" in e.fix, (text, e.fix)
        else:
            raise SystemExit("a damaged cubin loaded")
        assert launcher().loads == 1

        class Long(Entry):
            key = {"k": "x" * 400}
        where = BundledFunction(good, Long(), "kern", 0, None).where()
        assert '{"k":"' + "x" * 294 + ", bundle" in where, where  # the key is cut at 300 characters

        f = L.function(0, "xyz", lambda: b"FAKE kern 8\\0", "kern", 0)  # every axis distinct: none swapped
        L.launch(f.function, (4, 2, 8), (8, 4, 2), 0, 0, b"p", [0], (1, 2, 4), False, False)
        fn = BundledFunction(good, Entry(), "kern", 0, None)  # the hot path: the entry's own C entry point and buffer
        assert fn._c_launch(fn.load(0), 3, 1, 1, 64, 1, 1, 0, 0, b"p", [0], 1, 1, 1, 1, 0, 0, fn._err, 512) == 0

        assert "driver is too old" in _fix_for("CUDA_ERROR_UNSUPPORTED_PTX_VERSION")
        assert "driver is too old" in _fix_for("CUDA_ERROR_INVALID_PTX")
        assert "another GPU architecture" in _fix_for("CUDA_ERROR_NO_BINARY_FOR_GPU")
        assert "NVIDIA driver installed" in _fix_for("cannot open libcuda.so.1")
        assert "NOJIT_MODE=permissive" in _fix_for("CUDA_ERROR_LAUNCH_FAILED")
    """)
    assert len(launches) == 2 and "grid=4,2,8 block=8,4,2" in launches[0] and "4:1.2.4," in launches[0], launches
    assert "grid=3,1,1 block=64,1,1" in launches[1], launches
