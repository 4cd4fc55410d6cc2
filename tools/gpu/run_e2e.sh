#!/usr/bin/env bash
# The end-to-end benchmark (bench/pagealloc-bench) on a GPU host with the
# CUDA backend, from a package made by package.sh. Pool of 1,048,576 pages of
# 16, 256 sequences per client; each run measures its own floors (the empty
# unary gRPC call, the in-process decode).
#   1-2. AllocDecode(256) from one client, decode steps only, through the
#        fast channel (the client library's default): sync, async
#   3.   the same through gRPC (--fast_channel=false), sync
#   4-5. the default scheduler mix, 1..16 clients, fast channel: sync, async
#   6.   the default mix, 1..16 clients, through gRPC, sync
#   7.   with --variant FLAGS (repeatable; FLAGS are pagealloc-bench flags,
#        e.g. "--server_flags=--batch_window_us=120" or
#        "--piggyback_ops=false"): 8 clients in the default mix, fast channel,
#        sync, the daemon's defaults first and then each variant, all of them
#        VARIANT_ROUNDS times (default 2) in turn: the host's speed drifts
#        between runs, so compare rows of one round
# DECODE_S, SWEEP_S and VARIANT_S set the phases' whole seconds (6, 5, 5);
# BENCH_FLAGS adds pagealloc-bench flags to every run. Plots (bench/plot.sh)
# where gnuplot is installed.
# Usage: run_e2e.sh [--variant FLAGS]... [OUT_DIR]   (default ./gpu-results)
# Writes OUT_DIR/e2e/; exits 1 if a step failed, 2 if it cannot run here.

set -u
STEP_KIND=e2e
source "$(dirname "$0")/gpu_common.sh"
gpu_setup "$@"
need_binaries bench/pagealloc-bench server/pagealloc-server

bench=$BIN/bench/pagealloc-bench
# Word-split on purpose: BENCH_FLAGS is a list of flags.
# shellcheck disable=SC2206
common=(--backend=cuda --server_binary="$BIN/server/pagealloc-server"
  --batch=256 --progress=false ${BENCH_FLAGS:-})
decode=(--clients=1 --decode_weight=100 --prefill_weight=0 --spec_weight=0
  --duration_s="${DECODE_S:-6}" --floor_s=2)
# shellcheck disable=SC2054  # the commas are the flag's
sweep=(--sweep_clients=1,2,4,8,16 --duration_s="${SWEEP_S:-5}" --floor_s=1)
log=$OUT/e2e.log
# Time limits: the phases, the floors and the daemon's start, with room.
decode_limit=$((${DECODE_S:-6} + 60))
sweep_limit=$((5 * ${SWEEP_S:-5} + 90))
variant_limit=$((${VARIANT_S:-5} + 60))

for mode in sync async; do
  async=false
  [[ $mode == async ]] && async=true
  run_step "decode-only, 1 client, fast channel, $mode" "$decode_limit" "$log" \
    "$bench" "${common[@]}" "${decode[@]}" --async_completion=$async \
    --json="$OUT/decode_$mode.json"
done
run_step "decode-only, 1 client, gRPC, sync" "$decode_limit" "$log" \
  "$bench" "${common[@]}" "${decode[@]}" --fast_channel=false \
  --json="$OUT/decode_grpc.json"
for mode in sync async; do
  async=false
  [[ $mode == async ]] && async=true
  run_step "mixed sweep, fast channel, $mode" "$sweep_limit" "$log" \
    "$bench" "${common[@]}" "${sweep[@]}" --async_completion=$async \
    --json="$OUT/sweep_$mode.json"
done
run_step "mixed sweep, gRPC, sync" "$sweep_limit" "$log" \
  "$bench" "${common[@]}" "${sweep[@]}" --fast_channel=false \
  --json="$OUT/sweep_grpc.json"

if ((${#VARIANTS[@]})); then
  variants=("" "${VARIANTS[@]}")
  for round in $(seq "${VARIANT_ROUNDS:-2}"); do
    for i in "${!variants[@]}"; do
      # Word-split on purpose: a variant is a list of flags.
      # shellcheck disable=SC2206
      flags=(${variants[i]})
      run_step "8 clients, variant $i (${variants[i]:-defaults}), round $round" \
        "$variant_limit" "$log" "$bench" "${common[@]}" --clients=8 \
        --duration_s="${VARIANT_S:-5}" --floor_s=1 "${flags[@]}" \
        --json="$OUT/variant${i}_round${round}.json"
    done
  done
  for i in "${!variants[@]}"; do
    echo "$i ${variants[i]:-(defaults)}"
  done >"$OUT/variants.txt"
fi

if command -v gnuplot >/dev/null; then
  for mode in sync async grpc; do
    [[ -s $OUT/sweep_$mode.json ]] &&
      bash "$PKG/plot.sh" "$OUT/sweep_$mode.json" "$OUT/plots_$mode" >>"$log" 2>&1
  done
  note_step "plots" "ok" "plots_{sync,async,grpc}/{latency,throughput}.png"
else
  note_step "plots" "skipped" "gnuplot not installed"
fi

python3 "$PKG/e2e_summary.py" "$OUT" | tee "$OUT/tables.md"
print_summary
