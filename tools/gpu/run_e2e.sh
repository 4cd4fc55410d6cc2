#!/usr/bin/env bash
# The end-to-end benchmark (bench/pagealloc-bench) on a GPU host with the
# CUDA backend, from a package made by package.sh: every table of
# docs/performance.md's "The daemon end to end" in one invocation. Each
# pagealloc-bench run measures its own floors (the empty unary gRPC call,
# the same decode batches in-process: complete, and until Allocate returns)
# and compares completion modes phase by phase in the same daemon:
#   sync  the call waits for the launch; the client copies the slots to the
#         host
#   async the call returns once the launch is queued; the client copies the
#         slots to the host after the daemon's completion (the host waits)
#   gpu   GPU-ordered: the call returns once the launch is queued; the
#         client orders its own stream after it (Client::OrderAfter) and a
#         kernel there reads the slots; timed until OrderAfter returns; two
#         lanes of sequences per client (bench/README.md)
# Steps, fast channel unless named:
#   1. decode256      AllocDecode(256), page size 16, one client, decode
#                     steps only: sync, async, gpu
#   2. anchor         with --anchor DIR (or the package's anchor/) holding
#                     the seed's sglang_unsynced_call.py and
#                     seed_triton_kernels.py (python3 with torch and triton):
#                     SGLang's in-process alloc_decode without a device sync,
#                     page sizes 1, 16, 64, 256 and 1024 requests
#   3. mix            the default scheduler mix, page size 16, 256 sequences
#                     per client, 1, 2, 4, 8, 16 clients: sync, gpu
#   4. sglang_decode_ps{1,16}_b{256,1024}  decode steps only, 1..16 clients,
#                     sync, gpu
#   5. sglang_prefill_ps{1,16}  prefill chunks only (8 sequences extended
#                     by up to 2048 tokens per call), 1..16 clients, sync, gpu
#   6. decode256_grpc, mix_grpc  steps 1 and 3 through gRPC (sync, gpu; sync)
#   7. with --variant FLAGS (repeatable; pagealloc-bench flags, e.g.
#      "--server_flags=--batch_window_us=120"): 8 clients in the default
#      mix, sync, the defaults first and then each variant, VARIANT_ROUNDS
#      times (default 2) in turn
# DECODE_S (4), SWEEP_S (2) and VARIANT_S (5) set the phases' seconds,
# FLOOR_S (1) each floor's; BENCH_FLAGS adds pagealloc-bench flags to every
# run. At the defaults it takes about 5 minutes on the H200 host (each
# SWEEP_S second adds about 75 s). E2E_BUDGET_S (450) bounds it: a step
# that would start later is skipped, and a step's time limit never runs
# past the budget by more than a minute. Plots (bench/plot.sh) where
# gnuplot is installed.
# Usage: run_e2e.sh [--anchor DIR] [--variant FLAGS]... [OUT_DIR]
#   (default ./gpu-results). Writes OUT_DIR/e2e/: one JSON per step,
#   e2e.log, tables.md (e2e_summary.py) and summary.md (the steps, then the
#   tables); exits 1 if a step failed, 2 if it cannot run here.

set -u
STEP_KIND=e2e
source "$(dirname "$0")/gpu_common.sh"
gpu_setup "$@"
[[ -z $ANCHOR && -d $PKG/anchor ]] && ANCHOR=$PKG/anchor
need_binaries bench/pagealloc-bench server/pagealloc-server

bench=$BIN/bench/pagealloc-bench
log=$OUT/e2e.log
decode_s=${DECODE_S:-4}
sweep_s=${SWEEP_S:-2}
floor_s=${FLOOR_S:-1}
budget_s=${E2E_BUDGET_S:-450}
started=$SECONDS
# Word-split on purpose: BENCH_FLAGS is a list of flags.
# shellcheck disable=SC2206
common=(--backend=cuda --server_binary="$BIN/server/pagealloc-server"
  --progress=false --floor_s="$floor_s" ${BENCH_FLAGS:-})
decode_only=(--decode_weight=100 --prefill_weight=0 --spec_weight=0)
# shellcheck disable=SC2054  # the commas are the flags'
sweep=(--sweep_clients=1,2,4,8,16 --duration_s="$sweep_s")

# Pages enough that no sequence is ever refused: 16 clients, 2 lanes each,
# every sequence at its longest. Usage: pages PAGE_SIZE BATCH MAX_SEQ_LEN
pages() {
  local n=$((16 * 2 * $2 * $3 / $1))
  ((n < 65536)) && n=65536
  echo "$n"
}

