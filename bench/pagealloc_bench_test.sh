#!/usr/bin/env bash
# Runs pagealloc-bench briefly on the CPU backend and checks its JSON: every
# field present, counts and rates non-zero, percentiles ordered. No timing
# thresholds: a benchmark reports, it never fails on time. Then, where
# gnuplot is installed, checks that bench/plot.sh turns the JSON into PNGs.
set -euo pipefail
runfiles=${TEST_SRCDIR:?}/${TEST_WORKSPACE:-pagealloc}
bench=$runfiles/bench/pagealloc-bench
out=${TEST_TMPDIR:?}/bench
mkdir -p "$out"

# Separate Free and Checkpoint calls here, so that every RPC row has data.
"$bench" --backend=cpu --server_binary="$runfiles/server/pagealloc-server" \
  --sweep_clients=1,2 --batch=32 --duration_s=1 --floor_s=0.3 \
  --num_pages=65536 --max_seq_len=256 --prefill_chunk=64 \
  --piggyback_ops=false --json="$out/results.json" >"$out/stdout.txt"
cat "$out/stdout.txt"
grep -q "== sweep" "$out/stdout.txt"
# The default: frees and checkpoints ride on the allocation calls. With the
# idle-daemon measurement.
"$bench" --backend=cpu --server_binary="$runfiles/server/pagealloc-server" \
  --clients=1 --batch=32 --duration_s=1 --floor_s=0.3 \
  --idle_s=0.5 --idle_sessions=2 \
  --num_pages=65536 --max_seq_len=256 --prefill_chunk=64 \
  --json="$out/piggyback.json" >"$out/piggyback.txt"
cat "$out/piggyback.txt"

/usr/bin/python3 - "$out/results.json" "$out/piggyback.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
errors = []
def positive(where, obj, *keys):
    for k in keys:
        v = obj.get(k)
        if not isinstance(v, (int, float)) or v <= 0:
            errors.append(f"{where}.{k} = {v!r}, want > 0")
def latency(where, obj):
    positive(where, obj, "count", "mean_us", "p50_us", "p90_us", "p99_us",
             "p999_us", "max_us")
    if not obj["p50_us"] <= obj["p90_us"] <= obj["p99_us"] <= obj["p999_us"] <= obj["max_us"]:
        errors.append(f"{where}: percentiles out of order")
    if len(obj["percentiles_us"]) < 5:
        errors.append(f"{where}: percentile curve too short")
if r["config"]["backend"] != "cpu":
    errors.append("config.backend")
latency("floors.health_check", r["floors"]["health_check"])
latency("floors.in_process_decode", r["floors"]["in_process_decode"])
if r["floors"]["in_process_decode"]["executor"] != "cpu":
    errors.append("floors.in_process_decode.executor")
if [p["clients"] for p in r["phases"]] != [1, 2]:
    errors.append(f"phases: {[p['clients'] for p in r['phases']]}, want [1, 2]")
for i, p in enumerate(r["phases"]):
    w = f"phases[{i}]"
    positive(w, p, "seconds", "calls", "calls_per_s", "alloc_calls",
             "alloc_calls_per_s", "alloc_slots_per_s", "launches",
             "launches_per_s", "calls_per_launch", "requests_per_launch",
             "server_cpu_s", "server_cpu_us_per_rpc",
             "server_cpu_us_per_alloc_call")
    positive(w + ".server_metrics", p["server_metrics"],
             "alloc_decode_rpc_mean_us", "execute_mean_us",
             "batch_requests_mean")
    if p["server_metrics"]["queue_wait_mean_us"] < 0:
        errors.append(w + ".server_metrics.queue_wait_mean_us unknown")
    positive(w + ".ratios", p["ratios"], *p["ratios"].keys())
    # Every launch carries at least one call, and a call never spans two.
    if p["calls_per_launch"] < 1 - 1e-9 and p["launches"] > 0:
        errors.append(f"{w}: calls_per_launch {p['calls_per_launch']} < 1")
    for rpc in ("AllocDecode", "AllocExtend", "Free", "Checkpoint", "Rollback"):
        latency(f"{w}.rpcs.{rpc}", p["rpcs"][rpc])
    positive(w + ".rpcs.AllocDecode", p["rpcs"]["AllocDecode"], "slots", "slots_per_s")
if r["config"]["piggyback_ops"]:
    errors.append("config.piggyback_ops: want false in the sweep")
# With piggybacking (the default) the pages of finished sequences and the
# checkpoints travel with allocation calls: no separate Free or Checkpoint,
# while sequences still finish (admissions) and spec steps still roll back.
p = json.load(open(sys.argv[2]))
if not p["config"]["piggyback_ops"]:
    errors.append("piggyback: config.piggyback_ops: want true by default")
for rpc in ("Free", "Checkpoint"):
    if p["phases"][0]["rpcs"][rpc]["count"] != 0:
        errors.append(f"piggyback: {rpc} calls were sent")
for rpc in ("AllocDecode", "AllocExtend", "Rollback"):
    latency(f"piggyback.rpcs.{rpc}", p["phases"][0]["rpcs"][rpc])
idle = p["floors"]["idle_daemon"]
if idle["sessions"] != 2 or idle["seconds"] < 0.5 or idle["cpu_s"] < 0:
    errors.append(f"piggyback: floors.idle_daemon {idle}")
if r["floors"]["idle_daemon"]["seconds"] != 0:
    errors.append("floors.idle_daemon measured without --idle_s")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print("JSON OK")
PY

if command -v gnuplot >/dev/null; then
  "$runfiles/bench/plot.sh" "$out/results.json" "$out/plots"
  for f in latency throughput; do
    head -c 8 "$out/plots/$f.png" | od -An -c | grep -q "P   N   G" ||
      { echo "$f.png is not a PNG"; exit 1; }
  done
  echo "plots OK"
else
  echo "gnuplot not installed: plot.sh not checked"
fi
