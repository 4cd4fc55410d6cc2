#!/usr/bin/python3
"""Host time of alloc(n) of whole pages three ways, in each of several
scheduler processes sharing one daemon:

  slice    SGLang's in-process free list: a slice off a NumPy array of
           free pages, and the pages concatenated back (no daemon)
  thin     the daemon's Alloc of n pages (a round trip) and its FreePages
  reserve  a PageReserve's take(n) and put(n) (client/page_reserve.h):
           no round trip while the reserve holds the pages

    reserve_alloc_bench.py --target unix:///run/pagealloc/gpu0.sock \\
        [--pages 256] [--iterations 5000] [--processes 1] [--json OUT]

Each step takes n pages and gives them back, so every step does the same
work. Prints, per process and method, p50 and p99 in microseconds; for the
reserve also the round trips per step (takes that refilled on the caller's
thread) and the pages moved per refill and per return. Nothing here waits
for a device: on a CUDA daemon the thin path's page ids are read from the
ring with a device-to-host copy, which the row includes.
"""

import argparse
import json
import multiprocessing
import time

import numpy as np

import pagealloc


def percentiles(samples_ns):
    samples = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    return float(np.percentile(samples, 50)), float(np.percentile(samples, 99))


def bench_slice(pool_pages, n, iterations):
    free_pages = np.arange(1, pool_pages + 1, dtype=np.int64)
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        taken = free_pages[:n]
        free_pages = free_pages[n:]
        free_pages = np.concatenate((free_pages, taken))
        samples.append(time.perf_counter_ns() - start)
    return {"method": "slice", "samples": samples}


def bench_thin(client, n, iterations):
    page_size = client.pool.page_size
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        allocation = client.alloc([n * page_size], all_or_nothing=True).check()
        slots = allocation.slots
        if not isinstance(slots, np.ndarray):
            slots = slots.copy_to_host()
        pages = slots[::page_size] // page_size
        client.free_pages(pages)
        client.release(allocation)
        samples.append(time.perf_counter_ns() - start)
    return {"method": "thin", "samples": samples}


def bench_reserve(client, n, iterations):
    samples = []
    with client.reserve(initial_batch=n, max_pages=8 * n) as reserve:
        for _ in range(iterations):
            start = time.perf_counter_ns()
            pages = reserve.take(n)
            reserve.put(pages)
            samples.append(time.perf_counter_ns() - start)
        stats = reserve.stats()
    return {
        "method": "reserve",
        "samples": samples,
        "round_trips_per_step": stats["sync_refills"] / max(1, stats["takes"]),
        "pages_per_refill": stats["pages_refilled"] / max(1, stats["refills"]),
        "pages_per_return": stats["pages_returned"] / max(1, stats["returns"]),
        "refills": stats["refills"],
        "returns": stats["returns"],
        "reclaims": stats["reclaims"],
    }


def run_process(index, args, results):
    rows = []
    with pagealloc.Client.connect(args.target, name="reserve-bench-%d" % index,
                                  map_kv_slab=False) as client:
        pool_pages = client.pool.num_pages
        for row in (bench_slice(pool_pages, args.pages, args.iterations),
                    bench_thin(client, args.pages, args.iterations),
                    bench_reserve(client, args.pages, args.iterations)):
            p50, p99 = percentiles(row.pop("samples"))
            row.update(process=index, processes=args.processes,
                       pages=args.pages, page_size=client.pool.page_size,
                       iterations=args.iterations, p50_us=round(p50, 2),
                       p99_us=round(p99, 2))
            rows.append(row)
    results.put(rows)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--pages", type=int, default=256,
                        help="pages per alloc(n) (n)")
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=1,
                        help="scheduler processes sharing the daemon")
    parser.add_argument("--json", help="write the rows here as JSON")
    args = parser.parse_args(argv)
    if args.pages < 1 or args.iterations < 1 or args.processes < 1:
        parser.error("--pages, --iterations and --processes must be >= 1")

    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    workers = [context.Process(target=run_process, args=(i, args, results))
               for i in range(args.processes)]
    for worker in workers:
        worker.start()
    rows = []
    for _ in workers:
        rows.extend(results.get(timeout=600))
    for worker in workers:
        worker.join()
        if worker.exitcode != 0:
            raise SystemExit("a benchmark process failed (exit code %d)" %
                             worker.exitcode)
    rows.sort(key=lambda row: (row["method"], row["process"]))
    for row in rows:
        extra = ""
        if row["method"] == "reserve":
            extra = ("  round trips/step %.4f  pages/refill %.1f  "
                     "pages/return %.1f" % (row["round_trips_per_step"],
                                            row["pages_per_refill"],
                                            row["pages_per_return"]))
        print("%-8s process %d/%d  n=%d page_size=%d  p50 %8.2f us  p99 "
              "%8.2f us%s" % (row["method"], row["process"], row["processes"],
                              row["pages"], row["page_size"], row["p50_us"],
                              row["p99_us"], extra))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return rows


if __name__ == "__main__":
    main()
