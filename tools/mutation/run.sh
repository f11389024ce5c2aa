#!/usr/bin/env bash
# Mutation run (cosmic-ray 8.7) of one target of issue 13, on a scratch copy of the tree (cosmic-ray
# edits the module in place: never on the worktree). One worker, niced: the CPU box is shared.
#
# usage: tools/mutation/run.sh TARGET [ONLY_FILE]
#   TARGET: reader | schema | expr | values | triton_key | tilelang_key  (table below)
#   ONLY_FILE: run exactly these mutants ("operator occurrence" per line; report.py --survivors writes it)
# env: EVERY (override the target's sample: 1 in EVERY sites; the session is then TARGET-everyN.sqlite),
#      CR (cosmic-ray executable; default: `cosmic-ray` on PATH, else the venv's; this run: /work/crvenv/bin/cosmic-ray),
#      PY (python with nojit's dependencies and pytest; default: the venv's), WORK (default /tmp/nojit-mutation)
# Results: $WORK/TARGET.sqlite; `python tools/mutation/report.py $WORK/TARGET.sqlite` summarizes.
set -euo pipefail
target=$1; only=${2:-}
root=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/nojit-mutation}
CR=${CR:-$(command -v cosmic-ray || echo "$root/.venv/bin/cosmic-ray")}
CRPY=$(dirname "$CR")/python
PY=${PY:-$root/.venv/bin/python}
# Tests per target: the fast, deterministic ones first (pytest -x stops at the first failure).
RS="tests/loader/bundle/test_schema_rules.py tests/loader/bundle/test_mutation_kills.py tests/loader/bundle/test_file.py tests/loader/bundle/test_launch_expr.py tests/loader/bundle/test_file_hostile.py"
RS_K="not real_bundle and not kernel_ids and not allow_mismatch and not install_checks and not driver_errors and not contained_outside"
case $target in
  reader)       module=loader/bundle/file.py;  every=2; tests="$RS"; k="$RS_K" ;;
  schema)       module=loader/bundle/manifest.py;     every=6; tests="$RS"; k="$RS_K" ;;
  expr)         module=loader/bundle/launch_expr.py;  every=6; tests="tests/loader/bundle/test_launch_expr.py tests/loader/bundle/test_mutation_kills.py tests/loader/bundle/test_schema_rules.py"; k="$RS_K" ;;
  values)       module=loader/bundle/key_values.py;   every=4; tests="tests/loader/bundle/test_schema_rules.py tests/loader/bundle/test_mutation_keys.py tests/loader/bundle/test_mutation_kills.py"; k="$RS_K" ;;
  triton_key)   module=loader/bundle/triton_key.py;   every=5; tests="tests/loader/bundle/test_mutation_keys.py"; k="triton" ;;
  tilelang_key) module=loader/bundle/tilelang_key.py; every=3; tests="tests/loader/bundle/test_mutation_keys.py"; k="tilelang" ;;
  *) echo "unknown target $target" >&2; exit 2 ;;
esac
[ -n "${EVERY:-}" ] && every=$EVERY
copy=$WORK/tree-$target
rm -rf "$copy"; mkdir -p "$copy/pkgroot/nojit"
(cd "$root" && git ls-files --cached --others --exclude-standard | tar -cf - -T -) | tar -xf - -C "$copy"
cp "$root"/loader/*.so "$copy/loader/" 2>/dev/null || true
touch "$copy/pkgroot/nojit/__init__.py"
ln -s "$copy/aot" "$copy/pkgroot/nojit/aot"; ln -s "$copy/loader" "$copy/pkgroot/nojit/loader"
# A fresh hypothesis example database per test run, fixed seed: each mutant's verdict is independent of order.
cat > "$copy/run-tests.sh" <<EOT
#!/usr/bin/env bash
hyp=\$(mktemp -d /tmp/nojit-mutation-hyp.XXXXXX); trap 'rm -rf "\$hyp"' EXIT
cd "$copy" && env PYTHONDONTWRITEBYTECODE=1 PYTHONPATH="$copy/pkgroot:$copy/tests" CUDA_VISIBLE_DEVICES= \
  HYPOTHESIS_STORAGE_DIRECTORY="\$hyp" NOJIT_FUZZ_EXAMPLES=60 \
  "$PY" -m pytest -x -q -p no:cacheprovider --hypothesis-seed=0 $tests -k "$k"
EOT
chmod +x "$copy/run-tests.sh"
cat > "$WORK/$target.toml" <<EOT
[cosmic-ray]
module-path = ["$module"]
timeout = 180.0
excluded-modules = []
test-command = "$copy/run-tests.sh"
[cosmic-ray.distributor]
name = "local"
EOT
db=$WORK/$target${EVERY:+-every$EVERY}${only:+-rerun}.sqlite
rm -f "$db"
cd "$copy"
"$CR" init "$WORK/$target.toml" "$db"
if [ -n "$only" ]; then "$CRPY" "$root/tools/mutation/sample.py" "$db" "$module" --only "$only"
else "$CRPY" "$root/tools/mutation/sample.py" "$db" "$module" --every "$every"; fi
echo "baseline: $(date -u +%H:%M:%S)"; time "$copy/run-tests.sh" >/dev/null || { echo "tests fail unmutated" >&2; exit 1; }
nice -n 15 "$CR" exec "$WORK/$target.toml" "$db"
"$CRPY" "$root/tools/mutation/report.py" "$db"
