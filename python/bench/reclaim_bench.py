#!/usr/bin/python3
"""How long a starving session waits for pages another session holds
unused in its reserve (docs/design.md, "Page reserves", Sharing).

    reclaim_bench.py --target unix:///run/pagealloc/gpu0.sock \\
        [--pages 16] [--iterations 200] [--json OUT]

Each iteration, on a pool no other client uses:

  1. session A opens a reserve as large as the pool and fills it with
     every free page: the pool is empty, A's pages unused (a scheduler
     between steps; its reserve's thread still runs);
  2. session B asks the daemon for `--pages` pages (Alloc, all or
     nothing), timed from its first call. The pool refuses it and asks A
     for its unused reserve (a word in A's channel and a futex wake); A's
     thread returns at least half of it; B calls again every 50 us, as
     pagealloc.sglang's alloc does at its next call, until it gets them;
  3. B frees them and A's reserve closes, every page back in the pool.

B calls the daemon directly rather than through a reserve of its own,
whose thread would refill (and so ask A) on its own schedule, before the
timed call. Prints p50, p99 and the largest of B's wait in microseconds
(the issue's bound: 1 ms), the calls B made, how many of A's reserves
answered an ask and the pages A returned per answer. The daemon's own
view of each ask, from the ask to A's return call, is its
pagealloc_reserve_reclaim_seconds histogram.
"""

import argparse
import json
import time

import numpy as np

import pagealloc


def fill_whole_pool(client, reserve, num_pages):
    """Takes every free page of the pool into `reserve` (which may hold all
    of them) and puts them back unused. Returns once the reserve holds all
    `num_pages`: the pool can be empty while the reserve's own refill is
    still on its way back (a refill of the whole pool is one large reply),
    and an ask the holder's thread reads only after that reply would time
    the refill, not the reclaim. Raises SystemExit when pages stay free
    (another client holds some, or the reserve cannot take them)."""
    for _ in range(100):
        stats = client.stats()
        free = stats.free_pages + stats.parked_pages
        if free == 0:
            deadline = time.monotonic() + 5
            while (reserve.stats()["pages"] < num_pages and
                   time.monotonic() < deadline):
                time.sleep(0.001)
            if reserve.stats()["pages"] == num_pages:
                return
            raise SystemExit("the holder's reserve holds %d of the pool's "
                             "%d pages" % (reserve.stats()["pages"],
                                           num_pages))
        try:
            pages = reserve.take(reserve.stats()["pages"] + free)
        except pagealloc.ResourceExhaustedError:
            continue  # the reserve's thread moved pages meanwhile
        reserve.put(pages)
    raise SystemExit("the holder's reserve could not take the whole pool: "
                     "%d pages still free" % free)


def one_starved_alloc(holder, starving, pages, num_pages):
    """Steps 1-3 above; returns (B's wait in ns, B's calls, A's stats)."""
    size = pages * starving.pool.page_size
    with holder.reserve(initial_batch=num_pages, max_pages=num_pages,
                        starved_wait=0) as a:
        fill_whole_pool(holder, a, num_pages)
        calls = 0
        start = time.perf_counter_ns()
        while True:
            calls += 1
            allocation = starving.alloc([size], all_or_nothing=True)
            try:
                allocation.check()
                break
            except pagealloc.ResourceExhaustedError:
                starving.release(allocation)
                time.sleep(50e-6)
        elapsed = time.perf_counter_ns() - start
        # A's thread counts its answer once its return call is back, which
        # may be after B's call found the pages.
        deadline = time.monotonic() + 0.5
        while a.stats()["reclaims"] == 0 and time.monotonic() < deadline:
            time.sleep(0.001)
        a_stats = a.stats()
    slots = allocation.slots
    if not isinstance(slots, np.ndarray):
        slots = slots.copy_to_host()
    starving.free_pages(slots[::starving.pool.page_size] //
                        starving.pool.page_size)
    starving.release(allocation)
    return elapsed, calls, a_stats


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--pages", type=int, default=16,
                        help="pages the starving session asks for")
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--json", help="write the row here as JSON")
    args = parser.parse_args(argv)
    if args.pages < 1 or args.iterations < 1:
        parser.error("--pages and --iterations must be >= 1")

    samples, calls, answered, returned = [], [], 0, []
    with pagealloc.Client.connect(args.target, name="reclaim-holder",
                                  map_kv_slab=False) as holder, \
            pagealloc.Client.connect(args.target, name="reclaim-starving",
                                     map_kv_slab=False) as starving:
        num_pages = holder.pool.num_pages
        if args.pages * 2 > num_pages:
            parser.error("--pages must be at most half the pool's %d pages"
                         % num_pages)
        for _ in range(args.iterations):
            elapsed, made, a_stats = one_starved_alloc(holder, starving,
                                                       args.pages, num_pages)
            samples.append(elapsed)
            calls.append(made)
            if a_stats["reclaims"]:
                answered += 1
                returned.append(a_stats["pages_returned"])
        page_size = holder.pool.page_size
    us = np.asarray(samples, dtype=np.float64) / 1e3
    row = {
        "pages": args.pages, "page_size": page_size, "pool_pages": num_pages,
        "iterations": args.iterations,
        "p50_us": round(float(np.percentile(us, 50)), 1),
        "p99_us": round(float(np.percentile(us, 99)), 1),
        "max_us": round(float(us.max()), 1),
        "calls_per_wait": round(float(np.mean(calls)), 2),
        "asks_answered": answered,
        "pages_returned_per_answer": (round(float(np.mean(returned)), 1)
                                      if returned else 0.0),
    }
    print("a starving session's %d pages (page size %d, pool %d pages), %d "
          "iterations: p50 %.1f us, p99 %.1f us, max %.1f us, %.2f calls; "
          "the holder answered an ask in %d, returning %.1f pages each" % (
              row["pages"], page_size, num_pages, row["iterations"],
              row["p50_us"], row["p99_us"], row["max_us"],
              row["calls_per_wait"], answered,
              row["pages_returned_per_answer"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(row, out, indent=1)
    return row


if __name__ == "__main__":
    main()
