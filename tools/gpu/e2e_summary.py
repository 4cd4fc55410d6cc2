"""Prints run_e2e.sh's results as Markdown tables (docs/performance.md's).

Usage: python3 e2e_summary.py OUT_DIR
Reads the pagealloc-bench JSON files that run_e2e.sh wrote in OUT_DIR
(decode_*.json, sweep_*.json, variant*_round*.json and variants.txt); a
missing file leaves its rows out.
"""
import json
import os
import re
import sys


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def us(value):
    return f"{value:.1f}"


def decode_table(out):
    rows = [("fast channel, sync", "decode_sync.json"),
            ("fast channel, async", "decode_async.json"),
            ("gRPC, sync", "decode_grpc.json")]
    print("AllocDecode(256), one client, decode steps only (us):\n")
    print("| path, completion | p50 | p90 | p99 | p99.9 | empty gRPC p50 "
          "| in-process p50 | p50 / empty | daemon CPU per call |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, file in rows:
        r = load(os.path.join(out, file))
        if r is None or not r["phases"]:
            print(f"| {name} | (no results) | | | | | | | |")
            continue
        d = r["phases"][0]["rpcs"]["AllocDecode"]
        health = r["floors"]["health_check"]["p50_us"]
        in_process = r["floors"]["in_process_decode"]["p50_us"]
        cpu = r["phases"][0]["server_cpu_us_per_alloc_call"]
        print(f"| {name} | {us(d['p50_us'])} | {us(d['p90_us'])} "
              f"| {us(d['p99_us'])} | {us(d['p999_us'])} | {us(health)} "
              f"| {us(in_process)} | {d['p50_us'] / health:.2f}x "
              f"| {us(cpu)} |")
    print()


def phase_row(label, p):
    d = p["rpcs"]["AllocDecode"]
    return (f"| {label} | {p['alloc_calls_per_s']:,.0f} "
            f"| {p['calls_per_launch']:.2f} "
            f"| {us(d['p50_us'])} / {us(d['p99_us'])} "
            f"| {us(p['server_cpu_us_per_alloc_call'])} |")


def sweep_tables(out):
    for mode, title in (("sync", "fast channel, sync"),
                        ("async", "fast channel, async"),
                        ("grpc", "gRPC, sync")):
        r = load(os.path.join(out, f"sweep_{mode}.json"))
        if r is None:
            continue
        print(f"Default mix, {title}:\n")
        print("| clients | alloc calls/s | calls/launch "
              "| AllocDecode p50 / p99 us | daemon CPU per call us |")
        print("| --- | --- | --- | --- | --- |")
        for p in r["phases"]:
            print(phase_row(str(p["clients"]), p))
        print()


def variant_table(out):
    names = {}
    try:
        with open(os.path.join(out, "variants.txt")) as f:
            for line in f:
                index, _, flags = line.rstrip("\n").partition(" ")
                names[int(index)] = flags
    except OSError:
        return
    runs = []
    for file in os.listdir(out):
        m = re.fullmatch(r"variant(\d+)_round(\d+)\.json", file)
        r = m and load(os.path.join(out, file))
        if r and r["phases"]:
            runs.append((int(m.group(2)), int(m.group(1)), r["phases"][0]))
    print("8 clients, default mix, fast channel, sync, by daemon/bench "
          "flags:\n")
    print("| round: flags | alloc calls/s | calls/launch "
          "| AllocDecode p50 / p99 us | daemon CPU per call us |")
    print("| --- | --- | --- | --- | --- |")
    for round_, index, p in sorted(runs):
        print(phase_row(f"{round_}: {names.get(index, index)}", p))
    print()


def main():
    out = sys.argv[1]
    decode_table(out)
    sweep_tables(out)
    variant_table(out)


if __name__ == "__main__":
    main()
