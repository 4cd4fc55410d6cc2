#!/usr/bin/env bash
# The end-to-end benchmark on a GPU host with the CUDA backend, from binaries
# built elsewhere (./bazelw build -c opt //bench:pagealloc-bench
# //server:pagealloc-server, copied to .device/e2e/, their Debian shared
# libraries in .device/lib/). Writes JSON and the log to $OUT.
#   1-2. AllocDecode(256) from one client, decode steps only, through the
#        fast channel (the client library's default): sync, async
#   3.   the same through gRPC (--fast_channel=false), sync
#   4-5. the default scheduler mix, 1..16 clients, fast channel: sync, async
#   6.   the default mix, 1..16 clients, through gRPC, sync
set -u
OUT=${OUT:-/tmp/pagealloc-gpu-e2e}
mkdir -p "$OUT"
export LD_LIBRARY_PATH=$PWD/.device/lib
bin=.device/e2e
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader
nproc
common=(--backend=cuda --server_binary=$bin/pagealloc-server --batch=256
        --progress=false)
decode=(--clients=1 --decode_weight=100 --prefill_weight=0 --spec_weight=0
        --duration_s=${DECODE_S:-6} --floor_s=2)
for mode in sync async; do
  async=false; [ $mode = async ] && async=true
  echo "== decode-only, 1 client, fast channel, $mode"
  $bin/pagealloc-bench "${common[@]}" "${decode[@]}" --async_completion=$async \
    --json="$OUT/decode_$mode.json"
  echo "== exit $?"
done
echo "== decode-only, 1 client, gRPC, sync"
$bin/pagealloc-bench "${common[@]}" "${decode[@]}" --fast_channel=false \
  --json="$OUT/decode_grpc.json"
echo "== exit $?"
for mode in sync async; do
  async=false; [ $mode = async ] && async=true
  echo "== mixed sweep, fast channel, $mode"
  $bin/pagealloc-bench "${common[@]}" --async_completion=$async \
    --sweep_clients=1,2,4,8,16 --duration_s=${SWEEP_S:-5} --floor_s=1 \
    --json="$OUT/sweep_$mode.json"
  echo "== exit $?"
done
echo "== mixed sweep, gRPC, sync"
$bin/pagealloc-bench "${common[@]}" --fast_channel=false \
  --sweep_clients=1,2,4,8,16 --duration_s=${SWEEP_S:-5} --floor_s=1 \
  --json="$OUT/sweep_grpc.json"
echo "== exit $?"
