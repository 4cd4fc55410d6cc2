#!/usr/bin/env bash
# The daemon's process-level tests on a GPU host with the CUDA backend, its
# rings and completion counter shared as CUDA virtual-memory file
# descriptors over the memory socket, from a package made by package.sh:
#   1. completion_counter_test: clients of a CUDA daemon read their slots
#      with kernels on their own streams, ordered only by the completion
#      counter (sync and async, fast channel and gRPC)
#   2. multi_client_test (half its clients async), server_process_test and
#      stress_test (20 s of SIGKILLed and replaced clients;
#      PAGEALLOC_STRESS_SECONDS and PAGEALLOC_STRESS_CLIENTS change it),
#      with PAGEALLOC_TEST_BACKEND=cuda
#   3. the KV slab: cuda_vmm_test (VMM export/import, import+map by size,
#      the completion counter's stream write and wait), kv_slab_gpu_test
#      (the scrub kernel against the CPU reference), Register+map of 1, 10
#      and 100 GiB slabs (kv_example), kv_slab_test with CUDA writers (a
#      kernel on each writer's stream, ordered only by the completion
#      counter, with and without --kv_scrub), and what the scrub kernel
#      costs per page (kv_scrub_gpu_benchmark: its table ends the summary)
#   3a. release_fence_test: a session's queued read of pages it freed
#      fenced on its stream never sees the KV of the session that gets them
#      next (asserted, 4 runs); with a plain free the hazard is reported
#   3b. ring_flood_test: a client's flood of the largest rings stops at the
#      daemon's GPU budget, and another process allocates the rest of the
#      GPU
#   3c. prefix_match_benchmark: match and adopt of a published 2,048-page
#      chain (32k tokens at page size 16) against a CUDA daemon of its own,
#      through the fast channel and over gRPC (its table ends the summary),
#      and prefix_benchmark, the pool's own share on this host's CPU
#   3d. snapshot_benchmark: what a snapshot of the pool's kept state stalls
#      the pool for on this host's CPU (64k and 1M pages)
#   4. a soak: 8 load_client processes (4 sync, 4 async completion) for 10 s
#      against one CUDA daemon with --debug_checks, sharing a claim table
#      that catches a slot handed to two clients; then every page must be
#      back in the pool and the daemon must drain and exit 0
# Usage: run_daemon_suite.sh [OUT_DIR]   (default ./gpu-results)
# Writes OUT_DIR/daemon/; exits 1 if a step failed, 2 if it cannot run here.

set -u
STEP_KIND=daemon
source "$(dirname "$0")/gpu_common.sh"
gpu_setup "$@"
need_binaries server/pagealloc-server client/pagealloc-cli tests/load_client \
  tests/multi_client_test tests/server_process_test tests/stress_test \
  tests/gpu/completion_counter_test tests/gpu/kv_slab_gpu_test tests/kv_slab_test \
  tests/gpu/ring_flood_test tests/gpu/release_fence_test \
  memory/cuda_vmm_test \
  tests/kv_writer client/kv_example bench/kv_scrub_gpu_benchmark \
  bench/prefix_match_benchmark allocator/prefix_benchmark \
  kept_state/snapshot_benchmark

# The tests find server/pagealloc-server and tests/load_client relative to
# the working directory when Bazel's TEST_SRCDIR is not set.
cd "$BIN" || die "cannot enter $BIN"
export PAGEALLOC_TEST_BACKEND=cuda
export PAGEALLOC_STRESS_SECONDS=${PAGEALLOC_STRESS_SECONDS:-20}

# Skipping is failing here: this host has a GPU.
run_step completion_counter_test 240 "$OUT/completion_counter_test.log" \
  tests/gpu/completion_counter_test
add_detail "$(gtest_counts "$OUT/completion_counter_test.log")"
grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |slots read on the GPU|Failure|kernel read" \
  "$OUT/completion_counter_test.log" | tail -n 20
if grep -q "SKIPPED" "$OUT/completion_counter_test.log"; then
  note_step "completion_counter_test (no skips)" "FAILED" \
    "a GPU test skipped on a GPU host: completion_counter_test.log"
fi

# Frees fenced on the freeing session's stream: its queued read sees only
# its own KV; a plain free's hazard is printed per run, not asserted.
run_step release_fence_test 240 "$OUT/release_fence_test.log" \
  tests/gpu/release_fence_test
add_detail "$(gtest_counts "$OUT/release_fence_test.log")"
grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |free, run|hazard showed|Failure" \
  "$OUT/release_fence_test.log" | tail -n 20
if grep -q "SKIPPED" "$OUT/release_fence_test.log"; then
  note_step "release_fence_test (no skips)" "FAILED" \
    "a GPU test skipped on a GPU host: release_fence_test.log"
fi

