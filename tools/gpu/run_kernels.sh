#!/usr/bin/env bash
# The CUDA kernels on a GPU host, from a package made by package.sh:
#   1. the GPU test (tests/gpu:cuda_executor_test), in full
#   1b. the client library's expansion on the caller's stream
#      (tests/gpu:local_expansion_test: last_loc on the device, slots
#      against the host expansion and the thin path), and its copy of freed
#      slots to the host after the stream's work (tests/gpu:copy_to_host_test)
#   2. kernel_benchmark: every case of the seed's Triton anchor benchmark,
#      the empty-kernel floors and the GPU's write bandwidth (ours.json)
#   3. with --anchor DIR (a directory holding the seed's triton_anchor.py and
#      seed_triton_kernels.py; by default the package's anchor/, where
#      package.sh --anchor put them; needs python3 with torch and triton): the
#      seed's kernels on the same GPU (anchor.json), then bench/compare.py's
#      side-by-side table and targets (compare.md)
#   4. the GPU test, shrunk (PAGEALLOC_GPU_TEST_QUICK=1), under
#      compute-sanitizer memcheck (with leak check) and racecheck
# Usage: run_kernels.sh [--anchor DIR] [OUT_DIR]   (default ./gpu-results)
# Writes OUT_DIR/kernels/; exits 1 if a step failed, 2 if it cannot run here.

set -u
STEP_KIND=kernels
source "$(dirname "$0")/gpu_common.sh"
gpu_setup "$@"
[[ -z $ANCHOR && -d $PKG/anchor ]] && ANCHOR=$PKG/anchor
need_binaries tests/gpu/cuda_executor_test tests/gpu/local_expansion_test \
  tests/gpu/copy_to_host_test bench/kernel_benchmark

nvidia-smi >>"$OUT/gpu_test.log" 2>&1
# A GPU test binary, its gtest counts in the step's detail. The tests pass
# as skipped where CUDA finds no usable device: here, where the GPU is the
# point, that is a failure.
run_gpu_test() {
  local name=$1 limit=$2 log=$3 binary=$4 counts
  run_step "$name" "$limit" "$log" "$binary"
  counts=$(gtest_counts "$log")
  add_detail "$counts"
  [[ $counts == *skipped* ]] &&
    note_step "$name ran on the GPU" "FAILED" "CUDA found no usable GPU"
  return 0
}

run_gpu_test "GPU test" 90 "$OUT/gpu_test.log" \
  "$BIN/tests/gpu/cuda_executor_test"
run_gpu_test "local expansion test" 120 "$OUT/local_expansion_test.log" \
  "$BIN/tests/gpu/local_expansion_test"
run_gpu_test "copy to host test" 60 "$OUT/copy_to_host_test.log" \
  "$BIN/tests/gpu/copy_to_host_test"

run_step "kernel_benchmark" 170 "$OUT/bench.log" \
  "$BIN/bench/kernel_benchmark" --json="$OUT/ours.json"

if [[ -n $ANCHOR ]]; then
  if [[ -f $ANCHOR/triton_anchor.py && -f $ANCHOR/seed_triton_kernels.py ]]; then
    PYTHONUNBUFFERED=1 run_step "seed's Triton anchor" 150 "$OUT/anchor.log" \
      python3 "$ANCHOR/triton_anchor.py" --json "$OUT/anchor.json"
    if [[ -s $OUT/anchor.json && -s $OUT/ours.json ]] &&
      python3 "$PKG/compare.py" "$OUT/anchor.json" "$OUT/ours.json" \
        >"$OUT/compare.md" 2>&1; then
      note_step "side by side" "ok" "compare.md: $(grep -E 'miss a target' \
        "$OUT/compare.md" || echo 'every target met')"
    else
      note_step "side by side" "FAILED" "no anchor.json or ours.json, or compare.py failed"
    fi
  else
    note_step "seed's Triton anchor" "FAILED" \
      "$ANCHOR lacks triton_anchor.py or seed_triton_kernels.py"
  fi
else
  note_step "seed's Triton anchor" "skipped" "no --anchor DIR given"
fi

export PAGEALLOC_GPU_TEST_QUICK=1
if command -v compute-sanitizer >/dev/null; then
  run_step "memcheck" 120 "$OUT/memcheck.log" compute-sanitizer \
    --tool memcheck --leak-check full --error-exitcode 9 \
    "$BIN/tests/gpu/cuda_executor_test"
  add_detail "$(gtest_counts "$OUT/memcheck.log")"
  add_detail "$(grep -oE '(ERROR|LEAK) SUMMARY: .*' "$OUT/memcheck.log" |
    paste -sd ';' -)"
  run_step "racecheck" 60 "$OUT/racecheck.log" compute-sanitizer \
    --tool racecheck --error-exitcode 9 "$BIN/tests/gpu/cuda_executor_test"
  add_detail "$(gtest_counts "$OUT/racecheck.log")"
  add_detail "$(grep -oE 'RACECHECK SUMMARY: .*' "$OUT/racecheck.log")"
else
  note_step "memcheck, racecheck" "FAILED" \
    "compute-sanitizer not found (put the CUDA toolkit's bin/ on PATH or set CUDA_HOME)"
fi

echo
grep -E "^(floor|fill|extend|decode|kind|        bulk)" "$OUT/bench.log" | head -40
[[ -f $OUT/compare.md ]] && cat "$OUT/compare.md"
print_summary
