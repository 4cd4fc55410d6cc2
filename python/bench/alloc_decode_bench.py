#!/usr/bin/python3
"""AllocDecode latency from Python: the package's cost on top of the C ABI.

    alloc_decode_bench.py --target unix:///run/pagealloc/gpu0.sock \
        [--requests 256] [--iterations 20000] [--async_completion]

One session holds one page per request; each iteration decodes one token
into every request's page (no page changes hands, so every call does the
same work), reads the slots view and releases the allocation, as a
scheduler step would. Prints p50/p90/p99 in microseconds of
Client.alloc_decode alone and of the whole step, for comparison with
pagealloc-bench's AllocDecode(256) (bench/README.md) on the same daemon.
"""

import argparse
import time

import numpy as np

import pagealloc


def percentiles(samples_ns):
    values = np.percentile(np.asarray(samples_ns) / 1e3, [50, 90, 99])
    return "p50 %.1f us  p90 %.1f us  p99 %.1f us" % tuple(values)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=1000)
    parser.add_argument("--async_completion", action="store_true")
    parser.add_argument("--no_fast_channel", action="store_true")
    args = parser.parse_args()

    with pagealloc.Client.connect(
            args.target, name="alloc_decode_bench",
            fast_channel=not args.no_fast_channel) as client:
        page_size = client.pool.page_size
        if page_size < 2:
            raise SystemExit("needs a page size of 2 or more")
        held = client.alloc([page_size] * args.requests).check()
        first = client.copy_to_host(held.slots)[::page_size]
        client.release(held)
        # Request i has one token in its page; decoding the second token
        # writes the page's next slot and takes no page.
        seq_lens = np.full(args.requests, 2, dtype=np.int64)
        last_locs = np.ascontiguousarray(first, dtype=np.int64)
        call_ns, step_ns = [], []
        for i in range(args.warmup + args.iterations):
            start = time.perf_counter_ns()
            a = client.alloc_decode(seq_lens, last_locs,
                                    async_completion=args.async_completion)
            called = time.perf_counter_ns()
            if not a.ok:
                a.check()
            slots = a.slots
            client.release(a)
            done = time.perf_counter_ns()
            del slots, a
            if i >= args.warmup:
                call_ns.append(called - start)
                step_ns.append(done - start)
        print("pagealloc %s, %s backend, fast channel %s, %d requests" %
              (pagealloc.__version__, client.pool.backend,
               client.uses_fast_channel, args.requests))
        print("alloc_decode:", percentiles(call_ns))
        print("whole step:  ", percentiles(step_ns))


if __name__ == "__main__":
    main()