# Runs pagealloc-bench as step NAME with PHASES phases of SECS seconds,
# writing NAME.json, unless the budget is spent.
# Usage: bench_step NAME PHASES SECS FLAGS...
bench_step() {
  local name=$1 phases=$2 secs=$3
  shift 3
  local elapsed=$((SECONDS - started))
  if ((elapsed >= budget_s)); then
    note_step "$name" "skipped" "E2E_BUDGET_S=${budget_s}s spent"
    return 0
  fi
  # The phases with their workers' start, the floors and the daemon's
  # start, with room; never more than a minute past the budget. (Seconds
  # may be fractional: their whole part plus one.)
  local whole_secs=${secs%%.*} whole_floor=${floor_s%%.*}
  local limit=$((phases * (${whole_secs:-0} + 16) + 4 * (${whole_floor:-0} + 1) + 60))
  local left=$((budget_s + 60 - elapsed))
  ((limit > left)) && limit=$left
  run_step "$name" "$limit" "$log" "$bench" "${common[@]}" "$@" \
    --json="$OUT/$name.json"
}

bench_step decode256 3 "$decode_s" --page_size=16 --num_pages=1048576 \
  --batch=256 --clients=1 "${decode_only[@]}" --duration_s="$decode_s" \
  --sweep_completion=sync,async,gpu

if [[ -n $ANCHOR ]]; then
  if [[ -f $ANCHOR/sglang_unsynced_call.py && -f $ANCHOR/seed_triton_kernels.py ]]; then
    PYTHONUNBUFFERED=1 run_step "anchor: SGLang's alloc_decode, no sync" 180 \
      "$OUT/anchor.log" python3 "$ANCHOR/sglang_unsynced_call.py" \
      --json "$OUT/anchor_unsynced.json"
  else
    note_step "anchor" "FAILED" \
      "$ANCHOR lacks sglang_unsynced_call.py or seed_triton_kernels.py"
  fi
else
  note_step "anchor" "skipped" "no --anchor DIR given"
fi

bench_step mix 10 "$sweep_s" --page_size=16 \
  --num_pages="$(pages 16 256 2048)" --batch=256 "${sweep[@]}" \
  --sweep_completion=sync,gpu

for ps in 1 16; do
  for batch in 256 1024; do
    bench_step "sglang_decode_ps${ps}_b${batch}" 10 "$sweep_s" \
      --page_size=$ps --num_pages="$(pages $ps $batch 1024)" \
      --batch=$batch --max_seq_len=1024 "${decode_only[@]}" "${sweep[@]}" \
      --sweep_completion=sync,gpu
  done
done

for ps in 1 16; do
  bench_step "sglang_prefill_ps${ps}" 10 "$sweep_s" --page_size=$ps \
    --num_pages="$(pages $ps 8 32768)" --batch=8 --prefill_chunk=2048 \
    --prefill_requests=8 --max_seq_len=32768 --decode_weight=0 \
    --prefill_weight=100 --spec_weight=0 "${sweep[@]}" \
    --sweep_completion=sync,gpu
done

bench_step decode256_grpc 2 "$decode_s" --fast_channel=false --page_size=16 \
  --num_pages=1048576 --batch=256 --clients=1 "${decode_only[@]}" \
  --duration_s="$decode_s" --sweep_completion=sync,gpu
bench_step mix_grpc 5 "$sweep_s" --fast_channel=false --page_size=16 \
  --num_pages=1048576 --batch=256 "${sweep[@]}" --sweep_completion=sync

if ((${#VARIANTS[@]})); then
  variants=("" "${VARIANTS[@]}")
  for round in $(seq "${VARIANT_ROUNDS:-2}"); do
    for i in "${!variants[@]}"; do
      # Word-split on purpose: a variant is a list of flags.
      # shellcheck disable=SC2206
      flags=(${variants[i]})
      bench_step "variant${i}_round${round}" 1 "${VARIANT_S:-5}" \
        --page_size=16 --num_pages=1048576 --batch=256 --clients=8 \
        --duration_s="${VARIANT_S:-5}" "${flags[@]}"
    done
  done
  for i in "${!variants[@]}"; do
    echo "$i ${variants[i]:-(defaults)}"
  done >"$OUT/variants.txt"
fi

if command -v gnuplot >/dev/null; then
  plotted=0
  for json in "$OUT"/*.json; do
    name=$(basename "$json" .json)
    [[ $name == anchor* || $name == variant* ]] && continue
    rpc=AllocDecode
    [[ $name == *prefill* ]] && rpc=AllocExtend
    bash "$PKG/plot.sh" "$json" "$OUT/plots_$name" "$rpc" >>"$log" 2>&1 &&
      plotted=$((plotted + 1))
  done
  note_step "plots" "ok" "$plotted runs: plots_<step>/{latency,throughput}.png"
else
  note_step "plots" "skipped" "gnuplot not installed"
fi

python3 "$PKG/e2e_summary.py" "$OUT" | tee "$OUT/tables.md"
note_step "tables" "ok" "tables.md ($((SECONDS - started)) s in all)"
print_summary
status=$?
{
  echo
  cat "$OUT/tables.md"
} >>"$OUT/summary.md"
exit "$status"
