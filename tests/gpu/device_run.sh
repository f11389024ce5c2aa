#!/usr/bin/env bash
# GPU checks on the device machine, from the repository root, with .whl and .device carried
# (made by `python tools/prepare_device.py --plan PLAN --tilelang-bundle BUNDLE`).
#   triton   build the Triton bundle here with this machine's Triton (exact + generic entries), check every
#            exact key against the JIT, check the generic entries on the same arguments, time them, benchmark
#   generic  only the generic-entry check (with timing), after building the bundle
#   misaligned  generic entries on inputs shifted off their alignment vs the JIT on the aligned originals
#   record   record mode over perturbed keys (served by generic entries), rebuild with --add-keys, rerun:
#            the rerun must need no generic entry
#   tilelang mHC kernels of .device/tilelang.nojit against float64 references, TileLang absent
#   merge    one bundle: this machine's Triton entries + the TileLang entries, verified
#   pytest   the GPU tests of the suite (tests/gpu, marker gpu)
#   callsites  vLLM's own call sites (.device/vllm_src) on a prefill, decode, mixed, MTP and sampling step (the MTP
#            step: V2 runner input prep, RejectionSampler, post_update, MTP speculator; every step: SWA and sparse
#            MLA metadata builders, MoE router): loader (strict) vs JIT per launch, outputs poisoned, observed keys
#            against the plan and bundle
#   deepgemm DeepGEMM cubins built on the GPU-less box (.device/deepgemm from tools/prepare_deepgemm_device.py)
#            served through DeepGEMM's own cache lookup: the GEMMs and the indexer's MQA logits (prefill, paged
#            decode with its schedule metadata) vs float32 references, no compile, timed
#   cutedsl  CuTeDSL entries of .device/cutedsl.nojit (`nojit build --runtime cutedsl -o .device/cutedsl.nojit` on
#            the build box): each exported object's embedded sm_90a cubin loaded by the driver (PTX JIT off) and its
#            kernel found; CuTeDSL itself is not on the device, so nothing is launched (tests/gpu/checks/check_cutedsl.py)
#   humming  Humming entries of .device/humming.nojit (`nojit build --runtime humming -o .device/humming.nojit` on the
#            build box): every input-processing kernel launched through nojit's C launcher vs a float32 reference
#            (Humming's test tolerance), every GEMM cubin loaded with PTX JIT off (tests/gpu/checks/check_humming.py)
#   humming-gemm  Humming's GEMM kernels launched by Humming itself (its kernel objects, weight transform and
#            precompiled launcher), served from .device-hg/humming.nojit in strict mode, vs a float64 reference of
#            the MXFP4 x block-FP8 MoE GEMM, 0 compiles, 0 processes (tests/gpu/checks/check_humming_gemm.py); needs
#            .device-hg carried (`python tools/prepare_humming_device.py --bundle .device/humming.nojit`), whose
#            wheels are installed into a temporary site folder first
#   humming-jit  humming-gemm's cases, bundle-served (strict) vs Humming's own JIT here (tests/gpu/checks/check_humming_jit.py)
#   wheel    the merged bundle made into a bundle wheel (`nojit package`), installed with the nojit wheel of .whl
#            by `pip install --no-index` into a fresh target, PATH with no compiler; the loader finds the bundle
#            there with no NOJIT_BUNDLE, then every Triton kernel (loader runs on that PATH) and every TileLang
#            kernel are launched and checked from the installed file
#   replace  servers (one per GPU, or 4 on one) and readers use a bundle while its file is replaced twice
#            (a copy, then a --no-generic rebuild): bit-identical to the JIT, no error (REPLACE_SECONDS, default 180)
#   flashinfer  .device/flashinfer.nojit: its TensorRT-LLM DeepGEMM cubins loaded on the GPU as TensorRT-LLM loads
#            them (kernel found), its FlashInfer .so modules checked as files (launched: step flashinfer-launch)
#   flashinfer-launch  FlashInfer's own Python (carried, without data/) launches the bundle's modules, seeded by nojit's
#            strict loader as a server seeds them: vLLM's sampling calls and the block-FP8 GEMM (M < 32, TensorRT-LLM's
#            cubins) vs torch references in FlashInfer's test tolerance, comm modules loaded; C-level process/NVRTC guard
#            preloaded (tests/gpu/checks/check_flashinfer_launch.py); needs .device-fi (tools/prepare_flashinfer_device.py)
#   cutedsl-launch  every CuTeDSL entry of .device-cu/cutedsl.nojit launched: each export_to_c object linked here with g++
#            against CuTeDSL's C runtime and TVM-FFI (the wheel of .device-cu installed into a temporary target), loaded with
#            tvm_ffi, called as vLLM calls it vs vLLM's Triton paths / float64 references, 0 processes, 0 compiles
#            (tests/gpu/checks/check_cutedsl_launch.py); needs .device-cu carried (`python tools/prepare_cutedsl_device.py`)
#   gdn      FlashInfer's sm_90 GDN prefill (Qwen3.5, runtime flashinfer_cute) from .device-gdn/gdn.nojit: each fused-prefill
#            export_to_c object linked here with g++ against CuTeDSL's C runtime and TVM-FFI, loaded with tvm_ffi, called
#            with FlashInfer's launcher arguments vs a float64 gated delta rule (3 and 5 sequences, checkpoints every 64),
#            outputs NaN-poisoned, 0 processes (tests/gpu/checks/check_gdn_prefill.py); needs .device-gdn carried
#            (`python tools/prepare_gdn_device.py`); FlashInfer's own Python cannot be carried (nvidia-cutlass-dsl)
#   gdn-fi   the same prefill launched by FlashInfer's own Python: vLLM's fi_chunk_gated_delta_rule (.device-gdnfi/vllm_src
#            mounted) -> FlashInfer's chunk_gated_delta_rule -> its cached_compile lookup, answered by nojit's strict
#            loader from .device-gdnfi/gdn.nojit (cute.runtime.load_module: CuTeDSL's MLIR library and C runtime
#            carried), launched on the H200 vs the float64 gated delta rule (fused route: 3 and 5 sequences, checkpoints
#            every 64; CP route: 1 sequence, 2 with checkpoints; each case asserts the kernel classes looked up),
#            outputs NaN-poisoned, 0 compiles (FlashInfer's cache answered N of N), 0 processes (C guard preloaded);
#            then the negative control: the bundle less the 3-sequence key, strict refusal naming it, nothing compiled
#            (tests/gpu/checks/check_gdn_flashinfer.py). TWO calls on one warm machine (the MLIR library alone is
#            ~45 MiB xz): call 1 carries .device-gdnfi-ir only and runs `python3 tests/gpu/checks/check_gdn_flashinfer.py
#            --stage` (unpacks it there, sha256); call 2 carries .whl and .device-gdnfi and runs this step, which fails
#            with "not staged" if call 1's machine was given back. Both from `python tools/prepare_gdnfi_device.py`
#   one      one strict process, every runtime of one bundle (tests/gpu/checks/check_one_process.py; issue 23): the Triton
#            entries built here from the plan and merged with .device-one/rest.nojit, the JIT reference of vLLM's call
#            sites (an empty Triton cache: the Triton JIT's time), CuTeDSL's objects linked here (harness, before), then
#            the process with the C guard preloaded, no compiler on PATH, CUDA_DISABLE_PTX_JIT=1; the negative control
#            (one entry removed: refused at preflight) and DeepGEMM's JIT on a seeded sample (nvcc here); needs the
#            payload of tools/prepare_one_device.py (this repository copy is its repo/ folder)
#   inprocess  strict mode vs the driver's PTX JIT on the real driver (tests/gpu/test_inprocess_gpu.py: PTX given to every
#            image loader of libcuda, through ctypes, cuGetProcAddress, cudart and cuda.bindings, and the driver's linker
#            refused; a cubin loaded through each and its kernel run; a PTX-only fatbin refused by nojit's fatbin check,
#            a PTX+sm_90 fatbin loaded and its kernel run; a crafted fatbin (broken sm_90 cubin + PTX) not JIT-compiled;
#            with NOJIT_UNREADABLE_PTX_JIT=1 a child of a Landlocked strict process cannot JIT PTX while its cubin runs;
#            the control loads the PTX with strict mode off), then tests/loader/strict/test_x86_relocate.py on this
#            machine's NVIDIA libraries; needs a .whl nojit wheel built with _inproc
#   autotune FLA's autotuned kernels (chunk_local_cumsum fixed/varlen, solve_tril) from .device/vllm_src: Triton's own
#            autotuner enumerated here, the bundle built from that plan, mode a (Triton benchmarks the bundled cubins),
#            `nojit tune`, mode b (winners pre-filled, no benchmark) vs the JIT's autotuner from an empty cache with each
#            chosen config forced, outputs poisoned, bit-compared (tests/gpu/checks/check_autotune.py)
#   autotune-qwen  the autotune check on Qwen3.5's Triton GDN prefill (NOJIT_AUTOTUNE_CASES=qwen: FLA's
#            chunk_gated_delta_rule as vLLM's forward_native calls it with the built-in deployment's layer, six autotuned
#            kernels in one call; the JIT side forces all of a's, then b's, winners at once), on .device-qwen/vllm_src;
#            needs .device-qwen and .whl carried (`python tools/prepare_qwen_device.py`)
#   qwen     issue 24's must-show 2: vLLM's own Qwen3.5 call sites (.device-qwen/vllm_src, tests/gpu/checks/
#            qwen_call_site_steps.py: the GDN layer's fused-norm core, the attention layers' QK-norm/RoPE/gate, the
#            routed experts' fused_moe_kernel with vLLM's tile config, the prefix-cache copy) on a prefill, an MTP
#            decode, a decode without drafts, a prefill+MTP mixed and a prefill+decode mixed step with the deployment's
#            shapes (.device-qwen/facts.json): the Triton bundle built here from .device-qwen/device.plan.json (kernel
#            sources: shims of vLLM's own modules; exact entries only, so a key the plan lacks is a miss), JIT vs
#            loader (strict), outputs poisoned, bit-compared, per-kernel
#            table of keys reached / written / served / planned; then the autotune step on the same copy (the default
#            Qwen deployment reaches no autotuned kernel: FLA's chunk kernels need --gdn-prefill-backend triton).
#            Needs .device-qwen and .whl carried (`python tools/prepare_qwen_device.py`)
#   fastpath bench/bench_fastpath.py: dispatch (nojit C path, Python path, Triton, C floor), exact vs generic device
#            time, open/install/preload/RSS, cold start vs the JIT (builds the Triton bundle first if absent)
set -uo pipefail
OUT=${OUT:-/tmp/nojit-out}
W=/tmp/w
LOG="$OUT/device_log.txt"
mkdir -p "$OUT" "$W"
exec > >(tee -a "$LOG") 2>&1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
PLAN=.device/device.plan.json
MAP=.device/kernels/map.json
build_triton() {  # $1 output, rest: extra build flags
  local out=$1; shift
  python3 -m nojit.aot.cli build --from-plan "$PLAN" --kernel-sources "$MAP" --runtime triton -j 16 --quiet -o "$out" "$@"
}
rc=0
for step in "$@"; do
  case "$step" in
    triton)
      ( time build_triton $W/triton.nojit ) 2>&1 | tail -20
      python3 tests/gpu/checks/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 \
        --json "$OUT/check_triton.json" 2>&1 | tail -75 || rc=1
      python3 tests/gpu/checks/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 --variant generic --time \
        --json "$OUT/check_generic.json" 2>&1 | tail -75 || rc=1
      python3 bench/bench_dispatch.py --bundle $W/triton.nojit --sources $MAP 2>&1
      ;;
    generic)
      build_triton $W/triton.nojit 2>&1 | tail -3
      python3 tests/gpu/checks/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 --variant generic --time \
        --json "$OUT/check_generic.json" 2>&1 | tail -75 || rc=1
      ;;
    misaligned)
      [ -f $W/triton.nojit ] || build_triton $W/triton.nojit 2>&1 | tail -3
      python3 tests/gpu/checks/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 --variant misaligned \
        --json "$OUT/check_misaligned.json" 2>&1 | tail -75 || rc=1
      ;;
    record)
      rm -f $W/rec1.jsonl $W/rec2.jsonl
      python3 tests/gpu/checks/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 --variant perturbed \
        --mode record --record-file $W/rec1.jsonl 2>&1 | tail -75 || rc=1
      build_triton $W/triton2.nojit --add-keys $W/rec1.jsonl 2>&1 | tail -4 || rc=1
      python3 tests/gpu/checks/check_triton.py --bundle $W/triton2.nojit --sources $MAP --parallel 8 --variant perturbed \
        --mode record --record-file $W/rec2.jsonl 2>&1 | tail -75 || rc=1
      cp $W/rec1.jsonl $W/rec2.jsonl "$OUT/" 2>/dev/null
      python3 - $W/rec1.jsonl $W/rec2.jsonl <<'PY'
