#!/usr/bin/python3
"""Host time of alloc_decode and alloc_extend per call, in process against
the thin path, without and with GPU work queued before each call:

  thin        Client.alloc_decode / alloc_extend: the lengths to the daemon,
              which plans and launches in its own context; on CUDA the
              device last_loc is first copied to the host (last_loc.cpu(),
              as an adapter must), which waits for the work queued before
  in-process  PageReserve.alloc_decode / alloc_extend
              (client/local_expansion.h): planned here from host lengths,
              new pages from the reserve, the slots expanded on the
              current stream from the device last_loc; no host sync

    local_expansion_bench.py --target unix:///run/pagealloc/gpu0.sock \\
        [--decode_requests 256] [--extend_requests 8] [--extend_tokens 512]
        [--iterations 2000] [--gpu_work 4096] [--json OUT]

Every decode request starts a new page (its prefix fills whole pages), so
each call takes decode_requests pages and each extend call extend_requests
* extend_tokens / page_size; after each timed call, outside the timing, the
pages go back (the reserve's put, the daemon's free) and on CUDA the device
is synchronized, so every call starts from the same state. "queued" rows
launch a bf16 matmul of --gpu_work squared on the current stream just
before each call (CUDA with PyTorch only; the CPU backend prints its rows
without). Prints one table: p50 and p99 in microseconds. A benchmark, not
a test: it never fails on time.
"""

import argparse
import json
import time

import numpy as np

import pagealloc


def percentiles(samples_ns):
    samples = np.asarray(samples_ns, dtype=np.float64) / 1000.0
    return float(np.percentile(samples, 50)), float(np.percentile(samples, 99))


class Setup:
    """The batches, on the host and (with CUDA) on the device."""

    def __init__(self, client, reserve, args):
        self.page_size = ps = client.pool.page_size
        self.cuda = client.pool.backend == "cuda"
        self.torch = None
        if self.cuda:
            import torch  # noqa: PLC0415 (CUDA runs need it)
            self.torch = torch
        # One prefix page per request, from the reserve: the prefixes end
        # at its last slot, so every request's next token starts a page.
        n = max(args.decode_requests, args.extend_requests)
        self.prefix_pages = reserve.take(n)
        self.decode_seq = np.full(args.decode_requests, ps + 1, np.int64)
        self.decode_last = self.prefix_pages[:args.decode_requests] * ps + (
            ps - 1)
        k = args.extend_requests
        self.extend_prefix = np.full(k, ps, np.int64)
        self.extend_seq = self.extend_prefix + args.extend_tokens
        self.extend_last = self.prefix_pages[:k] * ps + (ps - 1)
        if self.cuda:
            device = torch.device("cuda", client.pool.gpu)
            torch.cuda.set_device(device)
            self.decode_last_dev = torch.as_tensor(self.decode_last,
                                                   device=device)
            self.extend_last_dev = torch.as_tensor(self.extend_last,
                                                   device=device)
            self.work = torch.randn(args.gpu_work, args.gpu_work,
                                    dtype=torch.bfloat16, device=device)

    def queue_work(self):
        self.torch.matmul(self.work, self.work)

    def settle(self):
        if self.cuda:
            self.torch.cuda.synchronize()


def host_array(slots):
    if hasattr(slots, "cpu"):
        return slots.cpu().numpy()
    if isinstance(slots, np.ndarray):
        return slots
    return slots.copy_to_host()


def bench(setup, call, give_back, iterations, queued):
    samples = []
    for _ in range(iterations):
        if queued:
            setup.queue_work()
        start = time.perf_counter_ns()
        result = call()
        samples.append(time.perf_counter_ns() - start)
        setup.settle()
        give_back(result)
    return samples


def run(client, reserve, args):
    setup = Setup(client, reserve, args)
    ps = setup.page_size
    rows = []

    def thin_call(extend):
        def call():
            if extend:
                last = (setup.extend_last_dev.cpu() if setup.cuda else
                        setup.extend_last)
                return client.alloc_extend(setup.extend_prefix,
                                           setup.extend_seq, last).check()
            last = (setup.decode_last_dev.cpu() if setup.cuda else
                    setup.decode_last)
            return client.alloc_decode(setup.decode_seq, last).check()
        return call

    def thin_give_back(allocation):
        pages = np.unique(host_array(allocation.slots) // ps)
        client.free_pages(pages)
        client.release(allocation)

    def local_call(extend):
        def call():
            if extend:
                last = setup.extend_last_dev if setup.cuda else \
                    setup.extend_last
                return reserve.alloc_extend(setup.extend_prefix,
                                            setup.extend_seq, last)
            last = setup.decode_last_dev if setup.cuda else setup.decode_last
            return reserve.alloc_decode(setup.decode_seq, last)
        return call

    def local_give_back(slots):
        reserve.put(np.unique(host_array(slots) // ps))

    calls = (("decode(%d)" % args.decode_requests, False),
             ("extend(%dx%d)" % (args.extend_requests, args.extend_tokens),
              True))
    for queued in ((False, True) if setup.cuda else (False,)):
        for name, extend in calls:
            for method, call, give_back in (
                    ("thin", thin_call(extend), thin_give_back),
                    ("in-process", local_call(extend), local_give_back)):
                bench(setup, call, give_back, min(50, args.iterations),
                      queued)  # warm: staging, the reserve's size
                p50, p99 = percentiles(bench(setup, call, give_back,
                                             args.iterations, queued))
                rows.append({
                    "method": method, "call": name,
                    "gpu_work": "queued" if queued else "none",
                    "page_size": ps, "backend": client.pool.backend,
                    "iterations": args.iterations,
                    "p50_us": round(p50, 2), "p99_us": round(p99, 2)})
    stats = reserve.stats()
    for row in rows:
        row["reserve_sync_refills"] = stats["sync_refills"]
    reserve.take_device_error()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--decode_requests", type=int, default=256)
    parser.add_argument("--extend_requests", type=int, default=8)
    parser.add_argument("--extend_tokens", type=int, default=512)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--gpu_work", type=int, default=4096,
                        help="side of the bf16 matmul queued before a call")
    parser.add_argument("--json", help="write the rows here as JSON")
    args = parser.parse_args(argv)
    if min(args.decode_requests, args.extend_requests, args.extend_tokens,
           args.iterations, args.gpu_work) < 1:
        parser.error("every count must be >= 1")

    with pagealloc.Client.connect(args.target, name="local-expansion-bench",
                                  map_kv_slab=False) as client:
        ps = client.pool.page_size
        step_pages = max(args.decode_requests,
                         args.extend_requests * -(-args.extend_tokens // ps))
        with client.reserve(initial_batch=step_pages,
                            max_pages=4 * step_pages + 2 *
                            max(args.decode_requests,
                                args.extend_requests)) as reserve:
            rows = run(client, reserve, args)
    print("%-11s %-16s %-9s %10s %10s" % ("method", "call", "gpu work",
                                           "p50 us", "p99 us"))
    for row in rows:
        print("%-11s %-16s %-9s %10.2f %10.2f" % (
            row["method"], row["call"], row["gpu_work"], row["p50_us"],
            row["p99_us"]))
    print("page size %d, %s backend, %d calls a row; round trips of the "
          "reserve's takes: %d" % (rows[0]["page_size"], rows[0]["backend"],
                                   args.iterations,
                                   rows[0]["reserve_sync_refills"]))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)
    return rows


if __name__ == "__main__":
    main()
