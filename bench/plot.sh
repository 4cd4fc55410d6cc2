#!/usr/bin/env bash
# Plots a pagealloc-bench JSON (a --sweep_clients run) with gnuplot:
#   OUT_DIR/latency.png     AllocDecode latency by percentile, one line per
#                           client count, with the two floors
#   OUT_DIR/throughput.png  allocation calls/s and calls per launch vs clients
# Usage: bench/plot.sh BENCH.json OUT_DIR
set -euo pipefail
json=${1:?usage: plot.sh BENCH.json OUT_DIR}
out=${2:?usage: plot.sh BENCH.json OUT_DIR}
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not installed (Debian: gnuplot-nox)" >&2; exit 2; }
mkdir -p "$out"
data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT

# JSON to gnuplot data: one block per phase (x = 1/(1-q), so the tail
# spreads out on a log axis), the floors, and one row per phase.
python3 - "$json" "$data" <<'PY'
import json, sys
results = json.load(open(sys.argv[1]))
d = sys.argv[2]
with open(f"{d}/latency.dat", "w") as f:
    for p in results["phases"]:
        f.write(f'"{p["clients"]} client(s)"\n')
        for q, us in p["rpcs"]["AllocDecode"]["percentiles_us"]:
            f.write(f"{1 / (1 - q)} {us}\n")
        f.write("\n\n")
for name in ("health_check", "in_process_decode"):
    with open(f"{d}/{name}.dat", "w") as f:
        for q, us in results["floors"][name]["percentiles_us"]:
            f.write(f"{1 / (1 - q)} {us}\n")
with open(f"{d}/throughput.dat", "w") as f:
    for p in results["phases"]:
        f.write(f'{p["clients"]} {p["alloc_calls_per_s"]} {p["calls_per_launch"]}\n')
with open(f"{d}/title.txt", "w") as f:
    c = results["config"]
    mode = "async" if c["async_completion"] else "sync"
    f.write(f'{c["backend"]} backend, batch {c["batch"]}, {mode} completion')
PY

title=$(cat "$data/title.txt")
nphases=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["phases"]))' "$json")
gnuplot <<GP
set terminal pngcairo size 900,600 noenhanced
set output "$out/latency.png"
set title "AllocDecode latency by percentile ($title)"
set logscale xy
set xlabel "percentile"
set ylabel "latency (us)"
set xtics ("50" 2, "90" 10, "99" 100, "99.9" 1000, "99.99" 10000)
set key top left
set grid
plot for [i=0:$nphases-1] "$data/latency.dat" index i using 1:2 with linespoints title columnheader(1), \
     "$data/health_check.dat" using 1:2 with lines dashtype 2 lw 2 title "Health/Check floor", \
     "$data/in_process_decode.dat" using 1:2 with lines dashtype 3 lw 2 title "in-process floor"

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
plot "$data/throughput.dat" using 1:2 with linespoints lw 2 title "allocation calls/s", \
     "$data/throughput.dat" using 1:3 axes x1y2 with linespoints lw 2 title "calls per launch"
GP
echo "wrote $out/latency.png $out/throughput.png"