import collections, json, sys
for path in sys.argv[1:]:
    outcomes = collections.Counter(json.loads(line)["outcome"] for line in open(path))
    print(path, dict(outcomes))
second = collections.Counter(json.loads(line)["outcome"] for line in open(sys.argv[2]))
print("RECORD-REBUILD:", "PASS" if second.get("generic", 0) == 0 and second.get("miss", 0) == 0 else "FAIL")
PY
      ;;
    tilelang)
      python3 tests/gpu/checks/check_tilelang.py --bundle .device/tilelang.nojit --vllm-src .device/vllm_src \
        --json "$OUT/check_tilelang.json" 2>&1 | tail -60 || rc=1
      ;;
    merge)
      build_triton $W/merged.nojit --merge .device/tilelang.nojit 2>&1 | tail -4 || rc=1
      python3 -m nojit.aot.cli inspect $W/merged.nojit --verify 2>&1 | head -12
      ;;
    callsites)
      [ -f $W/triton.nojit ] || ( time build_triton $W/triton.nojit ) 2>&1 | tail -3
      python3 tests/gpu/checks/check_call_sites.py --bundle $W/triton.nojit --vllm-src .device/vllm_src --plan "$PLAN" \
        --observed "$OUT/observed_keys.jsonl" --json "$OUT/check_call_sites.json" 2>&1 | tail -80 || rc=1
      python3 -m nojit.aot.cli coverage $W/triton.nojit --plan "$PLAN" --observed "$OUT/observed_keys.jsonl" \
        2>&1 | sed -n '/observed keys/,$p' | tail -80 || rc=1
      ;;
    pytest)
      [ -f $W/triton.nojit ] || build_triton $W/triton.nojit 2>&1 | tail -3
      NOJIT_TEST_BUNDLE=.device/tilelang.nojit NOJIT_TEST_TRITON_BUNDLE=$W/triton.nojit \
        python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider 2>&1 | tail -15 || rc=1
      ;;
    inprocess)
      # the stand-in-libcuda tests (test_inprocess_guard, test_fatbin_guard) are CI's: with a real libcuda.so.1 in the
      # process they test the real driver under the stand-in's expectations (3 failed on the H200, session 10)
      python3 -m pytest tests/gpu/test_inprocess_gpu.py tests/loader/strict/test_x86_relocate.py -q -s -ra \
        -p no:cacheprovider \
        2>&1 | tee "$OUT/inprocess.log" | tail -40 || rc=1
      ;;
    cutedsl)
      CUDA_DISABLE_PTX_JIT=1 python3 tests/gpu/checks/check_cutedsl.py --bundle .device/cutedsl.nojit \
        --json "$OUT/check_cutedsl.json" 2>&1 | tail -30 || rc=1
      ;;
    humming)
      CUDA_DISABLE_PTX_JIT=1 python3 tests/gpu/checks/check_humming.py --bundle .device/humming.nojit \
        --json "$OUT/check_humming.json" 2>&1 | tail -30 || rc=1
      ;;
    humming-gemm)
      rm -rf /tmp/hg-site
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/hg-site \
        .device-hg/wheels/*.whl || rc=1
      # the device has no vLLM (the bundle was built with 0.33.0): the one allowed difference, as in every step
      NOJIT_ALLOW_MISMATCH=vllm PYTHONPATH=/tmp/hg-site:$PYTHONPATH CUDA_DISABLE_PTX_JIT=1 python3 tests/gpu/checks/check_humming_gemm.py \
        --dir .device-hg --json "$OUT/check_humming_gemm.json" 2>&1 | tail -40 || rc=1
      ;;
    humming-jit)  # .device-hg from `python tools/prepare_humming_device.py --bundle .device/humming.nojit`
      rm -rf /tmp/hg-site
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/hg-site \
        .device-hg/wheels/*.whl || rc=1
      chmod +x .device-hg/site/humming/_native/*/nvrtc_compile 2>/dev/null  # Humming's NVRTC child (modes may not carry)
      NOJIT_ALLOW_MISMATCH=vllm PYTHONPATH=/tmp/hg-site:$PYTHONPATH CUDA_DISABLE_PTX_JIT=1 python3 tests/gpu/checks/check_humming_jit.py \
        --dir .device-hg --work $W/hg-jit --out "$OUT" --json "$OUT/check_humming_jit.json" 2>&1 || rc=1
      ;;
    deepgemm)
      if command -v strace >/dev/null; then
        strace -f -qq -e trace=execve,access -o "$OUT/deepgemm.strace" python3 tests/gpu/checks/check_deepgemm.py --dir .device/deepgemm \
          --json "$OUT/check_deepgemm.json" 2>&1 | tail -60 || rc=1
        N=$(awk '/nojit-deepgemm-calls-begin/{on=1} /nojit-deepgemm-calls-end/{on=0} on && / execve\(/{n++} END{print n+0}' "$OUT/deepgemm.strace")
        echo "processes started while DeepGEMM ran (execve between the check's markers): $N"
        [ "$N" = 0 ] || rc=1
      else  # no strace there (the device image has none): the C guard counts the processes in the check itself
        ${CC:-cc} -shared -fPIC -O2 -o $W/libnojit_exec_guard.so tests/gpu/checks/exec_guard.c -ldl || rc=1
        NOJIT_REQUIRE_GUARD=1 LD_PRELOAD=$W/libnojit_exec_guard.so python3 tests/gpu/checks/check_deepgemm.py --dir .device/deepgemm \
          --json "$OUT/check_deepgemm.json" 2>&1 | tail -60 || rc=1
      fi
      ;;
    wheel)
      [ -f $W/merged.nojit ] || { [ -f $W/triton.nojit ] || build_triton $W/triton.nojit 2>&1 | tail -3;
        python3 -m nojit.aot.cli build --from-plan "$PLAN" --kernel-sources "$MAP" --runtime triton -j 16 --quiet \
          -o $W/merged.nojit --merge .device/tilelang.nojit 2>&1 | tail -3; }
      rm -rf $W/wheelhouse $W/serve $W/nocc && mkdir -p $W/wheelhouse $W/nocc
      python3 -m nojit.aot.cli package $W/merged.nojit -o $W/wheelhouse || rc=1
      cp .whl/nojit-*.whl .whl/cffi-*.whl .whl/pycparser-*.whl .whl/zstandard-*.whl $W/wheelhouse/
      ls -l $W/wheelhouse
      for t in sh bash env uname cat ls ldconfig nvidia-smi python3; do p=$(PATH=$PATH:/sbin:/usr/sbin command -v $t) && ln -s "$p" $W/nocc/$t; done
      NOCC=$W/nocc
      # vLLM is not on this machine (the bundle pins vllm==0.33.0): --no-deps, every wheel named
      ( time PATH=$NOCC python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $W/serve \
          $W/wheelhouse/*.whl ) 2>&1 | tail -4 || rc=1
      PATH=$NOCC PYTHONPATH=$W/serve python3 - $W/installed_bundle_path <<'PY' || rc=1
import shutil, sys
from nojit.loader.bundle.installed import verified_installed_bundle
import nojit.loader.install
assert not any(shutil.which(c) for c in ("gcc", "cc", "c++", "nvcc", "ptxas")), "a compiler is on the PATH"
b = verified_installed_bundle()
print("nojit from", nojit.loader.install.__file__, "| installed bundle", b.distribution, b.path, b.sha256[:16])
open(sys.argv[1], "w").write(b.path)
PY
      IB=$(cat $W/installed_bundle_path)
      PY=$(command -v python3)  # the interpreter itself, not a link to it (a venv's python finds its packages by its path)
      [ -n "${WHEEL_SKIP_TRITON:-}" ] || NOJIT_CHECK_LOADER_PATH=$NOCC PYTHONPATH=$W/serve $PY tests/gpu/checks/check_triton.py \
        --bundle "$IB" --sources $MAP --parallel 8 --json "$OUT/check_wheel_triton.json" 2>&1 | tail -75 || rc=1
      PATH=$NOCC PYTHONPATH=$W/serve $PY tests/gpu/checks/check_tilelang.py --bundle "$IB" --vllm-src .device/vllm_src \
        --json "$OUT/check_wheel_tilelang.json" 2>&1 | tail -60 || rc=1
      ;;
    replace)
      [ -f $W/triton.nojit ] || build_triton $W/triton.nojit 2>&1 | tail -3
      build_triton $W/triton_exact.nojit --no-generic 2>&1 | tail -3
      NGPU=$(nvidia-smi -L | wc -l)  # one server per GPU where there are several; else 4 on the one
      python3 tests/gpu/checks/check_replace_under_load.py --bundle $W/triton.nojit --rebuilt $W/triton_exact.nojit --sources $MAP \
        --servers $([ "$NGPU" -gt 1 ] && echo "$NGPU" || echo 4) --readers 2 --duration "${REPLACE_SECONDS:-180}" --json "$OUT/replace_under_load.json" 2>&1 \
        | tail -40 || rc=1
      ;;
    autotune)
      python3 tests/gpu/checks/check_autotune.py --vllm-src .device/vllm_src --work $W/autotune \
        --json "$OUT/check_autotune.json" 2>&1 | tail -60 || rc=1
      ;;
    autotune-qwen)  # .device-qwen from tools/prepare_qwen_device.py on the build box
      NOJIT_AUTOTUNE_CASES=qwen python3 tests/gpu/checks/check_autotune.py --vllm-src .device-qwen/vllm_src \
        --work $W/autotune-qwen --json "$OUT/check_autotune_qwen.json" 2>&1 | tail -60 || rc=1
      ;;
    qwen)  # .device-qwen from tools/prepare_qwen_device.py on the build box
      Q=.device-qwen
      T0=$(date +%s%N)
      python3 -m nojit.aot.cli build --from-plan $Q/device.plan.json --kernel-sources $Q/kernels/map.json --runtime triton --no-generic \
        -j 16 --quiet -o $W/qwen.nojit 2>&1 | tail -20 || rc=1
      echo "qwen triton bundle built here from the plan in $(( ($(date +%s%N) - T0) / 1000000 )) ms"
      python3 -c "import json; p = json.load(open('$Q/plan.json')); a = [k for k, v in p['kernels'].items() if v['info'].get('autotune')]
print('autotuned kernels in the deployment plan:', len(a), a)"
      NOJIT_QWEN_FACTS=$Q/facts.json python3 tests/gpu/checks/check_call_sites.py --steps-module qwen_call_site_steps \
        --bundle $W/qwen.nojit --vllm-src $Q/vllm_src --plan $Q/device.plan.json --observed "$OUT/qwen_observed_keys.jsonl" \
        --json "$OUT/check_qwen_call_sites.json" 2>&1 | tail -60 || rc=1
      [ -n "$QWEN_SKIP_AUTOTUNE" ] || python3 tests/gpu/checks/check_autotune.py --vllm-src $Q/vllm_src --work $W/autotune \
        --json "$OUT/check_autotune.json" 2>&1 | tail -60 || rc=1
      ;;
    fastpath)
      [ -f $W/triton.nojit ] || ( time build_triton $W/triton.nojit ) 2>&1 | tail -3
      python3 bench/bench_fastpath.py --bundle $W/triton.nojit --sources $MAP --kernels 6 --cold-budget-s 40 \
        $( [ -f .device/tilelang.nojit ] && echo --tilelang-bundle .device/tilelang.nojit ) \
        --json "$OUT/bench_fastpath.json" 2>&1 || rc=1
      # kernel[grid] through the C bound grid: eager == CUDA-graph replay, byte for byte
      python3 tests/gpu/checks/check_bound_grid_graph.py --bundle $W/triton.nojit --sources $MAP --kernels 6 2>&1 | tail -30 || rc=1
      ;;
    flashinfer-launch)  # .device-fi from tools/prepare_flashinfer_device.py, carried with .whl only
      rm -rf /tmp/fi-site && mkdir -p /tmp/fi-site
      tar -xJf .device-fi/flashinfer_py.tar.xz -C /tmp/fi-site || rc=1
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/fi-site \
        .device-fi/wheels/apache_tvm_ffi-*.whl || rc=1
      # the process guard, built here (harness, before the check's process starts); the carried build if no cc
      ${CC:-cc} -shared -fPIC -O2 -o /tmp/fi-site/libnojit_exec_guard.so tests/gpu/checks/exec_guard.c -ldl \
        || cp .device-fi/libnojit_exec_guard.so /tmp/fi-site/ || rc=1
      CU13=$(python3 -c "import nvidia, os; print(next(d for p in nvidia.__path__
        if os.path.exists(os.path.join(d := os.path.join(p, 'cu13', 'lib'), 'libcudart.so.13'))))" 2>/dev/null \
        || echo /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib)
      echo "libcudart.so.13 from $CU13"
      LD_LIBRARY_PATH=$CU13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} PYTHONPATH=/tmp/fi-site:$PYTHONPATH \
        CUDA_DISABLE_PTX_JIT=1 LD_PRELOAD=/tmp/fi-site/libnojit_exec_guard.so \
        python3 tests/gpu/checks/check_flashinfer_launch.py --dir .device-fi --json "$OUT/check_flashinfer_launch.json" \
        2>&1 | tail -120 || rc=1
      ;;
    cutedsl-launch)  # .device-cu from tools/prepare_cutedsl_device.py on the CPU box
      rm -rf /tmp/cu-site
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/cu-site \
        .device-cu/wheels/apache_tvm_ffi-*.whl || rc=1
      # the device has no vLLM: its reference modules are mounted from .device-cu/vllm_src (tests/gpu/checks/vllm_mount.py)
      rm -f "$OUT/cutedsl.strace"; TRACE=()
      command -v strace >/dev/null && TRACE=(strace -f -qq -e trace=execve,access -o "$OUT/cutedsl.strace")
      PYTHONPATH=/tmp/cu-site:$PYTHONPATH CUDA_DISABLE_PTX_JIT=1 ${TRACE[@]+"${TRACE[@]}"} python3 tests/gpu/checks/check_cutedsl_launch.py \
        --dir .device-cu --json "$OUT/check_cutedsl_launch.json" 2>&1 | tail -50 || rc=1
      [ -f "$OUT/cutedsl.strace" ] && echo "processes started during the CuTeDSL calls (execve between the check's markers):" \
        "$(awk '/nojit-cutedsl-calls-begin/{on=1} /nojit-cutedsl-calls-end/{on=0} on && / execve\(/{n++} END{print n+0}' "$OUT/cutedsl.strace")"
      ;;
    gdn)  # .device-gdn from tools/prepare_gdn_device.py on the CPU box
      rm -rf /tmp/gdn-site
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/gdn-site \
        .device-gdn/wheels/apache_tvm_ffi-*.whl || rc=1
      PYTHONPATH=/tmp/gdn-site:$PYTHONPATH CUDA_DISABLE_PTX_JIT=1 python3 tests/gpu/checks/check_gdn_prefill.py \
        --dir .device-gdn --json "$OUT/check_gdn_prefill.json" 2>&1 | tail -30 || rc=1
      ;;
    gdn-fi)  # call 2: .device-gdnfi carried, .device-gdnfi-ir staged by call 1 on this machine (tools/prepare_gdnfi_device.py)
      S=/tmp/gdnfi-site; rm -rf $S $S.work
      python3 tests/gpu/checks/check_gdn_flashinfer.py --assemble $S || { rc=1; continue; }
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $S \
        .device-gdnfi/wheels/apache_tvm_ffi-*.whl || rc=1
      ${CC:-cc} -shared -fPIC -O2 -o $S/libnojit_exec_guard.so tests/gpu/checks/exec_guard.c -ldl || rc=1
      CU13=$(python3 -c "import nvidia, os; print(next(d for p in nvidia.__path__
        if os.path.exists(os.path.join(d := os.path.join(p, 'cu13', 'lib'), 'libcudart.so.13'))))" 2>/dev/null \
        || echo /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib)
      GENV=(env LD_LIBRARY_PATH=$CU13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        PYTHONPATH=$S:$S/nvidia_cutlass_dsl/dsl_packages:$PYTHONPATH CUDA_DISABLE_PTX_JIT=1 LD_PRELOAD=$S/libnojit_exec_guard.so)
      "${GENV[@]}" python3 tests/gpu/checks/check_gdn_flashinfer.py --dir .device-gdnfi \
        --json "$OUT/check_gdn_flashinfer.json" 2>&1 | tail -60 || rc=1
      python3 tests/gpu/checks/check_gdn_flashinfer.py --role without --dir .device-gdnfi --out $W/gdn-minus1.nojit \
        > $W/gdn-minus1.txt || rc=1
      echo "negative control: removed $(tail -1 $W/gdn-minus1.txt)"
      "${GENV[@]}" python3 tests/gpu/checks/check_gdn_flashinfer.py --role negative --dir .device-gdnfi \
        --bundle $W/gdn-minus1.nojit --expect-file $W/gdn-minus1.txt 2>&1 | tail -20 || rc=1
      ;;
    one)  # this copy is OUT/repo of tools/prepare_one_device.py
      S=/tmp/one-site; rm -rf $S && mkdir -p $S
      [ -f .device-fi/flashinfer_py.tar.xz ] && { tar -xJf .device-fi/flashinfer_py.tar.xz -C $S || rc=1; }
      WHEELS=$(ls .device-fi/wheels/*.whl .device-cu/wheels/*.whl .device-hg/wheels/*.whl 2>/dev/null | awk -F/ '!seen[$NF]++')
      [ -n "$WHEELS" ] && { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $S $WHEELS || rc=1; }
      [ -f .device-dg/deep_gemm.tar.xz ] && { tar -xJf .device-dg/deep_gemm.tar.xz -C .device-dg || rc=1; }
      ${CC:-cc} -shared -fPIC -O2 -o $S/libnojit_exec_guard.so tests/gpu/checks/exec_guard.c -ldl || rc=1
      chmod +x .device-hg/site/humming/_native/*/nvrtc_compile 2>/dev/null
      # DeepGEMM's generated kernels compiled here with nojit's command line (a build step, before the process)
      [ -f .device-dg/src/sources.json ] && { python3 tests/gpu/checks/check_one_process.py --role deepgemm-build 2>&1 | tail -3 || rc=1; }
      MERGE=(--merge .device-one/rest.nojit)
      if grep -q '"runtime": "deepgemm"' .device-one/preflight.plan.json && [ -d .device-dg/deep_gemm/include/cute ]; then
        # DeepGEMM's planned entries (its own generated source and flags, enumerated on the box) compiled here by
        # `nojit build --from-plan` with this machine's nvcc (16 jobs): the box's 2 cores take over an hour for 203
        nvcc --version | tail -2
        T0=$(date +%s%N)
        NOJIT_DEEPGEMM_PACKAGE=.device-dg/deep_gemm python3 -m nojit.aot.cli build --from-plan .device-one/preflight.plan.json \
          --kernel-sources "$MAP" --runtime deepgemm -j 16 --quiet -o $W/dg.nojit 2>&1 | tail -4 && MERGE+=(--merge $W/dg.nojit) || rc=1
        echo "deepgemm entries compiled here from the plan in $(( ($(date +%s%N) - T0) / 1000000 )) ms"
        [ -f .device-one/box_deepgemm.json ] && python3 tests/gpu/checks/check_one_process.py --role deepgemm-same \
          --bundle $W/dg.nojit --box .device-one/box_deepgemm.json 2>&1 | tail -3
      fi
      T0=$(date +%s%N)
      build_triton $W/one.nojit "${MERGE[@]}" 2>&1 | tail -4 || rc=1
      echo "triton entries built here from the plan and merged with ${MERGE[*]} in $(( ($(date +%s%N) - T0) / 1000000 )) ms"
      python3 -m nojit.aot.cli inspect $W/one.nojit 2>&1 | head -14
      # the JIT reference of vLLM's call sites, Triton's JIT from an empty cache (also the JIT side of the table)
      T0=$(date +%s%N)
      TRITON_CACHE_DIR=$(mktemp -d) python3 tests/gpu/checks/check_call_sites.py --child jit --vllm-src .device/vllm_src \
        --seed 1 --out $W/jit.json --replay $W/jit_writes.pt 2>&1 | tail -5 || rc=1
      echo "call-site JIT reference run (empty Triton cache): $(( ($(date +%s%N) - T0) / 1000000 )) ms"
      python3 -c "import json; j=json.load(open('$W/jit.json')); print('JIT run:', len(j['compiles']), 'Triton compiles,', round(j['seconds'], 1), 's of steps')" || rc=1
      [ -f .device-cu/manifest.json ] && { PYTHONPATH=$S:$PYTHONPATH python3 tests/gpu/checks/check_one_process.py --role cutedsl-link \
        --bundle $W/one.nojit --cutedsl-work $W/cute 2>&1 | tail -3 || rc=1; }
      mkdir -p $W/nocc
      for t in sh bash env uname cat ls ldconfig nvidia-smi python3; do p=$(PATH=$PATH:/sbin:/usr/sbin command -v $t) && ln -sf "$p" $W/nocc/$t; done
      CU13=$(python3 -c "import nvidia, os; print(next(d for p in nvidia.__path__
        if os.path.exists(os.path.join(d := os.path.join(p, 'cu13', 'lib'), 'libcudart.so.13'))))" 2>/dev/null \
        || echo /opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib)
      PY=$(command -v python3)
      ONE_ENV=(env PATH=$W/nocc LD_LIBRARY_PATH=$CU13${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
        PYTHONPATH=$S:.device-hg/site:$PYTHONPATH CUDA_DISABLE_PTX_JIT=1 HUMMING_DISABLE_PARALLEL_BUILD=1
        LD_PRELOAD=$S/libnojit_exec_guard.so)
      "${ONE_ENV[@]}" $PY tests/gpu/checks/check_one_process.py --bundle $W/one.nojit --plan .device-one/preflight.plan.json \
        --jit-json $W/jit.json --seed 1 --cutedsl-work $W/cute --json "$OUT/check_one.json" 2>&1 | tail -150 || rc=1
      EXPECT=$(python3 tests/gpu/checks/check_one_process.py --role without --bundle $W/one.nojit --out $W/minus1.nojit --drop-entry 0)
      echo "negative control: removed $EXPECT"
      "${ONE_ENV[@]}" $PY tests/gpu/checks/check_one_process.py --role negative --bundle $W/minus1.nojit \
        --plan .device-one/preflight.plan.json --cutedsl-work $W/cute --expect "$EXPECT" 2>&1 | tail -12 || rc=1
      [ -d .device-dg/deep_gemm/include/cute ] && { CUDA_HOME=${CUDA_HOME:-/usr/local/cuda} timeout 200 python3 \
        tests/gpu/checks/check_one_process.py --role deepgemm-jit --plan .device-one/preflight.plan.json --sample "${DG_JIT_SAMPLE:-4}" --seed 7 \
        --json "$OUT/deepgemm_jit.json" 2>&1 | tail -8 || rc=1; }
      python3 tests/gpu/checks/check_one_process.py --role table --json "$OUT/check_one.json" --jit-json $W/jit.json \
        --plan .device-one/preflight.plan.json || rc=1
      ;;
    flashinfer)  # .device/flashinfer.nojit from `nojit build --runtime flashinfer` on the CPU box
      python3 tests/gpu/checks/check_flashinfer.py .device/flashinfer.nojit --json "$OUT/check_flashinfer.json" 2>&1 | tail -20 || rc=1
      ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
exit $rc
