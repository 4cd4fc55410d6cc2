#!/usr/bin/python3
"""Host time of pagealloc.sglang's alloc(need_size) and free, SGLang's main
path, on three paths: the session's page reserve with its device mirror
(the default: the slots of the reserve's next pages kept on the device,
alloc a slice of them), the reserve without the mirror (mirror_pages=0: a
host-to-device copy of the slots per call), and thin (every call to the
daemon), with and without GPU work queued before each call.

    sglang_alloc_bench.py --target unix:///run/pagealloc/ps1.sock \\
        --target unix:///run/pagealloc/ps16.sock \\
        [--need_size 256] [--iterations 5000] [--json OUT]

Each --target is a daemon run with --semantics=sglang; its page size picks
the allocator (the token allocator at page size 1, the paged one
otherwise). need_size 256 is 256 slots at page size 1 and 16 pages at page
size 16. Each step allocates need_size slots and frees them, so every step
does the same work; nothing waits for the device inside a timing.

"gpu_work": with PyTorch and a CUDA device, a bf16 matmul (--matmul) is
queued on the current stream before each call, an engine's normal state;
the device is synchronised every --sync_every steps, outside the timings,
so the queue stays bounded. The variant is skipped without CUDA.

Prints one Markdown table: per page size, path and GPU work on/off, the
p50 and p99 host microseconds of alloc and of free, for the reserve the
round trips per step (refills on the caller's thread), and for the mirror
the share of allocations it answered with a slice.
"""

import argparse
import json
import time

import numpy as np

import pagealloc
from pagealloc import sglang

try:
    import torch
except ImportError:  # pragma: no cover - depends on the host
    torch = None


def percentiles(samples_ns):
    us = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return (round(float(np.percentile(us, 50)), 2),
            round(float(np.percentile(us, 99)), 2))


def bench(allocator, need_size, iterations, warmup, gpu_work, sync_every):
    """(alloc samples, free samples) in ns over `iterations` steps."""
    alloc_ns, free_ns = [], []
    clock = time.perf_counter_ns
    for i in range(warmup + iterations):
        if gpu_work is not None:
            if i % sync_every == 0:
                torch.cuda.synchronize()
            gpu_work()
        start = clock()
        out = allocator.alloc(need_size)
        middle = clock()
        if out is None:
            raise SystemExit("alloc(%d) refused at step %d" % (need_size, i))
        allocator.free(out)
        end = clock()
        if i >= warmup:
            alloc_ns.append(middle - start)
            free_ns.append(end - middle)
    return alloc_ns, free_ns


def matmul_work(size):
    """A function queueing one bf16 matmul of `size` on the current
    stream, or None without CUDA."""
    if torch is None or not torch.cuda.is_available():
        return None
    a = torch.randn((size, size), device="cuda", dtype=torch.bfloat16)
    b = torch.randn((size, size), device="cuda", dtype=torch.bfloat16)
    out = torch.empty((size, size), device="cuda", dtype=torch.bfloat16)
    return lambda: torch.matmul(a, b, out=out)


# (name, use_reserve, mirror_pages): make_allocator's options of a path.
PATHS = (("mirror", True, None), ("reserve", True, 0), ("thin", False, 0))


def run(target, args, work):
    rows = []
    for path, use_reserve, mirror_pages in PATHS:
        for queued in ((False, True) if work is not None else (False,)):
            client = pagealloc.Client.connect(target, name="sglang-bench")
            allocator = sglang.make_allocator(client, use_reserve=use_reserve,
                                              mirror_pages=mirror_pages)
            alloc_ns, free_ns = bench(allocator, args.need_size,
                                      args.iterations, args.warmup,
                                      work if queued else None,
                                      args.sync_every)
            row = {"page_size": client.pool.page_size,
                   "need_size": args.need_size,
                   "path": path, "gpu_work": queued,
                   "backend": client.pool.backend}
            row["alloc_p50_us"], row["alloc_p99_us"] = percentiles(alloc_ns)
            row["free_p50_us"], row["free_p99_us"] = percentiles(free_ns)
            if use_reserve:
                stats = allocator.reserve.stats()
                steps = args.warmup + args.iterations
                row["round_trips_per_step"] = round(
                    stats["sync_refills"] / steps, 5)
            mirror = allocator.mirror_stats
            if mirror is not None and mirror["hits"] + mirror["misses"]:
                row["mirror_hit_rate"] = round(
                    mirror["hits"] / (mirror["hits"] + mirror["misses"]), 4)
            rows.append(row)
            allocator.close()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--target", action="append", required=True)
    parser.add_argument("--need_size", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--matmul", type=int, default=4096)
    parser.add_argument("--sync_every", type=int, default=16)
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    work = matmul_work(args.matmul)
    rows = []
    for target in args.target:
        rows += run(target, args, work)
    header = ("page_size", "path", "gpu_work", "alloc_p50_us",
              "alloc_p99_us", "free_p50_us", "free_p99_us",
              "round_trips_per_step", "mirror_hit_rate")
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(str(row.get(name, "-")) for name in header) +
              " |")
    if work is None:
        print("gpu_work: skipped (no CUDA device with PyTorch)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f)
    return rows


if __name__ == "__main__":
    main()
