#!/usr/bin/python3
"""Host time of pagealloc.sglang's alloc_decode without a device sync, the
figure to set beside SGLang's own in-process call (the seed's
sglang_unsynced_call.py measures that one: torch.empty, the Triton launch,
the page count and the free-list slice).

    sglang_alloc_decode_bench.py --target unix:///run/pagealloc/gpu0.sock \
        [--requests 256] [--iterations 5000] [--json OUT]

The daemon must run --semantics=sglang; its page size picks the allocator
(the token allocator's alloc(n) at page size 1, alloc_decode otherwise).
Each request holds one page; each step decodes one token into every
request's page (none changes hands, so every call does the same work) with
seq_lens and last_loc on the host, as the adapter reads them. The result
stays on the GPU, ordered after the daemon's kernel on the current stream;
nothing waits for the device. Prints p50/p99 in microseconds.
"""

import argparse
import json
import time

import numpy as np

import pagealloc
from pagealloc import sglang


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True)
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--json")
    args = parser.parse_args()

    client = pagealloc.Client.connect(args.target, name="sglang-bench")
    page_size = client.pool.page_size
    allocator = sglang.make_allocator(client)
    bs = args.requests
    if page_size == 1:
        def call():
            return allocator.alloc(bs)
    else:
        first = allocator.alloc_extend(
            np.zeros(bs, np.int64), np.zeros(bs, np.int64),
            np.ones(bs, np.int64), np.ones(bs, np.int64),
            np.full(bs, -1, np.int64), bs)
        if first is None:
            raise SystemExit("the pool cannot hold %d pages" % bs)
        last_loc = np.asarray(first.cpu() if hasattr(first, "cpu") else first,
                              dtype=np.int64)
        seq = np.full(bs, 2, np.int64)

        def call():
            return allocator.alloc_decode(seq, seq, last_loc)

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
    print(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f)
    allocator.close()


if __name__ == "__main__":
    main()
