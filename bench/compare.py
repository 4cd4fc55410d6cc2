"""Puts the seed's Triton anchor numbers and kernel_benchmark's side by side.

Usage: python3 bench/compare.py ANCHOR.json OURS.json
Prints a Markdown table (seed median, ours flushed and rotated, ratios, the
target each case has) and the floor and bandwidth lines.
"""
import json
import sys


def main():
    anchor = json.load(open(sys.argv[1]))
    ours = json.load(open(sys.argv[2]))
    seed = {(r["case"], r.get("page_size"), r.get("bs")): r for r in anchor}
    floor = next(r for r in ours if r["case"] == "floor_empty_kernel")
    bw = next(r for r in ours if r["case"] == "bandwidth")
    seed_floor = next((r["us"] for r in anchor if r["case"] == "floor_tiny_launch"), float("nan"))
    print(f"floor: our empty kernel {floor['us']:.2f} us flushed / {floor['rotated_us']:.2f} us rotated; "
          f"anchor's tiny torch launch {seed_floor:.2f} us")
    fill = next((r for r in ours if r["case"] == "fill_8MiB"), None)
    if fill:
        print(f"fill: an 8 MiB memset (the bulk case's output) {fill['us']:.2f} us flushed / "
              f"{fill['rotated_us']:.2f} us rotated")
    print(f"bandwidth: memset write {bw['write_GBps']:.0f} GB/s, copy (read+write) {bw['copy_GBps']:.0f} GB/s")
    print()
    for r in ours:
        if r["case"].startswith("floor_params_"):
            print(f"floor: empty kernel with {r['case'][13:]} parameter bytes {r['us']:.2f} us flushed / "
                  f"{r['rotated_us']:.2f} us rotated")
    print()
    print("| case | ps | bs | tokens | path | seed us | ours us (flushed) | ratio | ours us (rotated) | ratio | "
          "uploaded us (flushed) | x floor | target | met |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    misses = 0
    for r in ours:
        if "page_size" not in r:
            continue
        key = (r["case"], r["page_size"], r["bs"])
        s = seed.get(key)
        seed_us = s["kernel_us"] if s else float("nan")
        ratio = r["kernel_us"] / seed_us
        ratio_rot = r["kernel_rotated_us"] / seed_us
        x_floor = r["kernel_us"] / floor["us"]
        big = r["case"] in ("extend_mixed_4096x4",) or (r["case"] == "decode" and r["bs"] == 4096)
        bulk = r["case"] == "extend_bulk_64x16384"
        limit = 0.25 if big else 0.6 if bulk else 0.8
        target = f"<= {limit}"
        met = ratio <= limit
        if r["bs"] <= 1024 and not bulk:
            target += ", <= 1.3x floor"
            met = met and x_floor <= 1.3
        if bulk:
            target += f" ({100 * r['write_fraction']:.0f}% of write BW)"
        misses += not met
        name = r["case"] + ("" if r["ok"] else " (WRONG OUTPUT)")
        print(f"| {name} | {r['page_size']} | {r['bs']} | {r['tokens']} | {r.get('path', 'upload')} | "
              f"{seed_us:.2f} | {r['kernel_us']:.2f} | "
              f"{ratio:.2f} | {r['kernel_rotated_us']:.2f} | {ratio_rot:.2f} | "
              f"{r.get('uploaded_us', r['kernel_us']):.2f} | {x_floor:.2f} | {target} | "
              f"{'yes' if met else 'NO'} |")
    print()
    print(f"{misses} case(s) miss a target (by the flushed times, the anchor's method)")


if __name__ == "__main__":
    main()
