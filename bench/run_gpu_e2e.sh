#!/usr/bin/env bash
# The end-to-end benchmark on a GPU host with the CUDA backend, from binaries
# built elsewhere (./bazelw build -c opt //bench:pagealloc-bench
# //server:pagealloc-server, copied to .device/e2e/, their Debian shared
# libraries in .device/lib/). Writes JSON and the log to $OUT.
#   1-2. AllocDecode(256) from one client, decode steps only: sync, async
#   3-4. the default scheduler mix, 1..16 clients: sync, async
set -u
OUT=${OUT:-/tmp/pagealloc-gpu-e2e}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.device/lib
bin=.device/e2e
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
nproc
common=(--backend=cuda --server_binary=$bin/pagealloc-server --batch=256
        --progress=false)
for mode in sync async; do
  async=false; [ $mode = async ] && async=true
  echo "== decode-only, 1 client, $mode"
  $bin/pagealloc-bench "${common[@]}" --async_completion=$async --clients=1 \
    --decode_weight=100 --prefill_weight=0 --spec_weight=0 \
    --duration_s=${DECODE_S:-10} --floor_s=3 --json="$OUT/decode_$mode.json"
  echo "== exit $?"
done
for mode in sync async; do
  async=false; [ $mode = async ] && async=true
  echo "== mixed sweep, $mode"
  $bin/pagealloc-bench "${common[@]}" --async_completion=$async \
    --sweep_clients=1,2,4,8,16 --duration_s=${SWEEP_S:-6} --floor_s=2 \
    --json="$OUT/sweep_$mode.json"
  echo "== exit $?"
done
