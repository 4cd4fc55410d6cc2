#!/usr/bin/env bash
# Runs pagealloc-bench briefly on the CPU backend and checks its JSON: every
# field present, counts and rates non-zero, percentiles ordered; the gRPC
# echo floor, its server in a child process (with two clients at once in the
# sweep, none with one client, absent with --echo_floor=false); the CPU
# lines and fields (the workers', the daemon's, the echo server's and the
# host's); the completion modes of a sweep (sync,
# and gpu: slots read on the "GPU", which on the CPU backend is the host,
# one lane behind); page size 1 with prefill chunks only. No timing
# thresholds: a benchmark reports, it never fails on time. Then, where
# gnuplot is installed, checks that bench/plot.sh turns the JSON into PNGs.
set -euo pipefail
runfiles=${TEST_SRCDIR:?}/${TEST_WORKSPACE:-pagealloc}
bench=$runfiles/bench/pagealloc-bench
out=${TEST_TMPDIR:?}/bench
mkdir -p "$out"

# Separate Free and Checkpoint calls here, so that every RPC row has data;
# each client count in two completion modes.
"$bench" --backend=cpu --server_binary="$runfiles/server/pagealloc-server" \
  --sweep_clients=1,2 --sweep_completion=sync,gpu --batch=32 \
  --duration_s=1 --floor_s=0.3 \
  --num_pages=65536 --max_seq_len=256 --prefill_chunk=64 \
  --piggyback_ops=false --json="$out/results.json" >"$out/stdout.txt"
cat "$out/stdout.txt"
grep -q "== sweep" "$out/stdout.txt"
grep -q "gRPC echo (server in a child process, no daemon work" "$out/stdout.txt"
grep -q "AllocDecode(32) inline" "$out/stdout.txt"
grep -q "AllocDecode(32) handed off" "$out/stdout.txt"
grep -q "2 echo clients: .* AllocDecode calls/s together" "$out/stdout.txt"
grep -q "echo server CPU per call: Health/Check .* us, inline .* us, handed off .* us, 2 clients .* us; host .* of .* CPUs busy at 2 clients" "$out/stdout.txt"
[ "$(grep -c "^host CPU .* of .* busy; clients .* CPUs (.* us per call); daemon .* CPUs (.* us per allocation call)$" "$out/stdout.txt")" = 4 ]
# The default: frees and checkpoints ride on the allocation calls. With the
# idle-daemon measurement, and the in-process floor's steps taken in turn by
# three threads.
"$bench" --backend=cpu --server_binary="$runfiles/server/pagealloc-server" \
  --clients=1 --batch=32 --duration_s=1 --floor_s=0.3 \
  --idle_s=0.5 --idle_sessions=2 --floor_threads=3 \
  --num_pages=65536 --max_seq_len=256 --prefill_chunk=64 \
  --json="$out/piggyback.json" >"$out/piggyback.txt"
grep -q "in-process decode(32) cpu, 3 threads in turn" "$out/piggyback.txt"
cat "$out/piggyback.txt"
# SGLang's default page size, prefill chunks only, slots read in order on
# the client's side with three lanes; no echo floor.
"$bench" --backend=cpu --server_binary="$runfiles/server/pagealloc-server" \
  --clients=1 --page_size=1 --num_pages=262144 --batch=4 --echo_floor=false \
  --prefill_chunk=512 --prefill_requests=4 --max_seq_len=8192 \
  --decode_weight=0 --prefill_weight=100 --spec_weight=0 --gpu_ordered \
  --lanes=3 --duration_s=1 --floor_s=0.3 \
  --json="$out/prefill.json" >"$out/prefill.txt"
cat "$out/prefill.txt"

/usr/bin/python3 - "$out/results.json" "$out/piggyback.json" \
  "$out/prefill.json" <<'PY'
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
def cpu(where, obj, *keys):
    for k in keys:
        v = obj.get(k)
        if not isinstance(v, (int, float)) or v < 0:
            errors.append(f"{where}.{k} = {v!r}, want >= 0")
def host(where, obj):
    positive(where, obj, "host_cpus")
    busy = obj.get("host_cpus_busy")
    if not isinstance(busy, (int, float)) or not 0 <= busy <= obj["host_cpus"]:
        errors.append(f"{where}.host_cpus_busy = {busy!r}, want in "
                      f"[0, {obj['host_cpus']}]")
if r["config"]["backend"] != "cpu":
    errors.append("config.backend")
latency("floors.health_check", r["floors"]["health_check"])
latency("floors.in_process_decode", r["floors"]["in_process_decode"])
latency("floors.in_process_enqueue", r["floors"]["in_process_enqueue"])
if r["floors"]["in_process_decode"]["executor"] != "cpu":
    errors.append("floors.in_process_decode.executor")
# The gRPC echo floor: one client inline and handed off, then as many
# clients as the largest phase (2) at once.
echo = r["floors"]["grpc_echo"]
if not echo["measured"] or echo["handoff_spin_us"] < 0:
    errors.append(f"floors.grpc_echo: measured {echo['measured']}, "
                  f"spin {echo['handoff_spin_us']}")
