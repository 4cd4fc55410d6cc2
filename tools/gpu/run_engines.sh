#!/usr/bin/env bash
# The engine-level Python tests and benchmarks on a GPU host with the CUDA
# backend, from a package made by package.sh: docs/performance.md's "Slots
# expanded in process", "SGLang's current contract: alloc(need_size) on the
# reserve" and "A scheduler's decode loop" tables, and the multi-replica
# benchmark, in one invocation. Each benchmark step starts a daemon of its
# own from the package (bin/server/pagealloc-server --backend=cuda) on a
# socket under the output directory and stops it after; the tests start
# theirs.
# Steps:
#   1. python_gpu_tests  python/tests/test_sglang_gpu.py (with --anchor's
#                        seed kernels) and test_local_expansion_gpu.py
#   2. local_expansion   local_expansion_bench.py, page size 16
#   3. sglang_alloc      sglang_alloc_bench.py, page sizes 1 and 16
#   4. engine_loop_alloc, engine_loop_decode  engine_loop_bench.py with
#                        none, sglang, pagealloc and pagealloc-thin in
#                        $PROCESSES scheduler processes (default 1,4);
#                        decode mode needs --anchor
#   5. multi_replica     multi_replica_bench.py, split, shared and
#                        shared-prefix with $REPLICAS replicas (default
#                        1,2,3)
#   6. reclaim           reclaim_bench.py: a starving session's wait for
#                        another's unused reserve, 16 and 256 pages
# Needs python3 with PyTorch (and Triton for the seed's kernels). STEPS
# (default all six names) picks steps by name; ENGINE_STEPS (200) sets the
# decode loops' steps; ENGINE_MODES (alloc decode) which of their modes run.
# ENGINE_ALLOCATORS their --allocators (none,sglang,pagealloc,pagealloc-copy,
# pagealloc-thin). ENGINE_INTERLEAVE=B runs the allocators side by side in
# every process, B steps each in turn (engine_loop_bench.py --interleave).
# MPS=1 runs everything under a CUDA MPS control daemon of the run's own.
# Usage: run_engines.sh [--anchor DIR] [OUT_DIR]
#   (default ./gpu-results). Writes OUT_DIR/engines/: a log and a JSON per
#   step and summary.md (the steps, then each benchmark's table); exits 1
#   if a step failed, 2 if it cannot run here.

set -u
STEP_KIND=engines
source "$(dirname "$0")/gpu_common.sh"
gpu_setup "$@"
[[ -z $ANCHOR && -d $PKG/anchor ]] && ANCHOR=$PKG/anchor
need_binaries server/pagealloc-server
[[ -f $BIN/client/libpagealloc_client.so ]] ||
  die "the package has no bin/client/libpagealloc_client.so"
command -v python3 >/dev/null || die "python3 is needed"
python3 -c 'import torch' 2>/dev/null || die "python3 cannot import torch"

export PAGEALLOC_LIBRARY=$BIN/client/libpagealloc_client.so
export PAGEALLOC_SERVER=$BIN/server/pagealloc-server
export PYTHONPATH=$PKG/python:$PKG/python/tests${PYTHONPATH:+:$PYTHONPATH}
steps=${STEPS:-python_gpu_tests local_expansion sglang_alloc engine_loop multi_replica reclaim}
processes=${PROCESSES:-1,4}
replicas=${REPLICAS:-1,2,3}
engine_steps=${ENGINE_STEPS:-200}
engine_modes=${ENGINE_MODES:-alloc decode}
engine_allocators=${ENGINE_ALLOCATORS:-none,sglang,pagealloc,pagealloc-copy,pagealloc-thin}
engine_interleave=${ENGINE_INTERLEAVE:-0}
bench=$PKG/python/bench

wanted() { [[ " $steps " == *" $1 "* ]]; }

# start_daemon NAME FLAGS...: a CUDA daemon on $OUT/NAME.sock; sets TARGET.
DAEMONS=()
start_daemon() {
  local name=$1
  shift
  local sock=$OUT/$name.sock
  "$BIN/server/pagealloc-server" --backend=cuda --listen="unix://$sock" \
    --metrics_port=0 "$@" >"$OUT/$name.daemon.log" 2>&1 &
  DAEMONS+=($!)
  local i
  for ((i = 0; i < 300; ++i)); do
    [[ -S $sock ]] && break
    sleep 0.1
  done
  [[ -S $sock ]] || {
    tail -n 20 "$OUT/$name.daemon.log"
    die "the $name daemon did not start (see $OUT/$name.daemon.log)"
  }
  TARGET=unix://$sock
}
stop_daemons() {
  local pid
  for pid in "${DAEMONS[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  DAEMONS=()
}
at_exit stop_daemons

