#!/usr/bin/env bash
# Runs the daemon's process-level tests on a GPU host with the CUDA backend
# and real CUDA IPC, from binaries built elsewhere (bazel -c opt):
#   .device/daemon/server/pagealloc-server
#   .device/daemon/client/pagealloc-cli
#   .device/daemon/tests/{load_client,multi_client_test,server_process_test,
#                         stress_test}
#   .device/lib/  the Debian shared libraries they link
# then a longer run of 8 load clients against one CUDA daemon. Logs go to
# $OUT (default /tmp/pagealloc-gpu-daemon).
set -u
OUT=${OUT:-/tmp/pagealloc-gpu-daemon}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.device/lib
export PAGEALLOC_TEST_BACKEND=cuda
cd .device/daemon || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"

export PAGEALLOC_STRESS_SECONDS=${PAGEALLOC_STRESS_SECONDS:-20}
for t in multi_client_test server_process_test stress_test; do
  echo "== $t (CUDA backend)"
  timeout 240 "tests/$t" >"$OUT/$t.log" 2>&1
  echo "== exit $?"
  grep -E "^\[  (PASSED|FAILED|  OK|SKIPPED) |killed and replaced" "$OUT/$t.log" | tail -n 12
done

echo "== 8 clients x 10 s against one CUDA daemon (4 of them async)"
sock=/tmp/pagealloc-gpu-soak.sock
server/pagealloc-server --backend=cuda --gpu=0 --listen=unix://$sock \
  --num_pages=4096 --page_size=16 --lease_ms=2000 --metrics_port=0 \
  --debug_checks >"$OUT/soak_server.log" 2>&1 &
server=$!
for i in $(seq 50); do [ -S $sock ] && break; sleep 0.1; done
python3 - <<'PY'
import os
fd = os.open("/dev/shm/pagealloc-gpu-claims", os.O_CREAT | os.O_RDWR | os.O_TRUNC, 0o600)
os.ftruncate(fd, 4097 * 4)
PY
pids=()
for i in $(seq 8); do
  async=false; [ $((i % 2)) -eq 0 ] && async=true
  tests/load_client --target=unix://$sock --claims_shm=/pagealloc-gpu-claims \
    --client_index=$i --duration_ms=10000 --async_completion=$async \
    >>"$OUT/soak_clients.log" 2>&1 &
  pids+=($!)
done
fail=0
for p in "${pids[@]}"; do wait "$p" || fail=1; done
echo "== clients exit (0 = all passed): $fail"
cat "$OUT/soak_clients.log"
sleep 0.5
client/pagealloc-cli --target=unix://$sock stats | tee "$OUT/soak_stats.txt"
kill -TERM $server; wait $server; echo "== server exit $?"
grep -E "critical|error|serving on" "$OUT/soak_server.log" | head -5
