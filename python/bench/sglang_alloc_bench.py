#!/usr/bin/python3
"""Host time of pagealloc.sglang's alloc(need_size) and free, SGLang's main
path, on three paths: the session's page reserve with its device mirror
(the default: the slots of the reserve's next pages kept on the device,
alloc a slice of them), the reserve without the mirror (mirror_pages=0: a
host-to-device copy of the slots per call), and thin (every call to the
daemon), with and without GPU work queued before each call.

    sglang_alloc_bench.py --target unix:///run/pagealloc/ps1.sock \\
        --target unix:///run/pagealloc/ps16.sock \\
        [--need_size 256] [--decode_requests 256] [--iterations 5000]
        [--seed_kernels DIR] [--paths mirror,reserve,thin] [--passes 1]
        [--json OUT]

Each --target is a daemon run with --semantics=sglang; its page size picks
the allocator (the token allocator at page size 1, the paged one
otherwise). need_size 256 is 256 slots at page size 1 and 16 pages at page
size 16. Each step allocates need_size slots and frees them, so every step
does the same work; nothing waits for the device inside a timing.

"gpu_work": with PyTorch and a CUDA device, a bf16 matmul (--matmul) is
queued on the current stream before each call, an engine's normal state;
the device is synchronised every --sync_every steps, outside the timings,
so the queue stays bounded. The variant is skipped without CUDA.

At page sizes above 1 each path also times SGLang's legacy
alloc_decode(--decode_requests) with last_loc on the device (SGLang's
call; a CUDA tensor where there is one) and seq_lens on the host: every
request continuing its page ("decode", 15 of 16 steps at page size 16),
and every request starting a new page ("decode_new_page", the pages given
back after each call, outside the timing).

With --seed_kernels DIR (the seed's seed_triton_kernels.py) and CUDA, an
"sglang" path comes first: SGLang's own calls in this process, restated
(engine_loop_bench.SGLangFreeList: a slice of a device tensor of free
pages; alloc_decode launches the seed's Triton kernel), timed the same way
in the same run.

At page size 1 the "mirror" path is the token allocator's head (the
default: pages taken from the reserve ahead of need, their slots on the
device, alloc a slice of them; docs/python.md).

Prints one Markdown table: per page size, path and GPU work on/off, the
p50 and p99 host microseconds of alloc and of free, the p50 of the two
alloc_decode calls, for the reserve the round trips per step (refills on
the caller's thread) and the pages it moved to or from the daemon per step
(its thread's refills and returns: zero in a steady loop whose frees
match its allocations), and for the mirror (or head) the share of
allocations it answered with a slice.

--passes K runs every path K times in turn (SGLang's first in each pass):
the host's timings drift within a run, so the table gives each figure's
median over the passes, and a second table, with --seed_kernels, each
path's ratio to SGLang's call of the same pass: the median and range of
the per-pass ratios of the p50s.
"""

import argparse
import json
import os
import sys
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


def queue_work(step, gpu_work, sync_every):
    """Queues `gpu_work` (None: nothing) before step `step`'s call, the
    device synchronised first every `sync_every` steps (outside the
    timings), so that the queue stays bounded."""
    if gpu_work is None:
        return
    if step % sync_every == 0:
        torch.cuda.synchronize()
    gpu_work()


def bench(allocator, need_size, iterations, warmup, gpu_work, sync_every):
    """(alloc samples, free samples) in ns over `iterations` steps."""
    alloc_ns, free_ns = [], []
    clock = time.perf_counter_ns
    for i in range(warmup + iterations):
        queue_work(i, gpu_work, sync_every)
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


