"""CPU side of tests/gpu/checks/check_one_process.py (issue 23): the plan preflight and the negative control's bundle.

The negative control removes one exact entry and expects the start to fail at preflight with one message naming it.
Written as the attack: the entry is removed; the positive control is the same preflight on the whole bundle, which
passes, so the failure comes from the removal and nothing else. A generic entry with the same key as the removed
exact one must not hide the removal (a bundle has both: one per divisibility pattern).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from nojit.aot.bundle_writer import write_bundle
from nojit.loader.bundle.file import Bundle, canonical_json
from nojit.loader.errors import PreflightError
from nojit.loader.bundle.manifest import Entry

from tests.loader.bundle.test_file import PRODUCER, TARGET, _inputs
from tests.support.common import GPU_CHECKS

sys.path.insert(0, GPU_CHECKS)
from check_one_process import bundle_without, plan_preflight  # noqa: E402


def _bundle_and_plan(tmp_path) -> tuple[str, str]:
    kernels, entries, cubins = _inputs(5)
    # a generic entry with the key of the first exact one (the build makes such pairs)
    entries.append(Entry(entries[0].kernel, entries[0].key, "generic", entries[0].blob, entries[0].launch, "generic"))
    path = str(tmp_path / "b.nojit")
    write_bundle(path, PRODUCER, TARGET, {"name": "t"}, kernels, entries, cubins)
    plan = {"kernels": {k.id: {"runtime": k.runtime} for k in kernels},
            "requests": [{"kernel": e.kernel, "key": e.key, "variant": e.variant} for e in entries]}
    plan_path = str(tmp_path / "plan.json")
    with open(plan_path, "w") as f:
        json.dump(plan, f)
    return path, plan_path


def test_whole_bundle_passes_preflight(tmp_path):
    path, plan = _bundle_and_plan(tmp_path)
    assert plan_preflight(Bundle.open(path), plan, {"triton"}) == {"triton": 6}


def test_one_entry_removed_fails_preflight_naming_it(tmp_path):
    path, plan = _bundle_and_plan(tmp_path)
    minus = str(tmp_path / "minus.nojit")
    dropped = bundle_without(path, minus, drop_entry=0)
    kernel, _, key = dropped.partition(" ")
    b = Bundle.open(minus)
    assert len(b.manifest.entries) == len(Bundle.open(path).manifest.entries) - 1
    with pytest.raises(PreflightError) as exc:
        plan_preflight(b, plan, {"triton"})
    listed = [ln for ln in str(exc.value).splitlines() if ln.startswith("  ") and not ln.startswith("  fix")]
    assert len(listed) == 1 and kernel in listed[0] and key[:60] in listed[0], str(exc.value)


def test_without_a_runtime_keeps_the_others_and_their_blobs(tmp_path):
    path, _ = _bundle_and_plan(tmp_path)
    out = str(tmp_path / "none.nojit")
    bundle_without(path, out, frozenset({"triton"}))
    assert Bundle.open(out).manifest.kernels == {}
    same = str(tmp_path / "same.nojit")
    bundle_without(path, same, frozenset({"tilelang"}))
    a, b = Bundle.open(path), Bundle.open(same)
    assert [canonical_json(e.key) for e in a.manifest.entries] == [canonical_json(e.key) for e in b.manifest.entries]
    assert all(b.read_blob(e.blob) == a.read_blob(e.blob) for e in a.manifest.entries)


def test_flashinfer_part_reads_only_flashinfer_entries():
    """The H200 run of session 8 failed the FlashInfer part before any call: it read every entry's launch as
    FlashInfer's, and a Humming entry's launch has no `kind`. Only FlashInfer entries are read now."""
    import re
    from types import SimpleNamespace as NS

    from check_one_process import flashinfer_shapes_and_modules

    kernels = {"fi:gemm": NS(runtime="flashinfer"), "fi:mod": NS(runtime="flashinfer"), "hg:k": NS(runtime="humming")}
    entries = [NS(kernel="hg:k", launch=NS(config="no kind here")),
               NS(kernel="fi:gemm", launch=NS(kind="trtllm_deepgemm", module="gemm_swapAB_4096_512_x")),
               NS(kernel="fi:mod", launch=NS(kind="module", module="sampling"))]
    shapes, modules = flashinfer_shapes_and_modules(NS(kernels=kernels, entries=entries),
                                                    re.compile(r"gemm_swapAB_(\d+)_(\d+)_"))
    assert (shapes, modules) == ([(4096, 512)], ["sampling"])


def test_flashinfer_part_on_a_written_bundle_with_every_launch_kind(tmp_path):
    """The same, on a bundle written and read back by nojit's own format (not stand-in records): Humming, Triton
    and FlashInfer entries side by side, and the check's own TensorRT-LLM name pattern. The positive control
    is the session-8 reading (every entry's launch as FlashInfer's), which raises on this bundle."""
    import hashlib

    from check_flashinfer_launch import TRTLLM_NAME
    from nojit.loader.bundle.manifest import KernelRecord
    from nojit.loader.bundle.records.flashinfer import FlashInferLaunch
    from nojit.loader.bundle.records.humming import HummingLaunch

    kernels, entries, cubins = _inputs(5, n=2)

    def add(kernel_id: str, runtime: str, launch, i: int, key=None) -> None:
        raw = f"{kernel_id} {i}".encode() * 40
        sha = hashlib.sha256(raw).hexdigest()
        cubins[sha] = raw
        if kernel_id not in {k.id for k in kernels}:
            kernels.append(KernelRecord(kernel_id, runtime, "3" * 64, ()))
        entries.append(Entry(kernel_id, {"i": i} if key is None else key, "exact", sha, launch, "declared"))

    add("humming.kernel.humming:HummingKernel", "humming",
        HummingLaunch("NVRTCCompiler", "90a", "humming<...>", "// code", False, False, "_Z7humming"), 0,
        {"class": "humming.kernel.humming:HummingKernel", "args": {"n": 1}})
    add("flashinfer.gemm.gemm_base:fp8_blockscale_gemm_sm90", "flashinfer",
        FlashInferLaunch("gemm_swapAB_8192_1024_128_16_128_1_81_8_1_Normal", "trtllm_deepgemm"), 2)
    add("flashinfer.gemm.gemm_base:fp8_blockscale_gemm_sm90", "flashinfer",
        FlashInferLaunch("gemm_swapAB_4096_512_128_16_128_1_81_8_1_Normal", "trtllm_deepgemm"), 3)
    add("flashinfer.sampling:sampling", "flashinfer", FlashInferLaunch("sampling"), 4, "sampling")
    path = str(tmp_path / "mixed.nojit")
    write_bundle(path, PRODUCER, TARGET, {"name": "t"}, kernels, entries, cubins)
    manifest = Bundle.open(path).manifest

    from check_one_process import flashinfer_shapes_and_modules

    assert flashinfer_shapes_and_modules(manifest, TRTLLM_NAME) == ([(4096, 512), (8192, 1024)], ["sampling"])
    with pytest.raises(AttributeError):  # the session-8 reading
        sorted(e.launch.module for e in manifest.entries if e.launch.kind == "module")


def test_plan_is_parsed_once_and_again_when_it_changes(tmp_path, monkeypatch):
    """The preflight runs once per runtime; the plan is parsed once per process while the file is unchanged, and
    parsed again (a stale parse refused) when it is rewritten: a key added to the plan and missing from the bundle
    fails the next preflight."""
    import check_one_process as cop

    path, plan = _bundle_and_plan(tmp_path)
    b = Bundle.open(path)
    loads: list[str] = []
    real = json.load
    monkeypatch.setattr(json, "load", lambda f, *a, **k: (loads.append(f.name), real(f, *a, **k))[1])
    for _ in range(3):
        assert plan_preflight(b, plan, {"triton"}) == {"triton": 6}
    assert loads.count(plan) == 1
    with open(plan) as f:
        data = real(f)
    data["requests"].append({"kernel": data["requests"][0]["kernel"], "key": {"new": 1}, "variant": "exact"})
    with open(plan, "w") as f:
        json.dump(data, f)
    os.utime(plan, ns=(1, 1))  # even with an old mtime: the size and inode are in the stamp too
    with pytest.raises(PreflightError, match="1 of them"):
        plan_preflight(b, plan, {"triton"})
    assert loads.count(plan) == 2 and len(cop._PLANS) >= 2


def test_preflight_reads_only_exact_entries(tmp_path):
    """The plan's keys are checked against each kernel's exact entries, the part a server's prepare reads (and then
    reuses); generic entries are read at a kernel's first miss, not at start (the H200 run's 'plan' step read every
    section whole). The removal is still found: the generic entry with the removed key does not hide it."""
    path, plan = _bundle_and_plan(tmp_path)
    b = Bundle.open(path)
    assert plan_preflight(b, plan, {"triton"}) == {"triton": 6}
    assert b._sections == {} and {v for _, v in b._parts} == {"exact"}
    minus = str(tmp_path / "minus.nojit")
    bundle_without(path, minus, drop_entry=0)
    b = Bundle.open(minus)
    with pytest.raises(PreflightError, match="key not in the bundle"):
        plan_preflight(b, plan, {"triton"})
    assert {v for _, v in b._parts} == {"exact"}


def test_loader_child_args_carry_every_argument_the_call_site_child_reads() -> None:
    """The Triton part runs check_call_sites' loader child in process with arguments it builds; the H200 run of
    session 10 raised there (a hand-made Namespace lacked --steps-module). Every `args.X` the child reads is set."""
    import ast
    import inspect

    import check_call_sites as cs
    from check_one_process import loader_child_args

    tree = ast.parse(inspect.getsource(cs.child))
    read = {n.attr for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "args"}
    assert "steps_module" in read and len(read) >= 6
    ns = loader_child_args("/v", 7, "/o.json", "/b.nojit", "/w/jit.json")
    assert not [a for a in sorted(read) if not hasattr(ns, a)]
    assert (ns.child, ns.seed, ns.replay, ns.steps_module) == ("loader", 7, "/w/jit_writes.pt", "call_site_steps")
