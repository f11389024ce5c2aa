"""CPU checks of the call-site GPU check's parts: the vLLM mount and `nojit coverage --observed`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tests.support.common import run_cli

from nojit.aot.observed_coverage import ObservedRow, read_observed, render
from nojit.aot.plan import Plan

from tests.support.common import GPU_CHECKS  # noqa: E402


def test_mount_imports_vllm_call_site_from_files_with_stubbed_platform() -> None:
    vllm = pytest.importorskip("vllm")
    site = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
    code = (
        "import sys; sys.path.insert(0, %r)\n"
        "from vllm_mount import mount\n"
        "f = mount(%r)\n"
        "import vllm.v1.worker.gpu.sample.min_p as m, vllm.platforms as p\n"
        "k = m._min_p_kernel\n"
        "print(k.fn.__module__ + ':' + k.fn.__qualname__, type(p.current_platform).__name__,"
        " 'v1/worker/gpu/sample/min_p.py' in f.loaded, 'vllm/__init__' in ' '.join(f.loaded))\n"
    ) % (GPU_CHECKS, site)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-4:] == ["vllm.v1.worker.gpu.sample.min_p:_min_p_kernel", "CudaLikePlatform", "True",
                                       "False"]


def test_observed_keys_read_and_rendered(tmp_path) -> None:
    path = tmp_path / "observed.jsonl"
    key = {"spec": [["*fp32", "D"]], "options": [["num_warps", ["int", 4]]]}
    lines = [{"kernel": "m:k", "runtime": "triton", "key": key, "outcome": "exact"},
             {"kernel": "m:k", "runtime": "triton", "key": key, "outcome": "exact"},
             {"kernel": "m:gone", "runtime": "triton", "key": None, "outcome": "miss"}]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    observed = read_observed(str(path))
    assert {k: len(v) for k, v in observed.items()} == {"m:k": 1}
    text = render([ObservedRow("m:k", observed=1, planned=0, exact=0, missing=["K"], unplanned=["K"])])
    assert "reached, not planned (an enumerator defect)" in text and "reached, not served by the bundle" in text


def test_observed_file_that_is_not_jsonl_says_so(tmp_path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text("not json\n")
    with pytest.raises(ValueError, match="bad.jsonl:1: not JSON"):
        read_observed(str(path))


def test_coverage_observed_lists_planned_and_unplanned_keys(small_build, tmp_path) -> None:
    """`nojit coverage --observed` against a typed plan: a planned key is counted, an unplanned one fails the run."""
    plan = Plan.read(small_build["plan"])
    planned = next(r for r in plan.requests if r.variant == "exact")
    unplanned = json.loads(json.dumps(planned.key))
    unplanned["spec"][0] = ["*fp64", "D"]
    path = tmp_path / "observed.jsonl"
    path.write_text("".join(json.dumps({"kernel": planned.kernel, "runtime": "triton", "key": k, "outcome": "exact"})
                            + "\n" for k in (planned.key, unplanned)))
    out = run_cli("coverage", small_build["bundle"], "--plan", small_build["plan"], "--observed", str(path),
                  check=False)
    assert out.returncode == 1, out.stdout + out.stderr
    observed_table = out.stdout.split("observed keys (reached on real steps)")[1]
    row = next(line for line in observed_table.splitlines() if line.startswith(planned.kernel))
    assert row.split()[1:4] == ["2", "1", "1"], row  # observed, planned, reached & exact
    assert "reached, not planned (an enumerator defect)" in out.stdout


SPARSE_KERNEL = '''
import triton
import triton.language as tl


@triton.jit
def _read(ptr, i):
    return tl.load(ptr + i)


@triton.jit
def sparse_store(out_ptr, acc_ptr, src_ptr):
    i = tl.program_id(0)
    row = out_ptr + 2 * i
    tl.store(row, tl.load(src_ptr + i))  # store-only, every other element of a live buffer
    v = _read(acc_ptr, i)  # read in a helper...
    tl.store(acc_ptr + i, v + 1.0)  # ...and updated in place
'''

TRACE = '''
import importlib.util, json, sys
import torch
sys.path.insert(0, %r)
import check_call_sites as c
spec = importlib.util.spec_from_file_location("sparse_mod", %r)
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
tracer = c.LaunchTracer("jit", "cpu")
c._trace_every_kernel(tracer, [m], True)
out, acc, src = torch.full((8,), 3.0), torch.zeros(4), torch.arange(4.0)
m.sparse_store[(4,)](out, acc, src)
row = tracer.launches[0]
print(json.dumps({"io": [sorted(x) for x in tracer._io(m.sparse_store)], "written": row["written"],
                  "in_place": row["in_place"], "out": out.tolist(), "acc": acc.tolist()}))
'''


def test_tracer_counts_sparse_and_in_place_writes_and_keeps_live_data(tmp_path) -> None:
    """A store-only output is poisoned, counted, and its unwritten elements get their data back (bad words into the
    logits); a buffer read in a helper is never poisoned and its in-place update is counted against its pre-state."""
    kernel = tmp_path / "sparse_mod.py"
    kernel.write_text(SPARSE_KERNEL)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", TRACE % (GPU_CHECKS, str(kernel))], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["io"] == [["out_ptr"], ["acc_ptr"]]
    assert got["written"] == {"out_ptr": 4, "acc_ptr": 4, "src_ptr": 0}
    assert got["in_place"] == ["acc_ptr"]
    assert got["out"] == [0.0, 3.0, 1.0, 3.0, 2.0, 3.0, 3.0, 3.0]
    assert got["acc"] == [1.0, 1.0, 1.0, 1.0]


SPEC_STEP = '''
import json, sys
sys.path.insert(0, %(gpu)r)
import torch
import check_call_sites as c
from vllm_mount import mount
finder = mount(%(site)r)
import call_site_steps as s
s.import_call_sites()
tracer = c.LaunchTracer("jit", "cpu")
s.INDIRECT = tracer.indirect
c._trace_every_kernel(tracer, [m for n, m in sorted(sys.modules.items()) if n.startswith("vllm.") and m], True)
tracer.step = "verify"
out = s.spec_decode_step(s.VERIFY_WITH_PREFILLS, "cpu", 7, s._greedy_or_plain)
tracer.step = "swa"
batch = s.Batch([38, 301, 2000, 0], [1, 1, 1, 250], "cpu")
swa = s.swa_metadata(batch, 7, s.runner_metadata(batch, 7))
logits, cu = out["target_logits"], [0]
for r in s.VERIFY_WITH_PREFILLS:
    cu.append(cu[-1] + r[3] + 1)
print(json.dumps({
    "launches": [[r["step"], r["kernel"], sum(r["written"].values()), r["key"]] for r in tracer.launches],
    "loaded": sorted(finder.loaded), "errors": s.ERRORS,
    "num_sampled": out["num_sampled"].tolist(), "num_rejected": out["num_rejected"].tolist(),
    "sampled": out["sampled"].tolist(), "argmax": logits.float().argmax(-1).tolist(), "cu": cu,
    "last_token_indices": out["last_token_indices"][:len(cu) - 1].tolist(),
    "qsl": torch.cumsum(torch.tensor([0] + [r[2] for r in s.VERIFY_WITH_PREFILLS]), 0).tolist(),
    "prefill_gather_lens": swa["swa_prefill_gather_lens"].tolist(),
    "decode_swa_lens": swa["swa_decode_swa_lens"].tolist(),
}))
'''

# kernel-id substrings of every kernel SPEC_STEP launches, for `nojit build --kernels`
SPEC_PLAN_KERNELS = ("gpu.spec_decode,gpu.input_batch,gpu.buffer_utils,gpu.block_table,gpu.sample,mla.sparse_swa,"
                     "fused_mtp_input_rmsnorm,metadata:_token")

SPEC_KERNELS = {  # the V2 runner's MTP-1 verify-and-draft kernels, by the call site that launches them
    "verify": {"_expand_idx_mapping_kernel", "_prepare_prefill_inputs_kernel", "_prepare_pos_seq_lens_kernel",
               "_combine_sampled_and_draft_tokens_kernel", "_gather_draft_sampled_kernel",
               "_compute_local_logits_stats_kernel", "_rejection_kernel", "_resample_kernel",
               "_insert_resampled_kernel", "_flatten_sampled_kernel", "_topk_log_softmax_kernel", "_ranks_kernel",
               "_get_num_sampled_and_rejected_kernel", "_post_update_kernel", "FusedMTPInputRMSNormKernel.kernel",
               "MTPSharedHeadRMSNormKernel.kernel"},
    "swa": {"_token_request_mapping_kernel", "_compute_swa_indices_and_lens_kernel",
            "ComputePrefillMetadataKernel.kernel"},
}


def test_mtp_verify_and_swa_metadata_run_vllms_own_call_sites_on_the_interpreter(tmp_path) -> None:
    """The MTP-1 verify-and-draft step (greedy and random requests, two prefill chunks, raw bf16 logits) and the SWA
    metadata builder run from vLLM's own modules under TRITON_INTERPRET: every launch writes, the real sparse_swa
    module is loaded (no stand-in), and the outcome matches what a greedy verification must give (torch argmax of
    the same target logits: an accepted draft plus its bonus token, or the target's own token), chunked prefills
    sample nothing, the SWA lengths match the window, and every key reached is in the enumerator's plan. About 3
    minutes on 2 cores (the interpreter over 16 rows of the 129280-token vocabulary): the one CPU run of these call
    sites, which the H200 step then repeats against the bundle."""
    vllm = pytest.importorskip("vllm")
    site = os.path.dirname(os.path.dirname(os.path.abspath(vllm.__file__)))
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    p = subprocess.run([sys.executable, "-c", SPEC_STEP % {"gpu": GPU_CHECKS, "site": site}],
                       env=env, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["errors"] == []
    assert "v1/attention/backends/mla/sparse_swa.py" in got["loaded"]
    for step, kernels in SPEC_KERNELS.items():
        launched = {k.rpartition(":")[2] for s_, k, _w, _key in got["launches"] if s_ == step}
        assert kernels <= launched, (step, kernels - launched)
    vacuous = [(s_, k) for s_, k, written, _key in got["launches"] if written == 0]
    assert vacuous == [], vacuous
    # every key these real call sites reach is one the enumerator planned (aot/models/deepseek_v4/)
    plan = str(tmp_path / "spec.plan.json")
    run_cli("build", "--runtime", "triton", "--kernels", SPEC_PLAN_KERNELS, "--plan-only", "--emit-plan", plan,
            "-o", str(tmp_path / "unused.nojit"), "--quiet")
    sys.path.insert(0, GPU_CHECKS)
    from check_call_sites import planned_keys

    from nojit.loader.bundle.canonical import canonical_json

    planned = planned_keys(plan)
    unplanned = [(s_, k, key) for s_, k, _w, key in got["launches"]
                 if canonical_json(key).decode() not in planned.get(k, ())]
    assert unplanned == [], unplanned
    reqs = [(20, 37, 2, 1), (200, 300, 2, 1), (900, 1100, 2, 1), (30, 45, 2, 1), (3000, 4000, 2, 1),
            (60, 77, 2, 1), (100, 129, 2, 1), (30, 0, 9, 0), (31, 0, 31, 0)]
    cu, argmax = got["cu"], got["argmax"]
    for r, (_prompt, computed, _n, drafts) in enumerate(reqs):
        greedy, boosted = r % 2 == 1, drafts and r % 4 < 2
        if computed == 0:  # prefill chunks: the chunked one samples nothing, the completed one its first token
            assert got["num_sampled"][r] == (0 if r == 7 else 1)
            continue
        if boosted:
            assert got["num_sampled"][r] == 2 and got["num_rejected"][r] == 0, r
        if greedy:  # greedy verification is the target's argmax row by row
            n = got["num_sampled"][r]
            assert got["sampled"][r][:n] == argmax[cu[r]:cu[r] + n], r
            assert n == (2 if boosted else 1), r
    # the speculator's draft prefill reads each request's last accepted position (target_dependent_ar/speculator.py)
    qsl = got["qsl"]
    assert got["last_token_indices"] == [qsl[r + 1] - 1 - got["num_rejected"][r] for r in range(len(reqs))]
    # SWA: decode rows see min(seq_len, window) tokens; the prefill's gather length is its query (no prefix)
    assert got["decode_swa_lens"][:3] == [39, 128, 128] and got["prefill_gather_lens"] == [250]


def test_kernels_found_under_wrappers_and_other_names_never_probed() -> None:
    """The tracer's kernel walk finds kernels under @triton.heuristics / @triton.autotune, and never probes other
    names for `fn`: the H200 run of session 10 met TileLang's strict-mode stand-in module, whose attributes raise."""
    pytest.importorskip("triton")
    import types

    import triton
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    sys.path.insert(0, GPU_CHECKS)
    try:
        from check_call_sites import _kernels_of
    finally:
        sys.path.remove(GPU_CHECKS)

    @triton.jit
    def plain(x):
        tl.store(x, 1)

    @triton.heuristics({"B": lambda args: 4})
    @triton.jit
    def wrapped(x, B: tl.constexpr):
        tl.store(x, B)

    class Raises:
        def __getattr__(self, name):  # as a library's stand-in whose names raise a non-AttributeError
            raise RuntimeError(f"probed {name}")

    mod = types.ModuleType("m")
    mod.plain, mod.wrapped, mod.stand_in = plain, wrapped, Raises()
    found = _kernels_of([mod], (JITFunction,))
    assert {f.fn.__name__ for f in found} == {"plain", "wrapped"}


def test_process_count_sees_fork_and_keeps_what_nojit_starts_after_the_imports(tmp_path) -> None:
    """The loader child's count of processes (must be 0): os.fork (multiprocessing's fork, os.spawn*) counts besides
    subprocess/exec/posix_spawn/system, and the processes taken out as `import torch`'s are only those started while
    no nojit module is imported (a process nojit's code starts is never taken out)."""
    script = f"""
import os, sys
sys.path.insert(0, {GPU_CHECKS!r})
import check_call_sites as c
events = []
sys.addaudithook(c.process_hook(events))
os.system("true")                    # before any plugin (import torch's, in the check)
taken = c.before_plugins(events)
pid = os.fork()
if pid == 0:
    os._exit(0)
os.waitpid(pid, 0)
import nojit.loader.errors           # a nojit module imported: what was started after it is not taken out
os.system("true")
kept = c.before_plugins(events)
import json
print(json.dumps([taken, kept, events]))
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    taken, kept, events = json.loads(r.stdout.strip().splitlines()[-1])
    assert [e.partition(":")[0] for e in taken] == ["os.system"] and kept == [], r.stdout
    assert [e.partition(":")[0] for e in events] == ["os.fork", "os.system"], r.stdout