# A flood of the largest rings stops at the GPU budget; another process
# allocates the rest of the GPU.
run_step ring_flood_test 240 "$OUT/ring_flood_test.log" tests/gpu/ring_flood_test
add_detail "$(gtest_counts "$OUT/ring_flood_test.log")"
grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |ring flood:|Failure" \
  "$OUT/ring_flood_test.log" | tail -n 20
if grep -q "SKIPPED" "$OUT/ring_flood_test.log"; then
  note_step "ring_flood_test (no skips)" "FAILED" \
    "a GPU test skipped on a GPU host: ring_flood_test.log"
fi

# CUDA VMM memory shared as file descriptors: export/import aliasing,
# import+map times for 1, 10 and 100 GiB, the stream write and wait through
# such memory; the scrub kernel against the CPU reference; then the
# multi-process slab test against a CUDA daemon.
run_step cuda_vmm_test 240 "$OUT/cuda_vmm_test.log" memory/cuda_vmm_test
add_detail "$(gtest_counts "$OUT/cuda_vmm_test.log")"
grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |GiB|Failure" \
  "$OUT/cuda_vmm_test.log" | tail -n 20
if grep -q "SKIPPED" "$OUT/cuda_vmm_test.log"; then
  note_step "cuda_vmm_test (no skips)" "FAILED" \
    "a GPU test skipped on a GPU host: cuda_vmm_test.log"
fi
run_step kv_slab_gpu_test 240 "$OUT/kv_slab_gpu_test.log" \
  tests/gpu/kv_slab_gpu_test
add_detail "$(gtest_counts "$OUT/kv_slab_gpu_test.log")"
grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |Failure" \
  "$OUT/kv_slab_gpu_test.log" | tail -n 20
if grep -q "SKIPPED" "$OUT/kv_slab_gpu_test.log"; then
  note_step "kv_slab_gpu_test (no skips)" "FAILED" \
    "a GPU test skipped on a GPU host: kv_slab_gpu_test.log"
fi

# Register + map of the KV slab by its size: a CUDA daemon per size with a
# Llama-3-8B-shaped layout, then kv_example (connects, which maps the slab,
# writes and reads one request's K and V through it).
for size in 1GiB 10GiB 100GiB; do
  kvwork=$(mktemp -d /tmp/pagealloc-gpu-kv.XXXXXX)
  server/pagealloc-server --backend=cuda --gpu=0 \
    --listen="unix://$kvwork/daemon.sock" --page_size=16 --metrics_port=0 \
    --kv_layout=mha:layers=32,kv_heads=8,head_dim=128,dtype=bf16 \
    --kv_memory="$size" >"$OUT/kv_map_$size.server.log" 2>&1 &
  kvserver=$!
  for _ in $(seq 300); do
    [[ -S $kvwork/daemon.sock ]] && break
    kill -0 "$kvserver" 2>/dev/null || break
    sleep 0.1
  done
  run_step "kv_map_$size" 120 "$OUT/kv_map_$size.log" \
    client/kv_example --target="unix://$kvwork/daemon.sock"
  add_detail "$(grep -Eo "connected and mapped in [^:]*" "$OUT/kv_map_$size.log" \
    | head -n 1)"
  grep -E "connected and mapped|mismatches" "$OUT/kv_map_$size.log"
  kill -TERM "$kvserver" 2>/dev/null
  wait "$kvserver" 2>/dev/null
  rm -rf "$kvwork"
done

# What --kv_scrub costs per page: the scrub kernel on the MHA and MLA
# layouts, page sizes 1, 16 and 64, batches of 1, 16 and 256 pages.
run_step kv_scrub_gpu_benchmark 300 "$OUT/kv_scrub_gpu_benchmark.log" \
  bench/kv_scrub_gpu_benchmark
scrub_head=$(grep -E "^KV scrub kernel on" "$OUT/kv_scrub_gpu_benchmark.log")
scrub_rows=$(grep -E "^\|" "$OUT/kv_scrub_gpu_benchmark.log")
if [[ -n $scrub_rows ]]; then
  echo "$scrub_head"
  echo "$scrub_rows"
  add_detail "its table follows the summary"
  add_section "### KV scrub kernel (kv_scrub_gpu_benchmark.log)"$'\n\n'"$scrub_head"$'\n\n'"$scrub_rows"
fi

# Match and adopt of a 2,048-page chain, fast channel and gRPC, against a
# CUDA daemon the benchmark starts (server/pagealloc-server beside it).
run_step prefix_match_benchmark 300 "$OUT/prefix_match_benchmark.log" \
  bench/prefix_match_benchmark --backend=cuda --server_flags=--gpu=0