for k in ("health_check", "alloc_decode_inline", "alloc_decode_handed_off",
          "clients_handed_off"):
    latency(f"floors.grpc_echo.{k}", echo[k])
    # CPU time comes in clock ticks: a short window may read 0 s.
    cpu(f"floors.grpc_echo.{k}", echo[k], "server_cpu_s",
        "server_cpu_us_per_call")
    host(f"floors.grpc_echo.{k}", echo[k])
positive("floors.grpc_echo.ratios", echo["ratios"], *echo["ratios"].keys())
if echo["clients_handed_off"]["clients"] != 2:
    errors.append(f"floors.grpc_echo.clients_handed_off.clients = "
                  f"{echo['clients_handed_off']['clients']}, want 2")
positive("floors.grpc_echo.clients_handed_off", echo["clients_handed_off"],
         "seconds", "calls_per_s")
# One phase per client count and mode, the modes inner.
got = [(p["clients"], p["mode"], p["async_completion"], p["gpu_ordered"],
        p["lanes"]) for p in r["phases"]]
want = [(1, "sync", False, False, 1), (1, "gpu", True, True, 2),
        (2, "sync", False, False, 1), (2, "gpu", True, True, 2)]
if got != want:
    errors.append(f"phases: {got}, want {want}")
for i, p in enumerate(r["phases"]):
    w = f"phases[{i}]"
    positive(w, p, "seconds", "calls", "calls_per_s", "alloc_calls",
             "alloc_calls_per_s", "alloc_slots_per_s", "launches",
             "launches_per_s", "calls_per_launch", "requests_per_launch",
             "server_cpu_s", "server_cpu_us_per_rpc",
             "server_cpu_us_per_alloc_call", "server_cpus")
    cpu(w, p, "clients_cpu_s", "clients_cpu_us_per_call", "clients_cpus")
    host(w, p)
    positive(w + ".server_metrics", p["server_metrics"],
             "alloc_decode_rpc_mean_us", "execute_mean_us",
             "batch_requests_mean")
    if p["server_metrics"]["queue_wait_mean_us"] < 0:
        errors.append(w + ".server_metrics.queue_wait_mean_us unknown")
    positive(w + ".ratios", p["ratios"], *p["ratios"].keys())
    if "decode_p50_vs_echo_handed_off_p50" not in p["ratios"]:
        errors.append(w + ".ratios: no echo floor ratios")
    # Every launch carries at least one call, and a call never spans two.
    if p["calls_per_launch"] < 1 - 1e-9 and p["launches"] > 0:
        errors.append(f"{w}: calls_per_launch {p['calls_per_launch']} < 1")
    for rpc in ("AllocDecode", "AllocExtend", "Free", "Checkpoint",
                "Rollback", "AllocExtend_admit"):
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
# One client: the echo floor has no several-client measurement.
pe = p["floors"]["grpc_echo"]
if not pe["measured"] or pe["clients_handed_off"]["clients"] != 0:
    errors.append(f"piggyback: floors.grpc_echo.clients_handed_off "
                  f"{pe['clients_handed_off']}")
latency("piggyback.floors.grpc_echo.alloc_decode_handed_off",
        pe["alloc_decode_handed_off"])
# Prefill chunks only at page size 1: every allocation is an extend, and
# the chunks are bigger than an admission's prompt on average.
f = json.load(open(sys.argv[3]))
if f["config"]["page_size"] != 1 or not f["config"]["gpu_ordered"]:
    errors.append(f"prefill: config {f['config']}")
fp = f["phases"][0]
if f["floors"]["grpc_echo"] != {"measured": False}:
    errors.append(f"prefill: floors.grpc_echo {f['floors']['grpc_echo']}")
if any("echo" in k for k in fp["ratios"]):
    errors.append("prefill: echo ratios without the echo floor")
if (fp["mode"], fp["lanes"]) != ("sync_gpu", 3):
    errors.append(f"prefill: mode {fp['mode']}, lanes {fp['lanes']}")
latency("prefill.rpcs.AllocExtend", fp["rpcs"]["AllocExtend"])
positive("prefill.rpcs.AllocExtend", fp["rpcs"]["AllocExtend"], "slots")
for rpc in ("AllocDecode", "Checkpoint", "Rollback", "Free"):
    if fp["rpcs"][rpc]["count"] != 0:
        errors.append(f"prefill: {rpc} calls were sent")
if errors:
    print("\n".join(errors))
    sys.exit(1)
print("JSON OK")
PY

if command -v gnuplot >/dev/null; then
  "$runfiles/bench/plot.sh" "$out/results.json" "$out/plots"
  "$runfiles/bench/plot.sh" "$out/prefill.json" "$out/plots_prefill" AllocExtend
  for f in plots/latency plots/throughput plots_prefill/latency; do
    head -c 8 "$out/$f.png" | od -An -c | grep -q "P   N   G" ||
      { echo "$f.png is not a PNG"; exit 1; }
  done
  echo "plots OK"
else
  echo "gnuplot not installed: plot.sh not checked"
fi
