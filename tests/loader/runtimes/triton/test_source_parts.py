"""The source check at a kernel's first launch: the build's record of what Triton's cache_key was made of
(aot/runtimes/triton/source_parts.py, loader/runtimes/triton/source_parts.py) must refuse exactly what cache_key refuses,
and pass an unchanged kernel without calling cache_key. Real vLLM kernels, real Triton, fresh processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from tests.support.common import ROOT, needs_vllm

CHANGES = {"kernel source", "kernel starting line", "dependency source", "dependency noinline", "dependency rebound",
           "constexpr global", "constexpr global of another module"}
SAME = {"unchanged", "kernel source restored", "constexpr global, same value", "all restored"}
NOT_USED = {"record of another triton", "record for another hash"}


def _run(args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full, timeout=900)


@needs_vllm
def test_recorded_parts_refuse_exactly_what_cache_key_refuses():
    p = _run([os.path.join(ROOT, "tests", "probes", "probe_source_parts.py")])
    assert p.returncode == 0, p.stderr[-3000:]
    cases = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    assert {c["case"] for c in cases} == CHANGES | SAME | NOT_USED, p.stdout
    for c in cases:
        assert c["cache_key_calls"] == 0, c  # the parts check itself never walks an AST
        assert c["refused"] == (not c["live_equal"]), c  # refused exactly when Triton's key differs
        if c["proven"]:
            assert c["live_equal"], c  # never proves a key Triton would not compute
        if c["case"] in CHANGES:
            assert not c["proven"] and c["refused"], c
        elif c["case"] in SAME:
            assert c["proven"] and not c["refused"], c
        else:
            assert not c["proven"] and not c["refused"], c  # not used: cache_key decides (and passes)


SERVE = textwrap.dedent("""
    import json, sys
    from triton.runtime.jit import JITCallable
    from nojit.loader.errors import BundleMismatchError
    from nojit.loader.install import install
    calls = [0]
    real = JITCallable.cache_key.fget
    def counted(self):
        calls[0] += 1
        return real(self)
    JITCallable.cache_key = property(counted)
    if sys.argv[2] == "dependency-changed":
        import vllm.models.deepseek_v4.common.ops.fused_mtp_input_rmsnorm as m
        m._rmsnorm_row._unsafe_update_src(m._rmsnorm_row.src + "\\n")
    inst = install(sys.argv[1], mode="strict")
    try:
        n = inst.prepare()
        print(json.dumps({"prepared": n, "cache_key_calls": calls[0]}))
    except BundleMismatchError as exc:
        print(json.dumps({"refused": str(exc).splitlines()[0], "cache_key_calls": calls[0]}))
""")


def _serve(bundle: str, how: str) -> dict:
    p = _run(["-c", SERVE, bundle, how])
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@needs_vllm
def test_first_use_checks_the_record_and_falls_back_to_cache_key(small_build, tmp_path):
    from nojit.aot.bundle_writer import write_bundle
    from nojit.loader.bundle.file import Bundle
    from nojit.loader.bundle.manifest import KernelRecord

    b = Bundle.open(small_build["bundle"])
    m = b.manifest
    assert all("source_parts" in k.info for k in m.kernels.values()), "the build records every kernel's parts"
    # new bundle, unchanged sources: every kernel prepared without Triton's cache_key
    assert _serve(small_build["bundle"], "unchanged") == {"prepared": 3, "cache_key_calls": 0}
    # a @triton.jit helper of one kernel changed: refused as before, by Triton's own key
    out = _serve(small_build["bundle"], "dependency-changed")
    assert "MTPSharedHeadRMSNormKernel.kernel: its source changed" in out.get("refused", ""), out
    # a bundle from before the record (no source_parts): read as before, through cache_key
    old = str(tmp_path / "old.nojit")
    kernels = [KernelRecord(k.id, k.runtime, k.source_hash, k.params,
                            {n: v for n, v in k.info.items() if n != "source_parts"}) for k in m.kernels.values()]
    write_bundle(old, m.producer, m.target, m.deployment, kernels, m.entries, {s: b.read_blob(s) for s in m.blobs})
    out = _serve(old, "unchanged")
    assert out["prepared"] == 3 and out["cache_key_calls"] >= 3, out
    out = _serve(old, "dependency-changed")
    assert "MTPSharedHeadRMSNormKernel.kernel: its source changed" in out.get("refused", ""), out
