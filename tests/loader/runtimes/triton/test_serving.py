"""The loader on a machine with no GPU: install checks, strict/permissive/record policy, guards.

Launching needs a GPU; here a bundled key must get as far as the C launcher (which reports
the missing driver as a typed LaunchError), and nothing may ever compile.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from tests.support.common import needs_vllm
from nojit.aot.bundle_writer import write_bundle
from nojit.loader.strict import guards
from nojit.loader.bundle.file import Bundle
from nojit.loader.errors import BundleMismatchError, CompileForbiddenError, KernelNotInBundleError, LaunchError
from nojit.loader.install import install
from nojit.loader.bundle.manifest import KernelRecord

C128A = "vllm.models.deepseek_v4.sparse_mla:BuildC128ATopkMetadataKernel.kernel"


@pytest.fixture
def installed(small_build):
    insts = []

    def _install(path=None, **kw):
        inst = install(path or small_build["bundle"], **kw)
        insts.append(inst)
        return inst

    yield _install
    for inst in insts:
        inst.uninstall()


def c128a_args(block_table_dtype=torch.int32, unaligned=False):
    i32 = lambda n=64: torch.zeros(n, dtype=torch.int32)
    bt = torch.zeros(65, dtype=block_table_dtype)
    return dict(
        global_decode_ptr=i32(), global_decode_stride=1, decode_lens_ptr=i32(), prefill_local_ptr=i32(),
        prefill_local_stride=1, positions_ptr=torch.zeros(64, dtype=torch.int64), compress_ratio=128,
        max_compressed_tokens=8192, num_decode_tokens=0, token_to_req_indices_ptr=i32(),
        block_table_ptr=bt[1:] if unaligned else bt[:64], block_table_stride=1, block_size=2,
        slot_mapping_ptr=torch.zeros(64, dtype=torch.int64), BLOCK_SIZE=1024,
    )


def kernel():
    import vllm.models.deepseek_v4.sparse_mla as m

    return m.BuildC128ATopkMetadataKernel.kernel


@needs_vllm
def test_bundled_key_goes_straight_to_the_launcher(installed):
    inst = installed(mode="strict")
    server = inst.servers("triton")[C128A]
    assert kernel().run == server.entry_point == server._first_call  # installed, not prepared yet
    assert inst.bundle._sections == {} and inst.bundle._parts == {}  # install() decoded no kernel's entries
    before = len(guards.compile_attempts)  # the list is per process; earlier tests refused compilers on purpose
    with pytest.raises(LaunchError, match="libcuda.so.1|NVIDIA driver") as info:
        kernel()[(4,)](**c128a_args())
    assert "fix:" in str(info.value)
    assert guards.compile_attempts[before:] == []
    # the first call read this kernel's section only, and of it the exact entries (the generic ones: at a miss)
    assert list(inst.bundle._parts) == [(C128A, "exact")] and inst.bundle._sections == {}
    assert kernel().run == server.entry_point != server._first_call  # prepared: the one-call C path


@needs_vllm
def test_warmup_of_a_bundled_key_returns_without_compiling(installed):
    inst = installed(mode="strict")
    variant = kernel().warmup(grid=(1,), **c128a_args())
    assert variant is inst.servers("triton")[C128A].exact[next(iter(inst.servers("triton")[C128A].exact))]


@needs_vllm
def test_unaligned_pointer_falls_back_to_the_generic_entry(installed):
    inst = installed(mode="strict")
    with pytest.raises(LaunchError):
        kernel()[(4,)](**c128a_args(unaligned=True))
    assert inst.policy.summary() == {"generic": 1}


@needs_vllm
def test_generic_entry_is_chosen_by_the_call_divisibility(installed):
    from nojit.loader.bundle.triton_key import generic_spec, key_from_json, layout_spec

    inst = installed(mode="strict")
    server = inst.servers("triton")[C128A]
    (spec, okey), = list(server.exact)
    rp = server._runtime_param
    laid_out = (layout_spec(spec, rp), okey)
    assert {key_from_json(v.entry.key) for v in server.generic.values()} == {laid_out, (generic_spec(spec, rp), okey)}
    # The call's own divisibility pattern: the entry laid out for it.
    assert key_from_json(server.fallback_for((spec, okey)).entry.key) == laid_out
    # A pattern with no entry of its own (one pointer unaligned): the nearest pattern of its group.
    index = next(i for i, (ty, attr) in enumerate(spec) if ty.startswith("*") and attr == "D")
    unaligned = tuple((ty, "") if i == index else (ty, attr) for i, (ty, attr) in enumerate(spec))
    assert key_from_json(server.fallback_for((unaligned, okey)).entry.key) == laid_out
    # Nothing specialized at all: the unmarked entry (Triton's own cubin for such a call).
    assert key_from_json(server.fallback_for((generic_spec(spec, rp), okey)).entry.key) == (generic_spec(spec, rp), okey)


@needs_vllm
def test_strict_miss_names_kernel_key_and_fix(installed):
    installed(mode="strict")
    with pytest.raises(KernelNotInBundleError) as info:
        kernel()[(4,)](**c128a_args(block_table_dtype=torch.int64))
    msg = str(info.value)
    assert C128A in msg and "*i64" in msg and "NOJIT_MODE=record" in msg and "nojit build --add-keys" in msg


@needs_vllm
def test_permissive_miss_warns_once_and_uses_the_jit(installed, caplog, monkeypatch):
    inst = installed(mode="permissive")
    calls = []
    server = inst.servers("triton")[C128A]
    monkeypatch.setattr(server, "_jit_run", lambda fn, *a, **kw: calls.append(kw["grid"]) or "jit")
    with caplog.at_level(logging.WARNING, logger="nojit"):
        assert kernel()[(4,)](**c128a_args(block_table_dtype=torch.int64)) == "jit"
        assert kernel()[(5,)](**c128a_args(block_table_dtype=torch.int64)) == "jit"
    assert calls == [(4,), (5,)]
    warnings = [r for r in caplog.records if "compiling it with the JIT" in r.getMessage()]
    assert len(warnings) == 1 and C128A in warnings[0].getMessage()


@needs_vllm
def test_record_mode_appends_each_distinct_key_once(installed, tmp_path, monkeypatch):
    record = tmp_path / "keys.jsonl"
    inst = installed(mode="record", record_file=str(record))
    monkeypatch.setattr(inst.servers("triton")[C128A], "_jit_run", lambda *a, **kw: None)
    for _ in range(3):
        kernel().warmup(grid=(1,), **c128a_args())  # exact hit, recorded once
        kernel()[(4,)](**c128a_args(block_table_dtype=torch.int64))  # miss, recorded once
    lines = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(r["outcome"] for r in lines) == ["exact", "miss"]
    assert all(r["kernel"] == C128A and r["key"]["spec"] for r in lines)


@needs_vllm
def test_strict_mode_forbids_every_compile_path(installed):
    installed(mode="strict")
    import triton
    from triton.runtime.jit import JITFunction

    with pytest.raises(CompileForbiddenError, match="triton.compile"):
        triton.compile(None)
    with pytest.raises(CompileForbiddenError, match="about to compile"):
        JITFunction._do_compile(kernel(), "some-key", {}, 0, {}, None, {}, False)
    with pytest.raises(CompileForbiddenError, match=r"compiler process was about to start: gcc -c x.c"):
        subprocess.run(["gcc", "-c", "x.c"], capture_output=True)
    with pytest.raises(CompileForbiddenError, match=r"compiler process was about to start: /usr/local/cuda/bin/ptxas"):
        subprocess.Popen(["/usr/local/cuda/bin/ptxas", "x.ptx"])
    # version probes pass (FlashInfer, Triton, DeepGEMM ask before anything else); tests/loader/strict/test_firewall.py has the rest
    subprocess.run(["gcc", "--version"], capture_output=True, check=True)
    subprocess.run(["true"], check=True)  # other programs still run


@needs_vllm
def test_install_alone_answers_tritons_driver_without_building_it(installed):
    """install() by itself (no plugin, no warmup registry, no autotuned kernel) makes Triton's driver the answered
    one, so a kernel's host asking the driver (FLA's shared-memory size) builds no `cuda_utils` with gcc: on the H200
    the Qwen3.5 call-site check, which calls install() alone, saw ldconfig, file and gcc start. Control: before
    install() and after uninstall() the driver is Triton's own."""
    from triton.runtime import driver

    from nojit.loader.runtimes.triton import driver as answered

    answered.restore()
    assert not isinstance(driver._active, answered.TorchAnsweredDriver)  # control
    inst = installed(mode="strict")
    assert C128A in inst.servers("triton")
    assert isinstance(driver._active, answered.TorchAnsweredDriver) and not driver._active.real_driver_created
    inst.uninstall()
    assert not isinstance(driver._active, answered.TorchAnsweredDriver)


