#!/usr/bin/python3
"""Host time of pagealloc.sglang's alloc_decode without a device sync, the
figure to set beside SGLang's own in-process call (the seed's
sglang_unsynced_call.py measures that one: torch.empty, the Triton launch,
the page count and the free-list slice).

    sglang_alloc_decode_bench.py --target unix:///run/pagealloc/gpu0.sock \
        [--requests 256] [--iterations 5000] [--json OUT] [--breakdown]

The daemon must run --semantics=sglang; its page size picks the allocator
(the token allocator's alloc(n) at page size 1, alloc_decode otherwise).
Each request holds one page; each step decodes one token into every
request's page (none changes hands, so every call does the same work) with
seq_lens and last_loc on the host, as the adapter reads them. The result
stays on the GPU, ordered after the daemon's kernel on the current stream;
nothing waits for the device. Prints p50/p99 in microseconds.

--breakdown then runs as many calls again, each through the allocator's
stages one at a time, and adds the p50 of each stage to the row (under
"breakdown_p50_us"; also printed on a line of its own):

  inputs       seq_lens/last_loc (or alloc's size) as host addresses
  daemon_call  the library's call to the daemon and the Allocation object
  order_after  the current stream read and ordered after the daemon's
               kernel (CUDA backend with PyTorch; nothing elsewhere)
  result       the result tensor (a view of the ring) and the CUDA event
  release      the lazy release of the allocations no longer read
"""

import argparse
import json
import time

import numpy as np

import pagealloc
from pagealloc import sglang


STAGES = ("inputs", "daemon_call", "order_after", "result", "release")


def breakdown(allocator, inputs, page_size, warmup, iterations):
    """p50 microseconds of each stage of one call, the calls made through
    the stages the allocator composes (pagealloc/sglang.py, _Base._result):
    the same work as the public call, with a clock read between stages."""
    clock = time.perf_counter_ns
    samples = {stage: [] for stage in STAGES + ("total",)}
    for i in range(warmup + iterations):
        t0 = clock()
        call = inputs()
        t1 = clock()
        allocation = allocator._call(*call)
        t2 = clock()
        if allocation.num_refused or allocation._num_slots <= 0:
            if allocator._other_result(allocation) is None:
                raise SystemExit("refused at breakdown step %d" % i)
            continue
        stream = allocator._order(allocation)
        t3 = clock()
        out = allocator._out(allocation, stream)
        t4 = clock()
        allocator._release_done()
        t5 = clock()
        if page_size == 1:
            allocator.free(out)  # outside the timing, as in the main loop
        if i >= warmup:
            for stage, ns in zip(STAGES + ("total",),
                                 (t1 - t0, t2 - t1, t3 - t2, t4 - t3,
                                  t5 - t4, t5 - t0)):
                samples[stage].append(ns)
    return dict(
        (stage, round(float(np.percentile(np.asarray(ns) / 1e3, 50)), 2))
        for stage, ns in samples.items())


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--json")
    parser.add_argument("--breakdown", action="store_true",
                        help="also time each stage of a call (see above)")
    args = parser.parse_args()

    client = pagealloc.Client.connect(args.target, name="sglang-bench")
    page_size = client.pool.page_size
    allocator = sglang.make_allocator(client, use_reserve=False)
    bs = args.requests
    if page_size == 1:
        def call():
            return allocator.alloc(bs)

        def inputs():
            return allocator._alloc_call(bs)
    else:
        first = allocator.alloc_extend(
            np.zeros(bs, np.int64), np.zeros(bs, np.int64),
            np.ones(bs, np.int64), np.ones(bs, np.int64),
            np.full(bs, -1, np.int64), bs)
        if first is None:
            raise SystemExit("the pool cannot hold %d pages" % bs)
        # A copy: `first` is a view of the ring, which later calls reuse.
        last_loc = np.array(first.cpu() if hasattr(first, "cpu") else first,
                            dtype=np.int64)
        seq = np.full(bs, 2, np.int64)

        def call():
            return allocator.alloc_decode(seq, seq, last_loc)

        def inputs():
            return allocator._decode_call(seq, seq, last_loc)

    samples = []
    for i in range(args.warmup + args.iterations):
        start = time.perf_counter_ns()
        out = call()
        elapsed = time.perf_counter_ns() - start
        if out is None:
            raise SystemExit("refused at step %d" % i)
        if page_size == 1:
            allocator.free(out)  # back to the list's end, outside the timing
        if i >= args.warmup:
            samples.append(elapsed)
    us = np.asarray(samples) / 1e3
    row = {"page_size": page_size, "bs": bs,
           "host_call_p50_us": float(np.percentile(us, 50)),
           "host_call_p99_us": float(np.percentile(us, 99)),
           "fast_channel": client.uses_fast_channel
           if hasattr(client, "uses_fast_channel") else None,
           "backend": client.pool.backend}
    if args.breakdown:
        row["breakdown_p50_us"] = breakdown(allocator, inputs, page_size,
                                            args.warmup, args.iterations)
    print(row)
    if args.breakdown:
        print("breakdown: " + ", ".join(
            "%s %.1f us" % item for item in row["breakdown_p50_us"].items()))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f)
    allocator.close()


if __name__ == "__main__":
    main()
