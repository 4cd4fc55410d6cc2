#!/usr/bin/env bash
# Runs the GPU suite on a machine with a GPU, from binaries built elsewhere:
# the GPU test, the same test (shrunk) under compute-sanitizer memcheck and
# racecheck, kernel_benchmark, and the seed's Triton anchor benchmark, then
# the side-by-side table (limits sum to under the device tool's 600 s). Logs go to $OUT (default /tmp/pagealloc-gpu).
#
# Expects, relative to the repository root (see bench/RESULTS.md):
#   .device/bin/{cuda_executor_test,kernel_benchmark}  (bazel -c opt)
#   .device/lib/   the shared libraries they link (Debian's absl, gtest...)
#   .device/anchor/{triton_anchor,seed_triton_kernels}.py
set -u
OUT=${OUT:-/tmp/pagealloc-gpu}
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/cuda/bin
LIBS=$PWD/.device/lib
run() {  # run SECONDS LOG CMD...: our binaries, with their libraries
  local secs=$1 log=$2
  shift 2
  echo "== $* (limit ${secs}s)" | tee -a "$log"
  LD_LIBRARY_PATH=$LIBS timeout "$secs" "$@" >>"$log" 2>&1
  local rc=$?
  echo "== exit $rc" | tee -a "$log"
  tail -n 4 "$log"
}

{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; } \
  >"$OUT/gpu_test.log" 2>&1
run 90 "$OUT/gpu_test.log" .device/bin/cuda_executor_test
run 170 "$OUT/bench.log" .device/bin/kernel_benchmark --json="$OUT/ours.json"
echo "== anchor"
PYTHONUNBUFFERED=1 timeout 150 python3 .device/anchor/triton_anchor.py \
  --json "$OUT/anchor.json" >"$OUT/anchor.log" 2>&1
echo "== exit $?"
tail -n 3 "$OUT/anchor.log"
python3 bench/compare.py "$OUT/anchor.json" "$OUT/ours.json" | tee "$OUT/compare.md"
export PAGEALLOC_GPU_TEST_QUICK=1
run 120 "$OUT/memcheck.log" compute-sanitizer --tool memcheck \
  --leak-check full --error-exitcode 9 .device/bin/cuda_executor_test
run 60 "$OUT/racecheck.log" compute-sanitizer --tool racecheck \
  --error-exitcode 9 .device/bin/cuda_executor_test
grep -E "^(floor|fill|extend|decode|kind|        bulk)" "$OUT/bench.log" | head -40
cat "$OUT/compare.md"