@needs_vllm
def test_guards_are_lifted_on_uninstall(installed):
    inst = installed(mode="strict")
    inst.uninstall()
    assert subprocess.run(["gcc", "--version"], capture_output=True).returncode == 0


def _rewrite(src: str, dst: str, producer=None, kernel_hash=None) -> str:
    b = Bundle.open(src)
    m = b.manifest
    kernels = [KernelRecord(k.id, k.runtime, kernel_hash if (kernel_hash and k.id == C128A) else k.source_hash,
                            k.params, k.info) for k in m.kernels.values()]
    cubins = {sha: b.read_blob(sha) for sha in m.blobs}
    write_bundle(dst, producer or m.producer, m.target, m.deployment, kernels, m.entries, cubins)
    return dst


@needs_vllm
def test_other_triton_version_is_refused_with_the_difference(installed, small_build, tmp_path):
    from dataclasses import replace

    m = Bundle.open(small_build["bundle"]).manifest
    path = _rewrite(small_build["bundle"], str(tmp_path / "old.nojit"), producer=replace(m.producer, triton="3.6.0"))
    with pytest.raises(BundleMismatchError) as info:
        installed(path, mode="strict")
    msg = str(info.value)
    assert "triton: bundle built with 3.6.0, this process has 3.8.0" in msg and "NOJIT_ALLOW_MISMATCH=triton" in msg
    inst = installed(path, mode="strict", allow_mismatch=frozenset({"triton"}))
    assert inst.allowed_differences == ["triton: bundle built with 3.6.0, this process has 3.8.0"]