prefix_head=$(grep -E "^prefix_match_benchmark:" "$OUT/prefix_match_benchmark.log")
prefix_rows=$(grep -E "^\|" "$OUT/prefix_match_benchmark.log")
if [[ -n $prefix_rows ]]; then
  echo "$prefix_head"
  echo "$prefix_rows"
  add_detail "its table follows the summary"
  add_section "### Prefix match and adopt (prefix_match_benchmark.log)"$'\n\n'"$prefix_head"$'\n\n'"$prefix_rows"
fi

# The pool's own share of it on this host's CPU (the fake executor).
run_step prefix_benchmark 200 "$OUT/prefix_benchmark.log" \
  allocator/prefix_benchmark --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true
grep -E "_median" "$OUT/prefix_benchmark.log"

# What a snapshot of the kept state stalls the pool for (--keep_state),
# on this host's CPU.
run_step snapshot_benchmark 120 "$OUT/snapshot_benchmark.log" \
  kept_state/snapshot_benchmark --benchmark_repetitions=5 \
  --benchmark_report_aggregates_only=true
grep -E "_median" "$OUT/snapshot_benchmark.log"

for t in kv_slab_test multi_client_test restart_test server_process_test \
  stress_test; do
  run_step "$t" 240 "$OUT/$t.log" "tests/$t"
  add_detail "$(gtest_counts "$OUT/$t.log")"
  grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |killed and replaced|^restart_test:" \
    "$OUT/$t.log" | tail -n 12
done
# On a GPU host the CUDA backend starts, so server_process_test skips its
# one no-GPU case; a test that skips for want of a GPU would show here.
# One line for each way of stopping (SIGKILL, SIGTERM, handover).
while IFS= read -r restart_line; do
  add_detail "$restart_line"
done < <(grep -E "^restart_test:" "$OUT/restart_test.log")
stress_line=$(grep -E "killed and replaced" "$OUT/stress_test.log" | tail -n 1)
[[ -n $stress_line ]] && add_detail "$stress_line"

echo "== soak: 8 clients x 10 s against one CUDA daemon (4 of them async)"
work=$(mktemp -d /tmp/pagealloc-gpu-soak.XXXXXX)
sock=$work/daemon.sock
claims=/pagealloc-gpu-claims-$$
# shellcheck disable=SC2016  # expanded when the script exits
at_exit 'rm -rf "$work" "/dev/shm$claims"'
server/pagealloc-server --backend=cuda --gpu=0 --listen="unix://$sock" \
  --num_pages=4096 --page_size=16 --lease_ms=2000 --metrics_port=0 \
  --debug_checks >"$OUT/soak_server.log" 2>&1 &
server=$!
for _ in $(seq 100); do
  [[ -S $sock ]] && break
  kill -0 "$server" 2>/dev/null || break
  sleep 0.1
done
if [[ ! -S $sock ]]; then
  note_step "soak" "FAILED" "the daemon did not start: soak_server.log"
  tail -n 20 "$OUT/soak_server.log"
  kill -KILL "$server" 2>/dev/null
else
  # The claim table: one 32-bit holder per page of the pool (4096 and page
  # 0), zeroed, private to this user.
  (umask 077 && truncate -s $((4097 * 4)) "/dev/shm$claims")
  pids=()
  for i in $(seq 8); do
    async=false
    (( i % 2 == 0 )) && async=true
    tests/load_client --target="unix://$sock" --claims_shm="$claims" \
      --client_index="$i" --duration_ms=10000 --async_completion=$async \
      >>"$OUT/soak_clients.log" 2>&1 &
    pids+=($!)
  done
  clients_failed=0
  for p in "${pids[@]}"; do wait "$p" || clients_failed=$((clients_failed + 1)); done
  echo "== clients failed: $clients_failed of 8"
  cat "$OUT/soak_clients.log"
  # Each client ends its session on exit; the daemon returns its pages when
  # it processes that close, so wait for it (bounded) rather than a fixed time.
  used=
  for _ in $(seq 100); do
    client/pagealloc-cli --target="unix://$sock" stats >"$OUT/soak_stats.txt" 2>&1
    used=$(sed -n 's/^pages *\([0-9]*\) used.*/\1/p' "$OUT/soak_stats.txt")
    [[ $used == 0 ]] && break
    sleep 0.1
  done
  cat "$OUT/soak_stats.txt"
  kill -TERM "$server"
  wait "$server"
  server_rc=$?
  echo "== server exit $server_rc"
  grep -E "critical|error|serving on" "$OUT/soak_server.log" | head -5
  result=ok
  ((clients_failed == 0 && server_rc == 0)) && [[ $used == 0 ]] ||
    result=FAILED
  note_step "soak" "$result" "clients failed: $clients_failed of 8;\
 pages used at the end: ${used:-unknown}; daemon exit $server_rc;\
 soak_clients.log, soak_stats.txt, soak_server.log"
fi

print_summary
