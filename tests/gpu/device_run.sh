#!/usr/bin/env bash
# GPU checks on the device machine, from the repository root, with .whl and .device carried.
#   bash tests/gpu/device_run.sh triton    # Triton slice: build with the local Triton, check, benchmark
#   bash tests/gpu/device_run.sh tilelang  # TileLang (mHC): .device/tilelang.nojit vs float64 references
# Installs the carried wheels (nojit abi3 + cffi/pycparser/zstandard for this Python) into /tmp/site.
set -uo pipefail
OUT=${OUT:-/tmp/nojit-out}
mkdir -p "$OUT" /tmp/w
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__)"
for step in "$@"; do
  case "$step" in
    triton)
      python3 -m nojit.aot.cli build --from-plan .device/report.plan.json --kernel-sources .device/kernels/map.json \
        --runtime triton --no-generic -j 16 --quiet -o /tmp/w/triton.nojit 2>&1 | tail -16 | tee "$OUT/build_triton.txt"
      python3 tests/gpu/check_triton.py --bundle /tmp/w/triton.nojit --sources .device/kernels/map.json \
        --parallel 8 --json "$OUT/check_triton.json" 2>&1 | tee "$OUT/check_triton.txt"
      python3 bench/bench_dispatch.py --bundle /tmp/w/triton.nojit --sources .device/kernels/map.json 2>&1 | tee "$OUT/bench_dispatch.txt"
      ;;
    tilelang)
      python3 tests/gpu/check_tilelang.py --bundle .device/tilelang.nojit --vllm-src .device/vllm_src \
        --json "$OUT/check_tilelang.json" 2>&1 | tee "$OUT/check_tilelang.txt"
      ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