@needs_vllm
def test_stale_kernel_source_is_refused(installed, small_build, tmp_path):
    """Checked when the kernel is first used (a call, warmup, the registry's preflight, prepare, preload)."""
    path = _rewrite(small_build["bundle"], str(tmp_path / "stale.nojit"), kernel_hash="0" * 64)
    inst = installed(path, mode="strict")
    stale = "BuildC128ATopkMetadataKernel.kernel: its source changed"
    with pytest.raises(BundleMismatchError, match=stale):
        kernel()[(4,)](**c128a_args())
    with pytest.raises(BundleMismatchError, match=stale):
        kernel().warmup(grid=(1,), **c128a_args())
    with pytest.raises(BundleMismatchError, match=stale):
        inst.prepare()


@needs_vllm
def test_unknown_kernel_module_is_a_mismatch(installed, small_build, tmp_path):
    b = Bundle.open(small_build["bundle"])
    m = b.manifest
    kernels = list(m.kernels.values()) + [KernelRecord("vllm.no_such_module:kernel", "triton", "0" * 64, ())]
    path = str(tmp_path / "extra.nojit")
    write_bundle(path, m.producer, m.target, m.deployment, kernels, m.entries, {s: b.read_blob(s) for s in m.blobs})
    with pytest.raises(BundleMismatchError, match="vllm.no_such_module is not a module of the installed vllm"):
        installed(path, mode="strict")


@needs_vllm
def test_vllm_general_plugin_installs_the_bundle_in_each_process(small_build):
    code = ("from vllm.plugins import load_general_plugins; load_general_plugins(); "
            "from nojit.loader.install import current; c = current(); "
            "print('installed', None if c is None else sorted(c.servers('triton')))")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    env.pop("NOJIT_BUNDLE", None)
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert "installed None" in off.stdout, off.stderr[-2000:]
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        env={**env, "NOJIT_BUNDLE": small_build["bundle"], "NOJIT_MODE": "strict"})
    assert C128A in on.stdout, on.stderr[-2000:]


def test_another_gpu_architecture_is_refused():
    from nojit.loader.errors import BundleMismatchError
    from nojit.loader.bundle.manifest import Manifest, Producer, Target
    from nojit.loader.bundle.versions import check_arch

    m = Manifest(1, Producer("0.1.0", None, None, None, None, None, "3.11", None), Target("cuda", 90, "sm_90a", 32),
                 {}, {}, (), {})
    check_arch(m, "b.nojit", (9, 0), frozenset())
    with pytest.raises(BundleMismatchError, match=r"holds sm_90a cubins .* this GPU is compute capability 10.0"):
        check_arch(m, "b.nojit", (10, 0), frozenset())
    check_arch(m, "b.nojit", (10, 0), frozenset({"arch"}))
