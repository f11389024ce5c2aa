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
      python3 tests/gpu/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 \
        --json "$OUT/check_triton.json" 2>&1 | tail -75 || rc=1
      python3 tests/gpu/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 --variant generic --time \
        --json "$OUT/check_generic.json" 2>&1 | tail -75 || rc=1
      python3 bench/bench_dispatch.py --bundle $W/triton.nojit --sources $MAP 2>&1
      ;;
    generic)
      build_triton $W/triton.nojit 2>&1 | tail -3
      python3 tests/gpu/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 --variant generic --time \
        --json "$OUT/check_generic.json" 2>&1 | tail -75 || rc=1
      ;;
    misaligned)
      [ -f $W/triton.nojit ] || build_triton $W/triton.nojit 2>&1 | tail -3
      python3 tests/gpu/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 --variant misaligned \
        --json "$OUT/check_misaligned.json" 2>&1 | tail -75 || rc=1
      ;;
    record)
      rm -f $W/rec1.jsonl $W/rec2.jsonl
      python3 tests/gpu/check_triton.py --bundle $W/triton.nojit --sources $MAP --parallel 8 --variant perturbed \
        --mode record --record-file $W/rec1.jsonl 2>&1 | tail -75 || rc=1
      build_triton $W/triton2.nojit --add-keys $W/rec1.jsonl 2>&1 | tail -4 || rc=1
      python3 tests/gpu/check_triton.py --bundle $W/triton2.nojit --sources $MAP --parallel 8 --variant perturbed \
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
      python3 tests/gpu/check_tilelang.py --bundle .device/tilelang.nojit --vllm-src .device/vllm_src \
        --json "$OUT/check_tilelang.json" 2>&1 | tail -60 || rc=1
      ;;
    merge)
      build_triton $W/merged.nojit --merge .device/tilelang.nojit 2>&1 | tail -4 || rc=1
      python3 -m nojit.aot.cli inspect $W/merged.nojit --verify 2>&1 | head -12
      ;;
    pytest)
      NOJIT_TEST_BUNDLE=.device/tilelang.nojit NOJIT_TEST_TRITON_BUNDLE=$W/triton.nojit \
        python3 -m pytest tests/gpu -m gpu -q -p no:cacheprovider 2>&1 | tail -15 || rc=1
      ;;
    fastpath)
      [ -f $W/triton.nojit ] || ( time build_triton $W/triton.nojit ) 2>&1 | tail -3
      python3 bench/bench_fastpath.py --bundle $W/triton.nojit --sources $MAP --cold-budget-s 60 \
        --json "$OUT/bench_fastpath.json" 2>&1 || rc=1
      ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
exit $rc