def bench_decode(allocator, bs, iterations, warmup, gpu_work, sync_every,
                 new_pages):
    """alloc_decode samples in ns: bs requests of one page each, each call
    one token for every request, last_loc on the allocator's device (a
    CUDA tensor where it is one, as SGLang passes it) and seq_lens on the
    host. new_pages=False: the token continues the request's page (the
    common step); True: it starts a new page for every request, given back
    after the call (free_page_ids, outside the timing)."""
    ps = allocator.page_size
    pages = allocator.alloc(bs * ps)
    if pages is None:
        raise SystemExit("the pool cannot hold %d pages" % bs)
    first = pages.reshape(bs, ps)[:, 0]
    if new_pages:
        before = ps   # the request's page is full: the token starts one
    else:
        before = ps // 2
    if torch is not None and isinstance(first, torch.Tensor):
        seq = torch.full((bs,), before + 1, dtype=torch.int64)
        last_loc = (first + before - 1).contiguous()
    else:
        seq = np.full(bs, before + 1, dtype=np.int64)
        last_loc = np.ascontiguousarray(first + before - 1)
    samples = []
    clock = time.perf_counter_ns
    for i in range(warmup + iterations):
        queue_work(i, gpu_work, sync_every)
        start = clock()
        out = allocator.alloc_decode(seq, seq, last_loc)
        elapsed = clock() - start
        if out is None:
            raise SystemExit("alloc_decode(%d) refused at step %d" % (bs, i))
        if new_pages:
            allocator.free_page_ids(np.asarray(
                out.cpu() if hasattr(out, "cpu") else out) // ps)
        if i >= warmup:
            samples.append(elapsed)
    allocator.free(pages)
    return samples


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


class _SGLangCalls:
    """SGLang's own calls in this process, for the "sglang" rows:
    engine_loop_bench.SGLangFreeList over a pool of the target's size on
    the device, its alloc_decode the seed's Triton kernel (--seed_kernels)."""

    def __init__(self, pool, kernel):
        from engine_loop_bench import SGLangFreeList
        self.page_size = pool.page_size
        self._list = SGLangFreeList(1, pool.num_pages, pool.page_size, "cuda")
        self._kernel = kernel
        self.alloc = self._list.alloc
        self.free = self._list.free
        self._seq_source = self._seq = None

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        # SGLang has seq_lens on the device already: copied once, untimed
        # after the first call.
        if self._seq_source is not seq_lens:
            self._seq_source, self._seq = seq_lens, seq_lens.to("cuda")
        return self._list.alloc_decode(self._seq, seq_lens_cpu, last_loc,
                                       self._kernel)

    def free_page_ids(self, pages):
        self.free(torch.as_tensor(pages, device="cuda") * self.page_size)


def run(target, args, work):
    rows = []
    paths = tuple(p for p in PATHS if p[0] in args.paths.split(","))
    if args.seed_kernels and work is not None:
        sys.path.insert(0, args.seed_kernels)
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from seed_triton_kernels import alloc_decode_kernel
        paths = (("sglang", None, alloc_decode_kernel),) + paths
    for path, use_reserve, mirror_pages in paths:
        for queued in ((False, True) if work is not None else (False,)):
            client = pagealloc.Client.connect(target, name="sglang-bench")
            if path == "sglang":
                allocator = _SGLangCalls(client.pool, mirror_pages)
            else:
                allocator = sglang.make_allocator(
                    client, use_reserve=use_reserve,
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
            if client.pool.page_size > 1:
                for new_pages, name in ((False, "decode"),
                                        (True, "decode_new_page")):
                    row[name + "_p50_us"], row[name + "_p99_us"] = (
                        percentiles(bench_decode(
                            allocator, args.decode_requests,
                            args.iterations, args.warmup,
                            work if queued else None, args.sync_every,
                            new_pages)))
            if use_reserve:
                stats = allocator.reserve.stats()
                steps = args.warmup + args.iterations
                row["round_trips_per_step"] = round(
                    stats["sync_refills"] / steps, 5)
                # The reserve's traffic with the daemon, its thread's
                # included: what a scheduler's steady loop costs the daemon.
                row["daemon_pages_per_step"] = round(
                    (stats["pages_refilled"] + stats["pages_returned"]) /
                    steps, 2)
            mirror = getattr(allocator, "mirror_stats", None)
            if mirror is not None and mirror["hits"] + mirror["misses"]:
                row["mirror_hit_rate"] = round(
                    mirror["hits"] / (mirror["hits"] + mirror["misses"]), 4)
            rows.append(row)
            if path != "sglang":
                allocator.close()
            client.close()
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--target", action="append", required=True)
    parser.add_argument("--need_size", type=int, default=256)
    parser.add_argument("--decode_requests", type=int, default=256)
    parser.add_argument("--iterations", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--matmul", type=int, default=4096)
    parser.add_argument("--sync_every", type=int, default=16)
    parser.add_argument("--seed_kernels", default="",
                        help="a directory with the seed's "
                        "seed_triton_kernels.py: adds SGLang's own calls")
    parser.add_argument("--paths", default="mirror,reserve,thin",
                        help="pagealloc's paths to time, of " +
                        ",".join(p[0] for p in PATHS))
    parser.add_argument("--passes", type=int, default=1,
                        help="runs of every path, in turn")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    if args.passes < 1:
        raise SystemExit("--passes (%d) must be >= 1" % args.passes)

    work = matmul_work(args.matmul)
    passes = []
    for index in range(args.passes):
        rows = []
        for target in args.target:
            rows += run(target, args, work)
        for row in rows:
            row["pass"] = index
        passes.append(rows)
    rows = median_rows(passes) if args.passes > 1 else passes[0]
    header = ("page_size", "path", "gpu_work", "alloc_p50_us",
              "alloc_p99_us", "free_p50_us", "free_p99_us",
              "decode_p50_us", "decode_new_page_p50_us",
              "round_trips_per_step", "daemon_pages_per_step",
              "mirror_hit_rate")
    print("| " + " | ".join(header) + " |")
    print("|" + " --- |" * len(header))
    for row in rows:
        print("| " + " | ".join(str(row.get(name, "-")) for name in header) +
              " |")
    ratios = sglang_ratios(passes)
    if ratios:
        print()
        print("| page_size | path | gpu_work | call | ratio to SGLang's, "
              "median | range | passes |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for r in ratios:
            print("| %d | %s | %s | %s | %.2f | %.2f to %.2f | %d |" % (
                r["page_size"], r["path"], r["gpu_work"], r["call"],
                r["median"], r["min"], r["max"], r["passes"]))
    if work is None:
        print("gpu_work: skipped (no CUDA device with PyTorch)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "passes": passes, "ratios": ratios}, f)
    return rows


def _row_key(row):
    return row["page_size"], row["path"], row["gpu_work"]


_FIGURES = ("alloc_p50_us", "alloc_p99_us", "free_p50_us", "free_p99_us",
            "decode_p50_us", "decode_p99_us", "decode_new_page_p50_us",
            "decode_new_page_p99_us")


def median_rows(passes):
    """One row per (page size, path, GPU work): each figure's median over
    the passes, the rest from the first pass."""
    merged = []
    for first in passes[0]:
        same = [r for rows in passes for r in rows
                if _row_key(r) == _row_key(first)]
        row = dict(first)
        row.pop("pass", None)
        for name in _FIGURES:
            values = [r[name] for r in same if name in r]
            if values:
                row[name] = round(float(np.median(values)), 2)
        merged.append(row)
    return merged


def sglang_ratios(passes):
    """Per page size, GPU work, pagealloc path and call (alloc, free,
    decode, decode_new_page): the ratios of its p50 to SGLang's in the
    same pass, their median and range. Empty without "sglang" rows."""
    ratios = []
    for first in passes[0]:
        if first["path"] == "sglang":
            continue
        for call in ("alloc", "free", "decode", "decode_new_page"):
            name = call + "_p50_us"
            values = []
            for rows in passes:
                ours = [r for r in rows if _row_key(r) == _row_key(first)]
                peer = [r for r in rows
                        if _row_key(r) == (first["page_size"], "sglang",
                                           first["gpu_work"])]
                if ours and peer and name in ours[0] and name in peer[0]:
                    values.append(ours[0][name] / peer[0][name])
            if values:
                ratios.append({
                    "page_size": first["page_size"], "path": first["path"],
                    "gpu_work": first["gpu_work"], "call": call,
                    "median": float(np.median(values)),
                    "min": min(values), "max": max(values),
                    "passes": len(values)})
    return ratios


if __name__ == "__main__":
    main()
