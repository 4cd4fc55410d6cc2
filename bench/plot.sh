#!/usr/bin/env bash
# Plots a pagealloc-bench JSON (a --sweep_clients run, with one or more
# --sweep_completion modes) with gnuplot:
#   OUT_DIR/latency.png     the latency of RPC (default AllocDecode) by
#                           percentile, one line per phase (client count and
#                           mode), with the floors
#   OUT_DIR/throughput.png  allocation calls/s vs clients, one line per
#                           mode, and calls per launch
# Usage: bench/plot.sh BENCH.json OUT_DIR [RPC]
set -euo pipefail
json=${1:?usage: plot.sh BENCH.json OUT_DIR [RPC]}
out=${2:?usage: plot.sh BENCH.json OUT_DIR [RPC]}
rpc=${3:-AllocDecode}
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not installed (Debian: gnuplot-nox)" >&2; exit 2; }
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT

# JSON to gnuplot data: one block per phase (x = 1/(1-q), so the tail
# spreads out on a log axis), the floors, and per mode one row per phase.
python3 - "$json" "$data" "$rpc" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))
d, rpc = sys.argv[2], sys.argv[3]
c = results["config"]
def mode(p):  # JSON from before the completion modes has none per phase
    return p.get("mode", "async" if p.get("async_completion") else "sync")
modes = []
with open(f"{d}/latency.dat", "w") as f:
    for p in results["phases"]:
        if mode(p) not in modes:
            modes.append(mode(p))
        f.write(f'"{p["clients"]} client(s), {mode(p)}"\n')
        for q, us in p["rpcs"][rpc]["percentiles_us"]:
            f.write(f"{1 / (1 - q)} {us}\n")
        f.write("\n\n")
floors = [("health_check", "Health/Check floor"),
          ("in_process_decode", "in-process floor (complete)"),
          ("in_process_enqueue", "in-process floor (enqueued)")]
with open(f"{d}/floors.txt", "w") as names:
    for key, title in floors:
        if key not in results["floors"]:
            continue
        with open(f"{d}/{key}.dat", "w") as f:
            for q, us in results["floors"][key]["percentiles_us"]:
                f.write(f"{1 / (1 - q)} {us}\n")
        names.write(f"{key}\t{title}\n")
for m in modes:
    with open(f"{d}/throughput_{m}.dat", "w") as f:
        for p in results["phases"]:
            if mode(p) == m:
                f.write(f'{p["clients"]} {p["alloc_calls_per_s"]} {p["calls_per_launch"]}\n')
with open(f"{d}/modes.txt", "w") as f:
    f.write(" ".join(modes))
with open(f"{d}/title.txt", "w") as f:
    f.write(f'{c["backend"]} backend, page size {c["page_size"]}, batch {c["batch"]}, '
            f'{"/".join(modes)}')
PY

title=$(cat "$data/title.txt")
modes=$(cat "$data/modes.txt")
nphases=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["phases"]))' "$json")
floor_plots=
dash=2
while IFS=$'\t' read -r key name; do
  floor_plots+=", \"$data/$key.dat\" using 1:2 with lines dashtype $dash lw 2 title \"$name\""
  dash=$((dash + 1))
done <"$data/floors.txt"
gnuplot <<GP
set terminal pngcairo size 900,600 noenhanced
set output "$out/latency.png"
set title "$rpc latency by percentile ($title)"
set logscale xy
set xlabel "percentile"
set ylabel "latency (us)"
set xtics ("50" 2, "90" 10, "99" 100, "99.9" 1000, "99.99" 10000)
set key top left
set grid
plot for [i=0:$nphases-1] "$data/latency.dat" index i using 1:2 with linespoints title columnheader(1)$floor_plots

set output "$out/throughput.png"
unset logscale
set logscale x 2
set title "Throughput vs clients ($title)"
set xlabel "clients"
set ylabel "allocation calls/s"
set y2label "calls per launch"
set xtics auto
set ytics nomirror
set y2tics
set yrange [0:*]
set y2range [0:*]
set key top left
plot for [m in "$modes"] "$data/throughput_".m.".dat" using 1:2 with linespoints lw 2 title "allocation calls/s, ".m, \
     for [m in "$modes"] "$data/throughput_".m.".dat" using 1:3 axes x1y2 with lines dashtype 2 title "calls per launch, ".m
GP
echo "wrote $out/latency.png $out/throughput.png"