# table LOG: the Markdown table a benchmark printed at its end.
table() { sed -n '/^| /p' "$1"; }

if wanted python_gpu_tests; then
  log=$OUT/python_gpu_tests.log
  PAGEALLOC_TEST_BACKEND=cuda PAGEALLOC_SGLANG_ANCHOR_DIR=${ANCHOR:-} \
    run_step python_gpu_tests 900 "$log" python3 -m pytest -p \
    no:cacheprovider -rs -v "$PKG/python/tests/test_sglang_gpu.py" \
    "$PKG/python/tests/test_local_expansion_gpu.py"
  add_detail "$(grep -E '^=+ .*(passed|failed)' "$log" | tail -n 1)"
fi

if wanted local_expansion; then
  start_daemon expansion --semantics=sglang --page_size=16 --num_pages=262144
  log=$OUT/local_expansion.log
  run_step local_expansion 600 "$log" python3 "$bench/local_expansion_bench.py" \
    --target "$TARGET" --json "$OUT/local_expansion.json"
  add_section "### local_expansion_bench (page size 16)"$'\n\n'"$(table "$log")"
  stop_daemons
fi

if wanted reclaim; then
  start_daemon reclaim --page_size=16 --num_pages=16384
  for pages in 16 256; do
    log=$OUT/reclaim_$pages.log
    run_step "reclaim_$pages" 300 "$log" python3 "$bench/reclaim_bench.py" \
      --target "$TARGET" --pages "$pages" --iterations 200 \
      --json "$OUT/reclaim_$pages.json"
    add_section "### reclaim_bench, $pages pages"$'\n\n'"$(tail -1 "$log")"
  done
  stop_daemons
fi

if wanted sglang_alloc; then
  start_daemon alloc1 --semantics=sglang --page_size=1 --num_pages=4000000
  t1=$TARGET
  start_daemon alloc16 --semantics=sglang --page_size=16 --num_pages=250000
  log=$OUT/sglang_alloc.log
  run_step sglang_alloc 600 "$log" python3 "$bench/sglang_alloc_bench.py" \
    --target "$t1" --target "$TARGET" --json "$OUT/sglang_alloc.json"
  add_section "### sglang_alloc_bench"$'\n\n'"$(table "$log")"
  stop_daemons
fi

if wanted engine_loop; then
  for mode in $engine_modes; do
    if [[ $mode == decode && -z $ANCHOR ]]; then
      note_step engine_loop_decode "skipped (no --anchor: SGLang's decode" \
        "kernel is the seed's)" ""
      continue
    fi
    start_daemon "engine_$mode" --semantics=sglang --page_size=16 \
      --num_pages=262144
    log=$OUT/engine_loop_$mode.log
    run_step "engine_loop_$mode" 1200 "$log" python3 \
      "$bench/engine_loop_bench.py" \
      --allocators "$engine_allocators" --target "$TARGET" \
      --processes "$processes" --mode "$mode" --steps "$engine_steps" \
      --interleave "$engine_interleave" ${ANCHOR:+--seed_kernels "$ANCHOR"} \
      --json "$OUT/engine_loop_$mode.json"
    add_section "### engine_loop_bench --mode $mode"$'\n\n'"$(table "$log")"
    stop_daemons
  done
fi

if wanted multi_replica; then
  flags=$(python3 "$bench/multi_replica_bench.py" --print_daemon_flags)
  # shellcheck disable=SC2086  # the flags are words
  start_daemon replicas $flags
  log=$OUT/multi_replica.log
  # (--check is for the CPU: its reference computes in float64, and bf16
  # on the GPU picks other tokens.)
  run_step multi_replica 1800 "$log" python3 "$bench/multi_replica_bench.py" \
    --target "$TARGET" --replicas "$replicas" \
    --json "$OUT/multi_replica.json"
  add_section "### multi_replica_bench"$'\n\n'"$(table "$log")"
  stop_daemons
fi

print_summary
